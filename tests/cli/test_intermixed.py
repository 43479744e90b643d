"""Options may stand between a command's positionals: ``qkv predict RUN --json x.json "text"`` is
``qkv predict RUN "text" --json x.json``, for every command whose positionals are a run and its inputs."""

from __future__ import annotations

import argparse
import json

import pytest

from qkv.cli import _intermixed, build_parser, main


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """``(words, parser)`` of every command that has no subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*words, name))


def _commands_with_inputs():
    """The commands whose last positional takes several values after another positional, with a flag of one
    value they take."""
    out = []
    for words, leaf in _leaves(build_parser()):
        positionals = [a for a in leaf._actions if not a.option_strings]
        device = [a for a in leaf._actions if "--device" in a.option_strings]
        if len(positionals) >= 2 and positionals[-1].nargs in ("*", "+") and device:
            out.append(words)
    return out


COMMANDS = _commands_with_inputs()


def test_commands_with_a_run_and_inputs_are_found():
    assert {("predict",), ("translate",), ("view",), ("transcribe",)} <= set(COMMANDS)


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(w) for w in COMMANDS])
def test_an_option_between_the_run_and_its_inputs_is_read(words):
    leaf = dict(_leaves(build_parser()))[words]
    positionals = [a for a in leaf._actions if not a.option_strings]
    firsts = [f"first{i}" for i in range(len(positionals) - 1)]
    argv = [*words, *firsts, "--device", "cpu", "input-a", "input-b"]
    args, extra = _intermixed(build_parser(argv)).parse_known_args(argv)
    assert extra == [] and args.device == "cpu"
    assert getattr(args, positionals[-1].dest) == ["input-a", "input-b"]
    assert [getattr(args, p.dest) for p in positionals[:-1]] == firsts


@pytest.mark.slow
def test_qkv_predict_with_json_before_the_text(tiny_run, tmp_path, capsys):
    run = tiny_run("translate")
    out = tmp_path / "x.json"
    assert main(["predict", str(run), "--json", str(out), "7 mars 2019", "--device", "cpu"]) == 0
    assert [r["input"] for r in json.loads(out.read_text(encoding="utf-8"))] == ["7 mars 2019"]
    assert main(["translate", str(run), "--beam", "1", "7 mars 2019", "8 mars 2019", "--device", "cpu"]) == 0
    assert len([line for line in capsys.readouterr().out.splitlines() if line.strip()]) >= 2
