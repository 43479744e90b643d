"""The documentation site, built once per test session (per worker) as `make docs` builds it, for the tests that
read it (`test_site_browser`, `test_site_reference`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import ROOT


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--clean", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
