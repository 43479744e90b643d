"""Resuming needs the model the run was started with: an option that changes the stored model spec or the weights'
shapes is one line naming the options and their stored and given values (exit 2 on the command line), for every
task and application; the settings of training (the learning rate) may change, with a warning."""

import contextlib
import io
import json
import shutil

import pytest
import torch

from qkv.cli import main
from qkv.train import TrainConfig, train
from qkv.train.checkpoint import load_checkpoint
from qkv.train.fit import model_differences, weight_differences
from tests.helpers import TINY_RUNS, single_thread
from tests.trainer_toy import ToyTask, build_toy_model


def cfg(out, **kw):
    base = dict(epochs=1, batch_size=16, lr=0.01, device="cpu", log_every=2, progress=False, final_splits=("valid",),
                out=str(out))
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("change, named", [
    (dict(hidden=24), "the model's hidden 16 (stored) vs 24 (given)"),
    (dict(dropout=0.25), "the model's dropout 0.0 (stored) vs 0.25 (given)"),  # the same shapes, another model
    (dict(dtype=torch.float64), 'the model\'s dtype "float32" (stored) vs "float64" (given)'),
])
def test_a_task_resumed_with_another_model_is_refused_naming_the_difference(tmp_path, one_thread, change, named):
    train(ToyTask(), cfg(tmp_path, max_steps=2))
    before = load_checkpoint(tmp_path / "checkpoint", prefer=())
    with pytest.raises(ValueError) as info:
        train(ToyTask(**change), cfg(tmp_path, epochs=2, resume=True))
    message = str(info.value)
    assert named in message and message.startswith(f"cannot resume {tmp_path / 'checkpoint'}") and "\n" not in message
    after = load_checkpoint(tmp_path / "checkpoint", prefer=())  # nothing was written
    assert after.state["position"] == before.state["position"]


def test_a_changed_learning_rate_is_a_warning_and_the_run_goes_on(tmp_path, one_thread, caplog):
    train(ToyTask(), cfg(tmp_path, max_steps=2))
    r = train(ToyTask(), cfg(tmp_path, lr=0.002, max_steps=4, resume=True))
    assert r.state.global_step == 4 and "lr: 0.01 -> 0.002" in caplog.text


class Renamed(ToyTask):
    """A task whose model spec names a size by another word than its option (``width`` -> ``hidden``)."""

    def __init__(self, width=16, note="a"):
        super().__init__(hidden=width)
        self.width, self.note = width, note

    def build_model(self):
        return build_toy_model(super().config())

    def config(self):
        return {"model": {"name": "mlp", "config": super().config()},
                "options": {"width": self.width, "note": self.note}}


def test_an_option_named_otherwise_in_the_model_is_listed_with_the_entry_it_changed(tmp_path, one_thread):
    train(Renamed(), cfg(tmp_path, max_steps=2))
    with pytest.raises(ValueError) as info:
        train(Renamed(width=8, note="b"), cfg(tmp_path, resume=True))
    assert "the model's hidden 16 (stored) vs 8 (given); options changed besides: note \"a\" -> \"b\", width 16 " \
           "-> 8" in str(info.value)
    train(Renamed(note="b"), cfg(tmp_path, max_steps=3, resume=True))  # an option that leaves the model alone


def test_model_differences_name_options_by_their_model_entries():
    def run(model, config, **options):
        return {"model": {"name": model, "config": config}, "options": {"model": model.split("-")[0], **options}}

    old = run("rnn-classifier", {"hidden_dim": 64, "dropout": 0.1}, hidden_dim=64, score=None, data="a.tsv")
    assert model_differences(old, old) == []
    assert model_differences(old, run("rnn-classifier", {"hidden_dim": 32, "dropout": 0.1}, hidden_dim=32, score=None,
                                      data="b.tsv")) == ["hidden_dim 64 (stored) vs 32 (given)"]
    assert model_differences(old, run("transformer-classifier", {"dim": 16, "dropout": 0.1}, hidden_dim=64,
                                      score="dot", data="a.tsv")) == ['model "rnn" (stored) vs "transformer" (given)']
    same = {"model": {"name": "x", "config": {"widths": ((4, 4), (8,)), "eps": float("nan")}}}
    assert model_differences(json.loads(json.dumps(same)), same) == []  # as read back from config.json
    nested = {"model": {"name": "x", "config": {"enc": {"layers": [2, 2]}}}}
    assert model_differences(nested, {"model": {"name": "x", "config": {"enc": {"layers": [2, 3]}}}}) == \
        ["the model's enc.layers [2, 2] (stored) vs [2, 3] (given)"]


def test_weight_differences_name_the_weights(one_thread):
    a, b = torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.Linear(3, 5))
    assert weight_differences(a.state_dict(), a) == []
    assert weight_differences({"weight": torch.zeros(4, 2), "bias": torch.zeros(4)}, a) == \
        ["weight weight is (4, 2) in the checkpoint, (4, 3) in the model"]
    assert weight_differences(a.state_dict(), b)[:2] == ["the model has no weight weight",
                                                         "the model has no weight bias"]


# every application, through the command line: the option changed, its stored and given values, exit 2
CHANGES = [
    ("translate", "--num-layers", "2", "1"),
    ("translate", "--score", None, "dot"),  # the default score, stored as the default
    ("sentiment", "--num-heads", "2", "4"),  # the same weight shapes: the spec tells
    ("images", "--attn", "non_local", "se"),
    ("caption", "--dim", "8", "16"),
    ("qa", "--hidden-dim", "8", "16"),
    ("segment", "--dim", "8", "16"),
    ("summarize", "--hidden-dim", "16", "8"),
    ("speech", "--hidden-dim", "8", "16"),
    ("lm", "--num-layers", "2", "1"),
]
NEEDS_VOICES = {"speech"}  # its tiny run is spoken by espeak-ng and flite


def _shown(value):
    return "(default)" if value is None else value if value.isdigit() else f'"{value}"'


@pytest.mark.parametrize("app, flag, stored, given", CHANGES, ids=[f"{c[0]}{c[1]}" for c in CHANGES])
def test_every_application_refuses_a_resume_with_another_model(app, flag, stored, given, tiny_run, tmp_path, capsys):
    if app in NEEDS_VOICES and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    run = tmp_path / app
    shutil.copytree(tiny_run(app), run)
    argv = [a.format(reviews=tiny_run.root / "reviews.tsv", root=tiny_run.root) for a in TINY_RUNS[app]]
    if flag in argv:
        argv[argv.index(flag) + 1] = given
    else:
        argv += [flag, given]
    capsys.readouterr()
    with single_thread(), contextlib.redirect_stdout(io.StringIO()):
        code = main([*argv, "--out", str(run), "--resume"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("qkv: error: cannot resume") and "\n" not in err, err
    assert f"{flag} {_shown(stored)} (stored) vs {_shown(given)} (given)" in err, err
