"""The README: every ```python block runs as written, every `qkv ...` command in it parses with options that the
options classes accept (training itself is tested elsewhere), every link into the repository leads to a file, and
it stays a short front page (the documentation is the site built from docs/)."""

import re
import shlex

import pytest

from qkv.cli import GlobalOptions, build_parser
from qkv.cli.options import options_from_args
from tests import ROOT  # noqa: E402

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _commands(text: str) -> list[str]:
    """The ``qkv ...`` command lines of indented code blocks, with their ``\\`` continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        if not line.startswith("    "):
            continue
        line = line.split("#", 1)[0].strip()
        m = re.search(r"(?:^|\s)qkv (.*)$", line)
        if m and (line.startswith("qkv ") or line.startswith("torchrun ")):
            out.append(m.group(1))
    return out


COMMANDS = _commands(README)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2 and len(COMMANDS) >= 8


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^    (make \w+)", quick, flags=re.M) == ["make demo", "make test"]


def test_readme_links_lead_to_files():
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) if "://" not in t]
    assert len(links) >= 10
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, missing


@pytest.mark.parametrize("index", range(len(BLOCKS)))
@pytest.mark.slow
def test_readme_example_runs(index, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {"__name__": "readme"})


def _subparser(parser, argv):
    """The parser of the subcommand ``argv`` names (``train translate`` -> its parser)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for token in argv:
                if token in action.choices:
                    return _subparser(action.choices[token], argv[argv.index(token) + 1:])
    return parser


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command):
    parser = build_parser()
    argv = shlex.split(command)
    args = parser.parse_args(argv)  # an unknown flag or a bad value exits here
    options_from_args(args, GlobalOptions)
    for cls in getattr(_subparser(parser, argv), "_qkv_options", []):
        options_from_args(args, cls)  # ranges, choices, options that do not apply to the model
