"""Checkpoints: round trip, tied weights, optimizer state, atomic replacement, no pickle."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from qkv.train import TrainConfig, load_checkpoint, load_model, resolve_checkpoint, rng, train
from qkv.train import checkpoint as ck
from tests.trainer_toy import ToyTask, build_toy_model


def write(path, value, **kw):
    return ck.write_checkpoint(path, weights={"w": torch.full((2,), float(value))}, task="t",
                               config={"v": value}, **kw)


def test_round_trip_gives_identical_outputs(tmp_path):
    r = train(ToyTask(dropout=0.3), TrainConfig(epochs=2, batch_size=16, device="cpu", out=str(tmp_path),
                                                 progress=False, monitor="mse", mode="min"))
    model, ckpt = load_model(tmp_path / "checkpoint", build_toy_model, task="toy")
    assert ckpt.task == "toy" and ckpt.config == ToyTask(dropout=0.3).config()
    assert json.loads((ckpt.assets / "vocab.json").read_text()) == ["<pad>", "a", "b", "fitted-96"]
    assert not model.training
    x = torch.randn(5, 6)
    reference = build_toy_model(ckpt.config)
    reference.load_state_dict(ckpt.state_dict)
    assert torch.equal(model(x), reference.eval()(x))
    # the run directory resolves to the best model, whose weights are the result's
    best_model, best = load_model(tmp_path, build_toy_model)
    assert best.path == tmp_path / "best"
    assert torch.equal(best_model(x), r.model.eval()(x))
    with pytest.raises(ValueError, match="holds a 'toy' model, not a 'translate' one"):
        load_model(tmp_path, build_toy_model, task="translate")


def test_tied_weights_are_stored_once_and_restored(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.out = nn.Linear(4, 7, bias=False)
            self.out.weight = self.emb.weight

    m = Tied()
    ck.save_weights(tmp_path / "m.safetensors", m.state_dict())
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["emb.weight"]
    sd = ck.load_weights(tmp_path / "m.safetensors")
    m2 = Tied()
    m2.load_state_dict(sd)  # strict: both names present
    assert torch.equal(m2.emb.weight, m.emb.weight) and m2.out.weight is m2.emb.weight


def test_optimizer_state_round_trip():
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.95))
    for _ in range(2):
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    tensors, meta = ck.optimizer_to_files(opt.state_dict())
    json.dumps(meta)
    opt2 = torch.optim.AdamW(nn.Linear(3, 2).parameters(), lr=1.0)
    opt2.load_state_dict(ck.optimizer_from_files(tensors, json.loads(json.dumps(meta))))
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for k in a["state"][i]:
            assert torch.equal(a["state"][i][k], b["state"][i][k])


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = rng.capture()
    first = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand(2))
    rng.restore(state)
    second = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand(2))
    assert torch.equal(first[0], second[0]) and first[1:3] == second[1:3] and (first[3] == second[3]).all()
    with rng.forked():
        torch.rand(100)
    assert torch.equal(torch.rand(3), (rng.restore(state), torch.rand(3), torch.rand(3))[2])


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "checkpoint"
    write(path, 1)

    def crash(directory):
        (directory / "half-written").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write(path, 2, save_assets=crash)
    c = load_checkpoint(path)
    assert c.config == {"v": 1} and torch.equal(c.state_dict["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no temporary left behind


def test_crash_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint"
    write(path, 1)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed after moving the old one aside
        real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write(path, 2)
    monkeypatch.setattr(ck.os, "replace", real_replace)
    assert not path.exists()
    assert resolve_checkpoint(tmp_path, prefer=("checkpoint",)).name == ".checkpoint.old"
    assert load_checkpoint(path, prefer=()).config == {"v": 1}
    write(path, 3)  # the next save completes the swap and removes the leftover
    assert load_checkpoint(path).config == {"v": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_trainer_crash_during_save_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    c = TrainConfig(epochs=3, batch_size=16, device="cpu", out=str(tmp_path), progress=False, eval_split=None)
    train(ToyTask(), c.replace(epochs=1))
    real = ck.save_weights

    def failing(path, sd, metadata=None):
        real(path, sd, metadata)
        raise OSError("killed while saving")

    import qkv.train.checkpoint as module

    monkeypatch.setattr(module, "save_weights", failing)
    with pytest.raises(OSError, match="killed while saving"):
        train(ToyTask(), c.replace(resume=True))
    monkeypatch.setattr(module, "save_weights", real)
    ckpt = load_checkpoint(tmp_path / "checkpoint")
    assert ckpt.state["position"]["global_step"] == 6
    assert train(ToyTask(), c.replace(resume=True)).state.global_step == 18


def test_missing_and_foreign_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        load_checkpoint(tmp_path)
    write(tmp_path / "c", 1)
    (tmp_path / "c" / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a qkv checkpoint"):
        load_checkpoint(tmp_path / "c")
