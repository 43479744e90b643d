"""The project speaks of qkv as it is: no page, benchmark record, docstring or comment tells how it was made (work
sessions, issue numbers, sections "owned by" someone, figures "superseded by" others further down)."""

from __future__ import annotations

import re

from tests import ROOT

HISTORY = re.compile(r"\bsessions? \d|\bissues? \d|\bissue's\b|work period|section owned by|owned by the \w+ work|"
                     r"superseded by|TODO\(migration\)", re.I)


def _files():
    yield from (ROOT / name for name in ("README.md", "BENCHMARKS.md", "CONTRIBUTING.md"))
    yield from (ROOT / "docs").rglob("*.md")
    yield from (ROOT / "docs").rglob("*.py")
    yield from (ROOT / "benchmarks").rglob("*.py")
    yield from (ROOT / "qkv").rglob("*.py")


def test_no_text_tells_how_the_project_was_made():
    found = []
    for path in _files():
        if not path.exists():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_check_sees_what_it_is_for():
    for text in ("(session 12, quiet machine)", "issue 27's goals", "against the issue's targets",
                 "<!-- section owned by the captioning work (issue 14) -->", "superseded by the table at the end"):
        assert HISTORY.search(text), text
    for text in ("a fresh tensor owned by the caller", "an open issue with the exporter", "the lead sentence"):
        assert not HISTORY.search(text), text
