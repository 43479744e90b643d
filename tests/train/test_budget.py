"""Time budgets with a fake clock (no sleeps): the LR schedule laid over the steps that fit, re-estimated when the
machine slows down, the epochs' horizon kept when they end first, and an exact resume of the fitted schedule."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from qkv.train import TrainConfig, Trainer, load_checkpoint, lr_factor
from qkv.train.budget import MARGIN, SAFETY, Horizon, TimeBudget
from tests.trainer_toy import ToyTask

PEAK = 0.01


class FakeClock:
    """Seconds that pass only when the test says: a step (the task's loss) or an evaluation advances it."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def __call__(self) -> float:
        return self.t


class TimedToy(ToyTask):
    """The toy task whose steps take ``step_seconds(i)`` (i: the loss call, from 0) and whose evaluations
    take ``eval_seconds`` on the fake clock."""

    def __init__(self, clock, step_seconds=lambda i: 1.0, eval_seconds=0.5, **kw):
        super().__init__(**kw)
        self.clock, self.step_seconds, self.eval_seconds, self.calls = clock, step_seconds, eval_seconds, 0

    def loss(self, model, batch):
        self.clock.t += self.step_seconds(self.calls)
        self.calls += 1
        return super().loss(model, batch)

    def evaluate(self, model, split):
        self.clock.t += self.eval_seconds
        return super().evaluate(model, split)


def cfg(**kw):
    """One fixed thread: the fake clock's steps give the tuner nothing to choose between (with two threads its
    trial slots would move the first timed evaluation)."""
    base = dict(epochs=50, batch_size=16, lr=PEAK, device="cpu", warmup_steps=10, log_every=1, progress=False,
                max_minutes=1.0, threads=1)
    return TrainConfig(**{**base, **kw})


def run(task, config, clock, callbacks=()):
    """Train; returns the result, the learning rate of every step and the schedule's length after every step."""
    lrs, totals = [], []
    trainer = None

    def record(state, logs):
        lrs.append(logs["lr"])
        totals.append(trainer.horizon.total)

    trainer = Trainer(task, config, [record, *callbacks], clock=clock)
    return trainer.fit(), lrs, totals


def assert_no_jumps(lrs, warmup, min_ratio=0.0):
    """After the warm-up, every step moves the LR by at most the slope of a cosine over the steps left."""
    n = len(lrs)
    for i in range(warmup, n - 1):
        bound = PEAK * (1 - min_ratio) * math.pi / 2 / (n - i)
        assert lrs[i] - lrs[i + 1] <= bound * (1 + 1e-9), f"LR drops by {lrs[i] - lrs[i + 1]:.3g} at step {i}"
        assert lrs[i + 1] <= lrs[i] * (1 + 1e-12), f"LR rises at step {i}"


# --- the trainer ------------------------------------------------------------------------------------------------
def test_the_schedule_is_laid_over_the_steps_that_fit():
    clock = FakeClock()
    r, lrs, totals = run(TimedToy(clock), cfg(), clock)
    n = r.state.global_step
    assert r.stopped == "time"
    # 1 s steps, an evaluation (0.5 s) at every epoch's end (6 steps); the end: one evaluation, two final splits
    kept = 60 * MARGIN + SAFETY * 3 * 0.5
    assert 60 - kept - 1.5 - n // 6 * 0.5 <= n <= 60 - kept - n // 6 * 0.5
    assert clock.t <= 60.0 and r.state.elapsed == clock.t
    assert totals[0] == 300 and set(totals[8:]) == {n}  # the epochs' horizon, then the fit after 8 steps
    # fitted within the warm-up: exactly a cosine over the n steps that ran, ending near the minimum
    assert lrs == pytest.approx([PEAK * lr_factor(s, n, warmup_steps=10) for s in range(n)], rel=1e-12)
    assert lrs[-1] < 0.002 * PEAK


def test_a_fit_after_the_warm_up_moves_the_schedule_without_jumps():
    clock = FakeClock()
    r, lrs, totals = run(TimedToy(clock), cfg(warmup_steps=0, min_lr_ratio=0.1), clock)
    assert r.stopped == "time" and totals[0] == 300 and totals[-1] == r.state.global_step
    assert_no_jumps(lrs, 0, min_ratio=0.1)
    assert lrs[-1] == pytest.approx(0.1 * PEAK, abs=0.002 * PEAK)


def test_a_clock_that_slows_midway_re_estimates_the_end():
    clock = FakeClock()
    task = TimedToy(clock, step_seconds=lambda i: 1.0 if i < 20 else 2.0)
    r, lrs, totals = run(task, cfg(), clock)
    n = r.state.global_step
    fitted = totals[8]
    assert fitted > 50 and 30 <= n <= 40 < fitted  # about 20 + (60 - 20 - the end's time) / 2
    assert all(a >= b for a, b in zip(totals[8:], totals[9:], strict=False))  # only ever shortened
    assert clock.t <= 60.0
    assert_no_jumps(lrs, 10)
    assert lrs[-1] < 0.01 * PEAK


def test_epochs_that_end_before_the_budget_keep_their_horizon():
    clock = FakeClock()
    r, lrs, totals = run(TimedToy(clock), cfg(epochs=3), clock)
    assert r.stopped == "epochs" and r.state.global_step == 18 and set(totals) == {18}
    assert lrs == [PEAK * lr_factor(s, 18, warmup_steps=10) for s in range(18)]


def test_an_evaluation_is_timed_early_when_none_is_due(tmp_path):
    clock = FakeClock()  # 24 steps per epoch: no epoch's end before the fit needs the end's time
    r, lrs, totals = run(TimedToy(clock, eval_seconds=3.0), cfg(batch_size=4, out=str(tmp_path)), clock)
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(e["event"], e["global_step"]) for e in events if e["event"] in ("eval", "final")]
    n = r.state.global_step
    assert evals[0] == ("eval", 8)  # timed once, after the step times were measured
    assert evals[-3:] == [("eval", n), ("final", n), ("final", n)]  # the annealed model is evaluated, in time
    assert clock.t <= 60.0 and n >= 60 - 60 * MARGIN - SAFETY * 3 * 3.0 - 3 * 3.0 - 1
    assert [e["schedule_steps"] for e in events if e["event"] == "train"][-1] == n


