"""The trainer on a tiny task: exact resume, time budget, early stopping, metrics.jsonl, schedule, data order,
configuration."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from qkv.cli.options import ArgumentParser, add_options, options_from_args
from qkv.train import (
    Task,
    TrainConfig,
    epoch_batches,
    load_checkpoint,
    load_model,
    lr_factor,
    to_device,
    train,
)
from qkv.train.schedule import num_batches
from tests.trainer_toy import ToyTask, build_toy_model


def cfg(out=None, **kw):
    base = dict(epochs=3, batch_size=16, lr=0.01, device="cpu", warmup_steps=3, log_every=2, progress=False,
                out=str(out) if out is not None else None)
    return TrainConfig(**{**base, **kw})


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs: max |diff| {(a[k] - b[k]).abs().max():.3g}"


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def raise_at(step):
    def callback(state, logs):
        if state.global_step == step:
            raise KeyboardInterrupt
    return callback


def sigint_at(step):
    def callback(state, logs):
        if state.global_step == step:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: stop after the next step
    return callback


# --- exact resume ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["keyboard_interrupt", "sigint", "max_steps", "time"])
@pytest.mark.parametrize("lengths", [False, True])
def test_interrupted_and_resumed_run_is_bitwise_identical(tmp_path, how, lengths):
    # dropout (torch RNG) and collate noise (torch, random, numpy) make any lost RNG state visible
    def task():
        return ToyTask(dropout=0.2, noise=True, lengths=lengths)

    extra = dict(monitor="mse", mode="min", eval_every=4, bucket_batches=2)
    full = train(task(), cfg(tmp_path / "full", **extra))
    assert full.stopped == "epochs" and full.state.global_step == 18

    out = tmp_path / "cut"
    if how == "keyboard_interrupt":  # mid-epoch 1 (6 steps per epoch)
        with pytest.raises(KeyboardInterrupt):
            train(task(), cfg(out, **extra), callbacks=[raise_at(8)])
        expected_step = 8
    elif how == "sigint":
        with pytest.raises(KeyboardInterrupt):
            train(task(), cfg(out, **extra), callbacks=[sigint_at(4)])
        expected_step = 5
    elif how == "max_steps":
        first = train(task(), cfg(out, max_steps=11, **extra))
        assert first.stopped == "max_steps"
        assert [r["split"] for r in read_metrics(out) if r["event"] == "final"] == ["valid", "test"]
        expected_step = 11
    else:
        first = train(task(), cfg(out, max_minutes=1e-9, **extra))
        assert first.stopped == "time" and first.metrics["test"]["mse"] > 0
        expected_step = 1
    saved = load_checkpoint(out / "checkpoint")
    assert saved.state["position"]["global_step"] == expected_step

    resumed_task = task()
    resumed = train(resumed_task, cfg(out, resume=True, **extra))
    assert resumed.stopped == "epochs" and resumed.state.global_step == 18
    assert_bitwise_equal(params(resumed.model), params(full.model))
    assert_bitwise_equal(load_checkpoint(out / "checkpoint").state_dict, load_checkpoint(tmp_path / "full" /
                                                                                          "checkpoint").state_dict)
    assert resumed.metrics == full.metrics
    assert resumed_task.vocab == ["<pad>", "a", "b", "fitted-96"]  # assets came back before setup()
    assert any(r["event"] == "resume" for r in read_metrics(out))


class InterruptedLoss(ToyTask):
    def __init__(self, at_call, **kw):
        super().__init__(**kw)
        self.calls, self.at_call = 0, at_call

    def loss(self, model, batch):
        self.calls += 1
        if self.calls == self.at_call:
            raise KeyboardInterrupt
        return super().loss(model, batch)


def test_interrupt_inside_a_step_saves_the_last_finished_step(tmp_path, caplog):
    full = train(ToyTask(), cfg(tmp_path / "full"))
    with pytest.raises(KeyboardInterrupt):
        train(InterruptedLoss(8), cfg(tmp_path / "cut"))
    assert load_checkpoint(tmp_path / "cut" / "checkpoint").state["position"]["global_step"] == 7
    assert "interrupted inside step 8" in caplog.text
    resumed = train(ToyTask(), cfg(tmp_path / "cut", resume=True))  # no randomness: still identical
    assert_bitwise_equal(params(resumed.model), params(full.model))


def test_resume_needs_the_flag_and_the_same_data(tmp_path):
    train(ToyTask(), cfg(tmp_path, epochs=1))
    with pytest.raises(FileExistsError, match="resume"):
        train(ToyTask(), cfg(tmp_path, epochs=1))
    with pytest.raises(ValueError, match="training data changed"):
        train(ToyTask(n=80), cfg(tmp_path, epochs=2, resume=True))
    # resuming a finished run trains no more, and extending epochs continues it
    done = train(ToyTask(), cfg(tmp_path, epochs=1, resume=True))
    assert done.state.global_step == 6
    more = train(ToyTask(), cfg(tmp_path, epochs=2, resume=True))
    assert more.state.global_step == 12


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to resume.*holds no checkpoint.*drop resume"):
        train(ToyTask(), cfg(tmp_path / "new", epochs=1, resume=True))
    assert not (tmp_path / "new" / "checkpoint").exists()


def test_loading_never_unpickles(tmp_path, monkeypatch):
    train(ToyTask(dropout=0.1), cfg(tmp_path, epochs=1, max_steps=3))

    def no_pickle(*a, **k):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_pickle)
    r = train(ToyTask(dropout=0.1), cfg(tmp_path, epochs=1, resume=True))
    assert r.state.global_step == 6
    load_model(tmp_path, build_toy_model)
    for f in (tmp_path / "checkpoint").iterdir():
        assert f.suffix in (".json", ".safetensors") or f.name == "assets", f


# --- time budget, early stopping, metrics ------------------------------------------------------------------------
def test_time_budget_stops_with_checkpoint_and_final_evaluation(tmp_path):
    r = train(ToyTask(), cfg(tmp_path, epochs=50, max_minutes=1e-9))
    assert r.stopped == "time"
    assert r.state.global_step == 1  # one step, then the budget is found spent
    assert load_checkpoint(tmp_path / "checkpoint").state["position"]["global_step"] == 1
    events = [(m["event"], m.get("split")) for m in read_metrics(tmp_path)]
    assert events[-3:] == [("final", "valid"), ("final", "test"), ("end", None)]
    assert set(r.metrics) == {"valid", "test"}


def test_early_stopping_keeps_and_evaluates_the_best_weights(tmp_path):
    scores = iter([0.5, 0.9, 0.8, 0.7, 0.95, 0.99])
    seen = []

    def eval_fn(model, split):
        seen.append(params(model))
        return {"acc": next(scores)} if split == "valid" and len(seen) <= 4 else {"acc": -1.0}

    r = train(ToyTask(eval_fn=eval_fn), cfg(tmp_path, epochs=10, monitor="acc", patience=2, final_splits=("valid",)))
    assert r.stopped == "early_stop"
    assert r.state.epoch == 4 and r.state.global_step == 24
    assert r.state.best == 0.9 and r.state.best_step == 12 and r.state.stopped_early
    best = load_checkpoint(tmp_path)  # a run directory means its best model
    assert best.path.name == "best" and best.state is None
    assert_bitwise_equal(best.state_dict, seen[1])  # the weights evaluated at the second epoch
    assert_bitwise_equal(seen[-1], seen[1])  # the final evaluation used them too
    assert_bitwise_equal(params(r.model), seen[1])
    last = load_checkpoint(tmp_path / "checkpoint")
    assert last.state["position"]["stopped_early"] and not torch.equal(last.state_dict["0.weight"], seen[1]["0.weight"])
    # resuming an early-stopped run does not train further
    again = train(ToyTask(eval_fn=lambda m, s: {"acc": 0.0}), cfg(tmp_path, epochs=10, monitor="acc", patience=2,
                                                                  resume=True, final_splits=("valid",)))
    assert again.state.global_step == 24 and again.stopped == "early_stop"


def test_monitor_must_be_a_metric(tmp_path):
    with pytest.raises(ValueError, match="monitor='acc' is not among the metrics.*mse"):
        train(ToyTask(), cfg(None, epochs=1, monitor="acc"))


def test_metrics_jsonl(tmp_path):
    step_logs = []
    r = train(ToyTask(), cfg(tmp_path, epochs=2, log_every=4), callbacks=[lambda s, logs: step_logs.append(logs)])
    records = read_metrics(tmp_path)
    assert records[0]["event"] == "start" and records[0]["train_config"]["batch_size"] == 16
    assert records[0]["steps_per_epoch"] == 6 and records[0]["world_size"] == 1
    train_lines = [m for m in records if m["event"] == "train"]
    assert [m["global_step"] for m in train_lines] == [4, 8, 12]
    for m in train_lines:
        assert {"loss", "lr", "items_per_s", "grad_norm", "abs_err", "epoch", "time"} <= m.keys()
        assert m["items_per_s"] > 0
    # the logged loss is the count-weighted mean of the steps since the last line
    steps = step_logs[4:8]
    expected = sum(s["loss"] * s["count"] for s in steps) / sum(s["count"] for s in steps)
    assert train_lines[1]["loss"] == pytest.approx(expected, rel=1e-12)
    assert train_lines[1]["lr"] == step_logs[7]["lr"]
    evals = [m for m in records if m["event"] == "eval"]
    assert [(m["split"], m["global_step"], m["epoch"]) for m in evals] == [("valid", 6, 1.0), ("valid", 12, 2.0)]
    assert evals[-1]["metrics"]["mse"] == r.metrics["valid"]["mse"]
    assert records[-1] == {**records[-1], "event": "end", "stopped": "epochs", "global_step": 12}


def test_no_output_directory_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = train(ToyTask(), cfg(None, epochs=2, monitor="mse", mode="min"))
    assert r.out is None and r.state.global_step == 12 and r.state.best is not None
    assert list(tmp_path.iterdir()) == []


def test_training_reduces_the_loss():
    r = train(ToyTask(n=256), cfg(None, epochs=8, batch_size=32, lr=0.02, final_splits=("valid",)))
    untrained = ToyTask(n=256).evaluate(build_toy_model(ToyTask().config()).eval(), "valid")
    assert r.metrics["valid"]["mse"] < 0.5 * untrained["mse"]


def test_bf16_autocast_on_cpu():
    r = train(ToyTask(), cfg(None, epochs=1, amp="bf16", final_splits=("valid",)))
    assert torch.isfinite(torch.tensor(r.metrics["valid"]["mse"]))


# --- task contract -----------------------------------------------------------------------------------------------
class MeanLossTask(ToyTask):
    def loss(self, model, batch):
        return (model(batch["x"]).squeeze(-1) - batch["y"]).pow(2), 1, {}


def test_loss_must_be_a_summed_scalar():
    with pytest.raises(ValueError, match="scalar tensor"):
        train(MeanLossTask(), cfg(None, epochs=1))


def test_task_type_is_checked():
    with pytest.raises(TypeError, match="qkv.train.Task"):
        train(object(), cfg(None))


def test_to_device_walks_containers():
    from collections import namedtuple
    from dataclasses import dataclass

    @dataclass
    class B:
        x: torch.Tensor
        n: int

    P = namedtuple("P", "a b")
    batch = {"a": [torch.ones(1), (torch.zeros(2), "s")], "b": B(torch.ones(3), 4), "c": P(torch.ones(1), 2)}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"][0].is_meta and moved["a"][1][0].is_meta and moved["a"][1][1] == "s"
    assert moved["b"].x.is_meta and moved["b"].n == 4 and isinstance(moved["c"], P) and moved["c"].a.is_meta
    assert Task().to_device(torch.ones(1), torch.device("meta")).is_meta


# --- schedule and data order --------------------------------------------------------------------------------------
def test_lr_schedule():
    f = lr_factor
    assert [f(s, 100, warmup_steps=4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4, 100, warmup_steps=4, schedule="cosine") == 1.0
    assert f(100, 100, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.1)
    assert f(52, 100, warmup_steps=4, schedule="linear") == pytest.approx(0.5)
    assert f(52, 100, warmup_steps=4, schedule="cosine") == pytest.approx(0.5)
    assert f(500, 100, schedule="linear") == 0.0
    assert f(99, 100, warmup_steps=25, schedule="inverse_sqrt") == pytest.approx(0.5)
    assert f(7, 10, schedule="constant") == 1.0
    with pytest.raises(ValueError, match="unknown schedule"):
        f(10, 100, schedule="step")


def test_schedule_steps_sets_the_length_of_the_lr_schedule():
    """A schedule shorter than the epochs (a time budget measured in steps) anneals to 0 at its end."""
    logs = []
    r = train(ToyTask(), cfg(None, epochs=3, warmup_steps=2, schedule_steps=10, max_steps=10),
              callbacks=[lambda s, lg: logs.append(lg["lr"])])
    assert r.stopped == "max_steps" and len(logs) == 10
    assert logs == pytest.approx([0.01 * lr_factor(s, 10, warmup_steps=2) for s in range(10)])
    full = []
    train(ToyTask(), cfg(None, epochs=3, warmup_steps=2, max_steps=10), callbacks=[lambda s, lg: full.append(lg["lr"])])
    assert full == pytest.approx([0.01 * lr_factor(s, 18, warmup_steps=2) for s in range(10)])  # 3 epochs x 6


def test_epoch_order_is_a_pure_function_of_seed_and_epoch():
    a = epoch_batches(103, 10, seed=3, epoch=2)
    assert a == epoch_batches(103, 10, seed=3, epoch=2)
    assert a != epoch_batches(103, 10, seed=3, epoch=3) and a != epoch_batches(103, 10, seed=4, epoch=2)
    assert sorted(i for b in a for i in b) == list(range(103))
    assert [len(b) for b in a] == [10] * 10 + [3]
    assert len(epoch_batches(103, 10, seed=3, epoch=2, drop_last=True)) == 10
    assert len(epoch_batches(103, 10, seed=3, epoch=2, min_batch=4)) == 10  # 3 examples cannot feed 4 ranks
    for n, b, drop, mb in [(103, 10, False, 1), (103, 10, True, 1), (100, 10, False, 1), (103, 10, False, 4)]:
        assert num_batches(n, b, drop_last=drop, min_batch=mb) == len(
            epoch_batches(n, b, seed=0, epoch=0, drop_last=drop, min_batch=mb))


def test_length_bucketing_groups_similar_lengths():
    lengths = [(i * 37) % 50 + 1 for i in range(1000)]
    plain = epoch_batches(1000, 20, seed=0, epoch=0)
    bucketed = epoch_batches(1000, 20, seed=0, epoch=0, lengths=lengths, bucket_batches=10)
    assert sorted(i for b in bucketed for i in b) == list(range(1000))

    def padding(batches):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    assert padding(bucketed) < 0.2 * padding(plain)
    assert bucketed == epoch_batches(1000, 20, seed=0, epoch=0, lengths=lengths, bucket_batches=10)
    with pytest.raises(ValueError, match="lengths"):
        epoch_batches(10, 2, seed=0, epoch=0, lengths=[1, 2])


# --- configuration -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, message", [
    ("epochs", 0, "epochs must be >= 1"),
    ("epochs", 2.5, "epochs must be an integer"),
    ("batch_size", 0, "batch_size must be >= 1"),
    ("lr", 0.0, "lr must be > 0"),
    ("lr", float("nan"), "lr must be a finite number"),
    ("lr", 1e30, "lr must be <= 10"),
    ("seed", -1, "seed must be >= 0"),
    ("weight_decay", -0.1, "weight_decay must be >= 0"),
    ("max_minutes", 0, "max_minutes must be > 0"),
    ("max_steps", 0, "max_steps must be >= 1"),
    ("schedule_steps", 0, "schedule_steps must be >= 1"),
    ("clip_norm", -1.0, "clip_norm must be >= 0"),
    ("warmup_steps", -1, "warmup_steps must be >= 0"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be <= 1"),
    ("betas", (0.9, 1.0), "betas must be <= 0.999999"),
    ("betas", (0.9, 0.99, 0.9), "betas must be two numbers"),
    ("schedule", "step", "schedule must be one of"),
    ("amp", "fp8", "amp must be one of"),
    ("device", "tpu", "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("mode", "up", "mode must be one of"),
    ("patience", 3, "patience=3 needs a metric"),
    ("resume", True, "resume=True needs out"),
    ("log_every", 0, "log_every must be >= 1"),
])
def test_bad_config_values_raise(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_bad_settings_found_at_train_time(tmp_path):
    with pytest.raises(ValueError, match="amp='fp16' needs a CUDA device"):
        train(ToyTask(), cfg(None, amp="fp16"))
    with pytest.raises(ValueError, match="make no batch"):
        train(ToyTask(n=10), cfg(None, batch_size=16, drop_last=True))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            train(ToyTask(), cfg(None, device="cuda"))


def test_config_round_trip_and_cli_options():
    c = TrainConfig(epochs=3, betas=[0.8, 0.9], final_splits=["valid"], out="runs/x")
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="unknown TrainConfig fields: bogus"):
        TrainConfig.from_dict({"bogus": 1})

    task_defaults = TrainConfig(epochs=20, lr=3e-4, batch_size=128, monitor="accuracy")
    parser = ArgumentParser()
    add_options(parser, TrainConfig, defaults=task_defaults)
    args = parser.parse_args([])
    assert options_from_args(args, TrainConfig, defaults=task_defaults) == task_defaults
    argv = ("--epochs 3 --max-minutes 1.5 --out o --resume --device cpu --seed 7 --batch-size 8 --lr 0.1 "
            "--patience 2 --clip-norm 0 --no-progress")
    args = parser.parse_args(argv.split())
    c = options_from_args(args, TrainConfig, defaults=task_defaults, final_splits=("valid",))
    assert (c.epochs, c.max_minutes, c.out, c.resume, c.device, c.seed, c.batch_size, c.lr) == \
        (3, 1.5, "o", True, "cpu", 7, 8, 0.1)
    assert c.patience == 2 and c.monitor == "accuracy" and c.clip_norm is None and c.progress is False
    assert c.final_splits == ("valid",)
    with pytest.raises(ValueError, match="--batch-size must be >= 1"):
        options_from_args(parser.parse_args(["--batch-size", "0"]), TrainConfig, defaults=task_defaults)


def test_progress_bar_shows_loss_rate_and_epoch(capsys):
    train(ToyTask(), cfg(None, epochs=1, progress=True, final_splits=()))
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "loss=" in err and "items/s=" in err and "6/6" in err
    train(ToyTask(), cfg(None, epochs=1, final_splits=()))  # progress=None: stderr is not a terminal here
    assert "epoch 1/1" not in capsys.readouterr().err


# --- non-finite losses and gradients --------------------------------------------------------------------------
class _PoisonedTask(ToyTask):
    """The toy task whose loss (or only its gradient) turns non-finite from optimizer step ``at`` on."""

    def __init__(self, at: int, where: str):
        super().__init__()
        self.at, self.where, self.calls = at, where, 0

    def loss(self, model, batch):
        loss, count, stats = super().loss(model, batch)
        self.calls += 1
        if self.calls >= self.at:
            if self.where == "loss":
                loss = loss * float("nan")
            else:  # a finite loss whose gradient is infinite
                p = next(model.parameters())
                loss = loss + (p.sum() * 0.0).pow(0.5) * 0.0 + ((p.sum() * 0.0).abs() + 0.0).sqrt()
        return loss, count, stats


@pytest.mark.parametrize("where", ["loss", "gradient"])
@pytest.mark.parametrize("clip_norm", [1.0, None])
def test_non_finite_step_stops_training_and_keeps_the_good_checkpoint(tmp_path, where, clip_norm):
    out = tmp_path / "run"
    good = train(ToyTask(), cfg(out, epochs=1))
    before = load_checkpoint(out / "checkpoint", prefer=()).state_dict
    task = _PoisonedTask(at=2, where=where)
    with pytest.raises(FloatingPointError, match=f"the {'loss' if where == 'loss' else 'gradient norm'} is .* at "
                       "step 8 .*last good checkpoint is kept"):
        train(task, cfg(out, epochs=3, resume=True, clip_norm=clip_norm, monitor="neg_mse"))
    after = load_checkpoint(out / "checkpoint", prefer=())
    for k, v in after.state_dict.items():
        assert torch.isfinite(v).all() and torch.equal(v, before[k]), k
    assert good.state.global_step == 6
