"""qkv's tests, laid out as the package is: ``core``, ``layers``, ``models``, ``data``, ``train``, ``viz``,
``integrations``, ``cli`` and ``tasks/<application>``. Shared helpers live beside this file: ``helpers`` (tiny
runs, generated corpora), ``reference`` (float64 formulas) and ``trainer_toy`` (a toy task and its script)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  #: the repository
FIXTURES = ROOT / "tests" / "fixtures"  #: files the tests read (runs of older releases, question sets)
SHARED_DATA = ROOT.parent / "shared" / "data"  #: the corpora beside the project (read, never committed)