def test_an_evaluation_timed_on_the_untrained_model_is_timed_again_after_half_the_budget():
    clock = FakeClock()
    task = TimedToy(clock, eval_seconds=4.0)
    evaluate = task.evaluate

    def faster(model, split):  # an untrained generator decodes to the maximum length: 4 s, then 0.5 s
        task.eval_seconds = 4.0 if task.calls < 10 else 0.5
        return evaluate(model, split)

    task.evaluate = faster
    r, lrs, totals = run(task, cfg(batch_size=2, eval_every=0), clock)
    n = r.state.global_step
    assert r.stopped == "time" and totals[10] < totals[-1] == n  # the end moved later when timed again
    assert 60 - 60 * MARGIN - SAFETY * 3 * 0.5 - 2.5 <= clock.t <= 60  # kept 3 evaluations of 0.5 s, not 4 s
    assert lrs[-1] < 0.002 * PEAK


def test_resume_continues_the_same_schedule_exactly(tmp_path):
    """With the same step times (the first ones of the resumed process are not measured: they are the slow ones)."""
    clock = FakeClock()
    task = TimedToy(clock, dropout=0.2, noise=True)
    full, full_lrs, _ = run(task, cfg(out=str(tmp_path / "full"), warmup_steps=0), clock)

    def stop_at(state, logs):
        if state.global_step == 25:
            raise KeyboardInterrupt

    clock = FakeClock()
    task = TimedToy(clock, dropout=0.2, noise=True)
    with pytest.raises(KeyboardInterrupt):
        run(task, cfg(out=str(tmp_path / "cut"), warmup_steps=0), clock, [stop_at])
    saved = load_checkpoint(tmp_path / "cut" / "checkpoint").state
    assert saved["position"]["elapsed"] == clock.t and saved["budget"]["end"] is not None

    clock = FakeClock(start=1000.0)  # another process, another clock: only the elapsed time counts
    task = TimedToy(clock, dropout=0.2, noise=True)
    resumed, lrs, _ = run(task, cfg(out=str(tmp_path / "cut"), warmup_steps=0, resume=True), clock)
    assert resumed.stopped == full.stopped == "time"
    assert resumed.state.global_step == full.state.global_step
    assert lrs == full_lrs[25:]
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.metrics == full.metrics and resumed.state.elapsed == full.state.elapsed


def test_a_spent_budget_stops_at_once_and_a_larger_one_goes_on(tmp_path, caplog):
    clock = FakeClock()
    first, _, _ = run(TimedToy(clock), cfg(out=str(tmp_path)), clock)
    n = first.state.global_step
    clock = FakeClock()
    with caplog.at_level(logging.WARNING, logger="qkv.train.trainer"):
        again, lrs, _ = run(TimedToy(clock), cfg(out=str(tmp_path), resume=True), clock)
    assert again.stopped == "time" and again.state.global_step == n and lrs == []
    assert "time budget (max_minutes=1) is spent" in caplog.text
    clock = FakeClock()
    more, lrs, totals = run(TimedToy(clock), cfg(out=str(tmp_path), resume=True, max_minutes=2.0), clock)
    assert more.stopped == "time" and more.state.global_step > n + 40 and more.state.elapsed <= 120.0
    assert max(lrs) < 0.002 * PEAK  # a finished schedule stays at its end


# --- the parts ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("warmup", [0, 5])
def test_a_horizon_that_never_moves_is_lr_factor(schedule, warmup):
    h = Horizon(40, warmup)
    for s in range(45):
        assert lr_factor(s, 40, schedule=schedule, warmup_steps=warmup, progress=h.progress(s)) == \
            lr_factor(s, 40, schedule=schedule, warmup_steps=warmup)


def test_a_moved_horizon_keeps_the_progress_and_ends_at_its_new_total():
    h = Horizon(100, 0)
    h.move(30, 50)
    assert h.progress(30) == pytest.approx(0.3) and h.progress(50) == 1.0
    assert h.progress(40) == pytest.approx(0.3 + 0.7 * 10 / 20)
    h.move(40, 200)  # longer again: still continuous
    assert h.progress(40) == pytest.approx(0.65) and h.progress(200) == 1.0
    h = Horizon(100, 10)
    h.move(5, 60)  # within the warm-up: the decay starts at the warm-up's end, as if it had always been 60 long
    assert h == Horizon(60, 10, 0.0)


@pytest.mark.parametrize("every", [0, 4, 6, 9])
def test_the_cost_of_k_steps_counts_the_evaluations_and_saves_between_them(every):
    b = TimeBudget(100.0, Horizon(60), 60, 60, steps_per_epoch=6, eval_every=every, step_time=1.0, samples=9,
                   eval_seconds=0.25, save_seconds=0.125)
    for start in range(1, 14):
        for k in range(0, 20):
            inside = range(start, start + k)  # before each of the k steps
            ends = sum(g % 6 == 0 for g in inside)
            evals = sum(bool(every) and g % every == 0 and g % 6 != 0 for g in inside)
            assert b.cost(start, k) == k + ends * 0.375 + evals * 0.25
