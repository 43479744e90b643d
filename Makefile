# Two commands a fresh machine needs: `make demo` and `make test`. Both create or reuse .venv and
# install what they need into it (the CPU build of PyTorch first, so no CUDA build is pulled in).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qkv-installed

.PHONY: demo test install lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/qkv explain

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check qkv tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/attention.py --write BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
