"""The trainer checks its limits before a step: resuming a run that has trained its ``max_steps`` trains no more and
changes no weight, through the library and through ``qkv train ... --resume`` of every application's tiny run."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil

import pytest
import torch

from qkv.train import TrainConfig, load_checkpoint, train
from tests.helpers import TINY_RUNS, single_thread
from tests.trainer_toy import ToyTask


def cfg(out, **kw):
    base = dict(epochs=3, batch_size=16, lr=0.01, device="cpu", warmup_steps=3, log_every=2, progress=False,
                out=str(out))
    return TrainConfig(**{**base, **kw})


def test_resuming_a_run_that_has_trained_max_steps_trains_no_step(tmp_path, caplog):
    first = train(ToyTask(dropout=0.2, noise=True), cfg(tmp_path, max_steps=3))
    assert (first.stopped, first.state.global_step) == ("max_steps", 3)
    before = load_checkpoint(tmp_path / "checkpoint").state_dict
    steps = []
    with caplog.at_level(logging.WARNING):
        again = train(ToyTask(dropout=0.2, noise=True), cfg(tmp_path, max_steps=3, resume=True),
                      callbacks=[lambda state, logs: steps.append(state.global_step)])
    assert (again.stopped, again.state.global_step, steps) == ("max_steps", 3, [])
    assert "has trained 3 steps, max_steps is 3" in caplog.text
    after = load_checkpoint(tmp_path / "checkpoint").state_dict
    assert all(torch.equal(before[k], after[k]) for k in before)
    lower = train(ToyTask(dropout=0.2, noise=True), cfg(tmp_path, max_steps=2, resume=True))
    assert (lower.stopped, lower.state.global_step) == ("max_steps", 3)
    more = train(ToyTask(dropout=0.2, noise=True), cfg(tmp_path, max_steps=5, resume=True))
    assert (more.stopped, more.state.global_step) == ("max_steps", 5)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in TINY_RUNS if "--max-steps" in TINY_RUNS[n]])
def test_qkv_train_resume_of_a_finished_run_trains_past_no_max_steps(name, tiny_run, tmp_path, capsys):
    from qkv.cli import main

    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    run = shutil.copytree(tiny_run(name), tmp_path / name)  # the shared run stays as it was
    argv = [a.format(reviews=tiny_run.root / "reviews.tsv", root=tiny_run.root) for a in TINY_RUNS[name]]
    steps = argv[argv.index("--max-steps") + 1]
    before = (run / "checkpoint" / "model.safetensors").read_bytes()
    with single_thread(), contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([*argv, "--out", str(run), "--resume"]) == 0
    assert f"stopped: max_steps after {steps} steps" in out.getvalue()
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == before
