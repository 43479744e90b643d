"""Defaults sized to the time budget (``Application.budget_defaults``): translation's Transformer on a corpus."""

import pytest

from qkv.apps import application
from qkv.apps.translate import TranslateOptions, budget_defaults
from qkv.cli import build_parser
from qkv.cli.train import read_train_options
from qkv.train import TrainConfig


def read(argv):
    args = build_parser().parse_args(["train", "translate", *argv])
    app = application("translate")
    return read_train_options(args, app.options, app.train_defaults, app.budget_defaults)


CORPUS = ["--data", "corpus.tsv", "--model", "transformer"]


@pytest.mark.parametrize("minutes", [1, 5, 30, 240])
def test_any_budget_keeps_the_small_transformer(minutes, capsys):
    options, config = read([*CORPUS, "--max-minutes", str(minutes)])
    small = TranslateOptions()
    assert (options.dim, options.num_layers) == (small.dim, small.num_layers)
    assert config.max_minutes == minutes
    assert capsys.readouterr().out == ""  # nothing changed, nothing said


def test_no_budget_gives_the_larger_transformer_and_says_so(capsys):
    options, _ = read([*CORPUS, "--epochs", "3"])
    want = budget_defaults(TranslateOptions(data="corpus.tsv", model="transformer"), TrainConfig())
    assert want and all(getattr(options, k) == v for k, v in want.items())
    assert options.dim > TranslateOptions().dim
    out = capsys.readouterr().out
    assert "defaults for no budget" in out and "dim=256" in out and "flags given win" in out


def test_flags_given_win_over_the_budgets_defaults():
    options, _ = read([*CORPUS, "--dim", "192", "--num-heads", "4"])
    assert options.dim == 192 and options.num_layers == 2  # the flag kept, the rest from the budget
    options, _ = read([*CORPUS, "--num-layers", "3"])
    assert options.dim == 256 and options.num_layers == 3


@pytest.mark.parametrize("argv", [["--data", "dates", "--model", "transformer"],
                                  ["--data", "corpus.tsv", "--model", "bahdanau"]])
def test_dates_and_rnns_have_one_size(argv):
    options, _ = read(argv)
    assert (options.dim, options.num_layers) == (TranslateOptions().dim, TranslateOptions().num_layers)


def test_a_budget_of_steps_is_a_budget_too(capsys):
    options, _ = read([*CORPUS, "--max-steps", "3000", "--schedule-steps", "3000"])
    assert (options.dim, options.num_layers) == (TranslateOptions().dim, TranslateOptions().num_layers)
    assert capsys.readouterr().out == ""


def test_the_budgets_defaults_are_valid_options():
    for config in (TrainConfig(), TrainConfig(max_minutes=1), TrainConfig(max_steps=30)):
        fields = budget_defaults(TranslateOptions(data="c.tsv", model="transformer"), config)
        TranslateOptions(data="c.tsv", model="transformer", **fields)  # raises if a field does not apply


def test_a_resumed_run_keeps_the_size_it_was_started_with(tmp_path):
    import json

    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    started = {"dim": 128, "num_layers": 1}  # a run started with a budget, resumed without one
    (run / "checkpoint" / "config.json").write_text(json.dumps({"config": {"options": started}}))
    options, _ = read([*CORPUS, "--out", str(run), "--resume"])
    assert (options.dim, options.num_layers) == (128, 1)
    started = {"dim": 256, "num_layers": 2}  # started without a budget, resumed with one
    (run / "checkpoint" / "config.json").write_text(json.dumps({"config": {"options": started}}))
    options, _ = read([*CORPUS, "--out", str(run), "--resume", "--max-minutes", "5"])
    assert (options.dim, options.num_layers) == (256, 2)
    options, _ = read([*CORPUS, "--out", str(tmp_path / "new"), "--resume"])  # nothing to resume: the budget's
    assert options.dim == 256
