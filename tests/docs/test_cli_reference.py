"""The command-line reference page is written from the parser: it names every command and every option, and each
option's text is the one `--help` prints."""

from __future__ import annotations

import argparse
import re
import sys

from tests import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_tools"))
import cli_reference  # noqa: E402


def _parsers(parser, name="qkv"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _parsers(p, f"{name} {sub}")


def _words(text: str) -> str:
    return " ".join(text.replace("\\|", "|").split())


def test_the_page_names_every_command_and_option_with_its_help():
    from qkv.cli import build_parser

    page = cli_reference.markdown()
    flat = _words(page)
    parsers = list(_parsers(build_parser()))
    assert len(parsers) >= 20  # qkv, train and its applications, every verb
    for name, parser in parsers:
        assert f"`{name}`" in page, name
        help_text = _words(parser.format_help()).replace("- ", "-")  # --help wraps lines after hyphens
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for flag in action.option_strings:
                assert re.search(rf"`{re.escape(flag)}[ `]", page), f"{name}: {flag}"
            if action.help and action.help != argparse.SUPPRESS:
                text = _words(parser._get_formatter()._expand_help(action))
                assert text.replace("- ", "-") in help_text  # the same words as --help
                assert text in flat, f"{name}: {action.dest}"


def test_a_new_option_appears_on_the_page(monkeypatch):
    import qkv.cli

    real = qkv.cli.build_parser

    def with_one_more():
        parser = real()
        parser.add_argument("--brand-new-flag", help="a flag made by this test (default: %(default)s)", default=3)
        return parser

    monkeypatch.setattr(qkv.cli, "build_parser", with_one_more)
    page = cli_reference.markdown()
    assert "`--brand-new-flag BRAND_NEW_FLAG`" in page
    assert "a flag made by this test (default: 3)" in page
