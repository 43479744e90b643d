"""Messages say the limit that holds and name the option: a prompt one token too long gives the longest that fits;
a seed past what torch's generators take is a one-line error naming the flag (or the field), for every command
that has one."""

from __future__ import annotations

import argparse

import pytest

from qkv.cli import build_parser, main

HUGE = str(10**23)


def _commands_with(flag: str) -> list[tuple[str, ...]]:
    out = []

    def walk(parser, words):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and any(flag in a.option_strings for a in parser._actions):
            out.append(words)
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, (*words, name))

    walk(build_parser(), ())
    return sorted(set(out))


SEEDED = _commands_with("--seed")


def test_every_seed_option_is_found():
    assert {("generate",), ("view",), ("faithfulness",)} <= set(SEEDED) and any(w[0] == "train" for w in SEEDED)


@pytest.mark.parametrize("words", SEEDED, ids=[" ".join(w) for w in SEEDED])
def test_a_seed_too_large_for_torch_is_one_line_naming_the_flag(words, tmp_path, capsys):
    argv = [*words, *(["RUN"] if words[0] != "train" else []), "--seed", HUGE]
    if words[0] == "view":
        argv += ["--strategy", "sample", "--generate", "3"]
    if words[0] == "generate":
        argv += ["--strategy", "sample"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "--seed" in err and "Overflow" not in err and len(err.strip().splitlines()) == 1, err


def test_the_trainer_refuses_a_seed_too_large_naming_the_field():
    from qkv.train import TrainConfig

    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=2**64)
    assert TrainConfig(seed=2**64 - 1).seed == 2**64 - 1


@pytest.mark.slow
def test_a_prompt_too_long_gives_the_longest_that_fits(tiny_run):
    from qkv.apps.lm import LanguageModel

    lm = LanguageModel.load(tiny_run("lm"), "cpu")
    longest = lm.context - 2  # the document's start and one new token take the other two positions
    assert len(lm.tokenizer.encode("a" * longest)) == longest
    (fits,) = lm.predict(["a" * longest], max_new_tokens=5, greedy=True)
    assert len(fits.tokens) <= 1
    with pytest.raises(ValueError, match=rf"is {longest + 1} tokens; the model reads at most {longest} before"):
        lm.predict(["a" * (longest + 1)])


JSONED = _commands_with("--json")


def test_every_json_option_is_found():
    assert {("predict",), ("evaluate",), ("translate",), ("transcribe",), ("generate",)} <= set(JSONED)


@pytest.mark.parametrize("words", JSONED, ids=[" ".join(w) for w in JSONED])
def test_json_into_a_folder_or_under_a_file_is_refused_before_any_work(words, tmp_path, capsys):
    """The run named does not exist: the --json error comes first, before anything is read or computed."""
    afile = tmp_path / "afile"
    afile.write_text("x", encoding="utf-8")
    for bad, said in ((tmp_path, "is a folder"), (f"{tmp_path}/", "is a folder"),
                      (afile / "rows.json", "is a file, not a folder")):
        code = main([*words, str(tmp_path / "no-run"), "--json", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and f"--json {bad}" in err and said in err and len(err.strip().splitlines()) == 1, err
