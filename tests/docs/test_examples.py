"""Every code example of the documentation runs: the ```python blocks of each page of docs/ (in order, one
namespace per page, in a scratch directory, on one CPU thread), and every `qkv ...` line of its ```sh blocks parses
with the options classes' checks; blocks marked `<!-- run -->` are run. The conventions are written once, in
docs/_tools/mdexec.py (and for authors in docs/writing-docs.md)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_tools"))
import mdexec  # noqa: E402

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_tools" not in p.parts)
#: packages of an extra that a page may need; without them its examples skip
OPTIONAL = ("transformers", "soundfile", "librosa", "rouge_score", "jiwer", "matplotlib")


def _rel(p: Path) -> str:
    return p.relative_to(DOCS).as_posix()


def _shell_blocks():
    out = []
    for page in PAGES:
        for block in mdexec.blocks(page.read_text(encoding="utf-8")):
            if block.lang in ("sh", "bash", "console"):
                out.append(pytest.param(page, block, id=f"{_rel(page)}:{block.line}"))
    return out


def test_every_page_is_found_and_has_examples():
    names = {_rel(p) for p in PAGES}
    for page in ("index.md", "concepts/stages.md", "concepts/self-attention.md", "concepts/encoder-decoder.md",
                 "concepts/vision.md", "concepts/transformer.md", "concepts/training.md", "inside/notebooks.md",
                 *(f"apps/{a}.md" for a in (
                     "translate", "sentiment", "images", "caption", "qa", "segment", "summarize", "speech", "lm"))):
        assert page in names
    runnable = [p for p in PAGES if any(b.runs for b in mdexec.blocks(p.read_text(encoding="utf-8")))]
    assert len(runnable) >= 12


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "python" for b in mdexec.blocks(
    p.read_text(encoding="utf-8")))], ids=_rel)
@pytest.mark.slow
def test_page_examples_run(page, tmp_path):
    try:
        mdexec.run_page(page, tmp_path)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{e.name} is not installed (an optional extra)")
        raise


def _parse(command: str):
    from qkv.cli import GlobalOptions, build_parser
    from qkv.cli.options import options_from_args
    from tests.cli.test_readme import _subparser

    parser = build_parser()
    argv = shlex.split(command)
    args = parser.parse_args(argv)  # an unknown flag or a bad value exits here
    options_from_args(args, GlobalOptions)
    for cls in getattr(_subparser(parser, argv), "_qkv_options", []):
        options_from_args(args, cls)


@pytest.mark.parametrize(("page", "block"), _shell_blocks())
def test_page_commands_parse(page, block, tmp_path, monkeypatch):
    commands = mdexec.commands(block)
    for command in commands:
        _parse(command)
    if block.directive == "run":
        from qkv.cli import main

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MPLBACKEND", "Agg")
        for command in commands:
            assert main(shlex.split(command)) == 0, command


def test_directives_need_a_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        mdexec.blocks("<!-- not run -->\n```python\nprint(1)\n```\n")
    (block,) = mdexec.blocks("text\n<!-- not run: trains for an hour -->\n```python\n1 / 0\n```\n")
    assert not block.runs and block.reason == "trains for an hour" and block.line == 3


def test_a_failing_example_names_its_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```python\nraise RuntimeError(x)\n```\n", encoding="utf-8")
    with pytest.raises(RuntimeError) as info:
        mdexec.run_page(page, tmp_path)
    frame = info.traceback[-1]
    assert frame.path == page and frame.lineno + 1 == 8  # the line of the statement in the page
