# Two commands a fresh machine needs: `make demo` and `make test`. Both create or reuse .venv and
# install what they need into it (the CPU build of PyTorch first, so no CUDA build is pulled in).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
QKV := $(VENV)/bin/qkv
STAMP := $(VENV)/.qkv-installed
DEMO ?= runs/demo
DEMO_MINUTES ?= 4.5
FASHION := /usr/share/datasets/fashion-mnist

.PHONY: demo test install data bench-data lint bench docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST, a CJK font, Chromium and two speech synthesisers (espeak-ng, flite: the generated speech corpora)
# from Debian's packages, when this machine can install them (the tests that need them skip otherwise; plots fall
# back to fonts without CJK glyphs).
DEBS := dataset-fashion-mnist fonts-wqy-zenhei chromium espeak-ng flite
data:
	@{ test -d $(FASHION) && test -f /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc && command -v chromium >/dev/null \
	  && command -v espeak-ng >/dev/null && command -v flite >/dev/null; } || \
	{ command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q $(DEBS) >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(DEBS) >/dev/null 2>&1; }; }; } || \
	  echo "note: could not install $(DEBS); the tests that need them will skip"

# The three stages on the worked example of self-attention; a Bahdanau date translator trained on the CPU (one
# thread: this small model runs as fast on one core, and does not slow down when the other core is busy);
# translations of dates written in several languages with their alignment pictures; the page of every attention
# (qkv view).
demo: $(STAMP) data
	$(QKV) explain --plot $(DEMO)-explain.png
	rm -rf $(DEMO)
	$(QKV) --threads 1 train translate --data dates --model bahdanau --epochs 3 --max-minutes $(DEMO_MINUTES) \
	  --out $(DEMO) --no-progress
	$(QKV) translate $(DEMO) "7 mars 2019" "2019年3月7日" "Donnerstag, 7. März 2019" "7 марта 2019 г." \
	  "jueves, 7 de marzo de 2019" "March 7, 2019" "2019/03/07" --plot $(DEMO)/alignment.png
	$(QKV) view $(DEMO) "jueves, 7 de marzo de 2019" --out $(DEMO)/attention.html
	@echo "open $(DEMO)/attention.html in a browser: every attention of the model, offline"

test: $(STAMP) data
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check qkv tests benchmarks examples

# Debian's classical recogniser, the speech benchmark's baseline (benchmarks only, never the tests)
bench-data: data
	@command -v pocketsphinx >/dev/null || { apt-get install -y -q pocketsphinx pocketsphinx-en-us sox >/dev/null 2>&1 || \
	  echo "note: could not install pocketsphinx; benchmarks/speech.py leaves its column empty"; }

# The documentation site into site/ (offline: open site/index.html, or serve the folder); the concept pages'
# pictures and the command reference are made from the code while it is built.
docs: $(STAMP)
	$(PY) -c "import mkdocs, material, mkdocstrings_handlers.python, jupytext, ziamath" 2>/dev/null || \
	  $(PY) -m pip install --quiet -e ".[docs]"
	$(VENV)/bin/mkdocs build --clean --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/attention.py --record

# BENCHMARKS.md from the results files the benchmark scripts write (benchmarks/results/*.json)
.PHONY: bench-report
bench-report:
	$(PY) benchmarks/render.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site
