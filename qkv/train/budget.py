"""Time budgets (``TrainConfig.max_minutes``): the LR schedule laid over the steps that will fit.

The budget is the run's whole training time, over every invocation of it (``TrainState.elapsed`` counts on across
a resume). After a few steps of measurement :class:`TimeBudget` knows the seconds per optimizer step (the first
steps of each invocation left out: compilation, caches, allocator), the seconds of one evaluation of
``eval_split`` and of one checkpoint (measured; timed once early when none has happened yet, and the evaluation again
after half the budget when none came since: a trained generator decodes faster), and fits the largest number of
further steps whose time, with the evaluations and saves due on the way and the end's (one last evaluation to pick
the best model, the checkpoint, the final evaluations; their measured times with 25% to spare), ends before the
deadline, less a margin of 2% of the budget. It fits again after every step, so a machine that slows down (or speeds
up) moves the end. The run stops at that step; the LR schedule ends there too, unless the epochs (or
``schedule_steps``) end first.

A schedule whose length changes mid-run jumps if it is recomputed from the step and the new length (cosine at step
600 of 1,000 is not cosine at step 600 of 800). :class:`Horizon` instead keeps the *progress* reached when the length
changes and spreads what is left of it evenly over the steps that are left: the learning rate stays continuous,
each step moves it by the slope of the schedule as it now stands, and it reaches the schedule's end (``min_lr_ratio``)
at the new last step. A horizon that never moves gives exactly :func:`~qkv.train.schedule.lr_factor`'s steps.
(timm and Hugging Face fix the length when the scheduler is built; a changing length is what a time budget needs.)

Everything the fitting keeps is in :meth:`TimeBudget.state_dict`, stored with the trainer's state in every
checkpoint, so a resumed run continues the same schedule. Every number comes from process 0's clock, shared in the
step's one all-reduce, so every process computes the same horizon and the same learning rate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Horizon", "TimeBudget"]

log = logging.getLogger("qkv.train.trainer")

SKIP = 2  # step-time samples left out at the start of every invocation (the first step has none: no reading before)
MEASURE = 5  # samples before the first fit
ALPHA = 0.1  # after a running mean of the first 1/ALPHA samples, an exponential average (follows a slowing machine)
MARGIN = 0.02  # of the budget, left unplanned (noise in the estimates)
SAFETY = 1.25  # the end's evaluations and checkpoint, measured once each (noisier than the steps' mean), times this
PROVISIONAL = 0.05  # of the budget, kept for the final evaluations when no evaluation can be timed (no eval_split)
RETIME = 0.5  # past this fraction of the budget, an evaluation last timed before this fraction of the time spent is
# timed again (an untrained generator decodes to the maximum length: its evaluations are slower than a trained one's)


@dataclass
class Horizon:
    """The LR schedule's length, movable without jumps.

    The decay's progress (0 at ``warmup_steps``, 1 at the end) rises linearly from ``anchor_progress`` at
    ``anchor_step`` to 1 at ``total``. :meth:`move` re-anchors at the current step, keeping its progress.
    """

    total: int  # the optimizer step at which the schedule ends
    anchor_step: int = 0  # the warm-up's end, or the step of the last move
    anchor_progress: float = 0.0

    def progress(self, step: int) -> float:
        """Progress of the decay at optimizer step ``step`` (0-based), in ``[0, 1]``."""
        s0, p0 = self.anchor_step, self.anchor_progress
        if step <= s0:
            return p0
        if self.total <= s0:
            return 1.0
        return min(1.0, p0 + (1.0 - p0) * ((step - s0) / (self.total - s0)))

    def move(self, step: int, total: int) -> None:
        """End the schedule at ``total`` from step ``step`` on; the progress at ``step`` is kept."""
        if total == self.total:
            return
        if step > self.anchor_step:
            self.anchor_progress, self.anchor_step = self.progress(step), step
        self.total = total


def _multiples(m: int, a: int, b: int) -> int:
    """How many multiples of ``m`` lie in ``[a, b)``."""
    return (b - 1) // m - (a - 1) // m if m > 0 and b > a else 0


@dataclass
class TimeBudget:
    """Fits the run's end, and its LR schedule's, to ``seconds`` of training; see the module docstring.

    Args:
        seconds: the budget (``60 * max_minutes``), over every invocation of the run.
        horizon: the LR schedule's :class:`Horizon`, moved by :meth:`record`.
        schedule_total: the schedule's length without a budget (epochs x batches, or ``schedule_steps``).
        last_step: where the epochs end (``epochs x steps_per_epoch``).
        steps_per_epoch, eval_every: when evaluations and checkpoints come (every epoch's end; every
            ``eval_every`` steps an evaluation only).
        evaluates: ``eval_split`` is set (evaluated at epoch ends, every ``eval_every`` steps, and once at the end).
        saves: checkpoints are written (``out`` is set).
        final_evals: how many final splits are evaluated at the end.
    """

    seconds: float
    horizon: Horizon
    schedule_total: int
    last_step: int
    steps_per_epoch: int
    eval_every: int = 0
    evaluates: bool = True
    saves: bool = True
    final_evals: int = 2
    # what the fitting keeps (state_dict)
    step_time: float | None = None  # seconds per optimizer step
    samples: int = 0  # step times measured so far
    eval_seconds: float | None = None  # one evaluation of eval_split (with the best model's save)
    eval_timed_at: float | None = None  # the budget's seconds spent when it was measured
    save_seconds: float | None = None  # one checkpoint
    end: int | None = None  # the step at which the budget ends the run (None: the epochs end first)
    # this invocation only
    _last: float | None = field(default=None, repr=False)
    _now: float = field(default=0.0, repr=False)
    _seen: int = field(default=0, repr=False)
    _logged: int | None = field(default=None, repr=False)

    SAVED = ("step_time", "samples", "eval_seconds", "eval_timed_at", "save_seconds", "end")

    def state_dict(self) -> dict[str, Any]:
        """The estimates (the horizon is saved beside them, by the trainer)."""
        return {k: getattr(self, k) for k in self.SAVED}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self.SAVED:
            setattr(self, k, state.get(k))

    # --- measuring ---------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Enough is measured to fit: step times, and the evaluation's and the checkpoint's when they happen."""
        return (self.samples >= MEASURE and (self.eval_seconds is not None or not self.evaluates)
                and (self.save_seconds is not None or not self.saves))

    def timing_due(self) -> tuple[bool, bool]:
        """Whether the trainer should evaluate, and whether it should save, now, to time them: the step times are
        measured but no evaluation (checkpoint) has happened yet; or half the budget is spent, the budget ends the run,
        and the evaluation was last timed in the first half of the time spent (no evaluation since the early ones)."""
        if self.samples < MEASURE:
            return False, False
        stale = (self.end is not None and self._now >= RETIME * self.seconds
                 and (self.eval_timed_at or 0.0) < RETIME * self._now)
        return (self.evaluates and (self.eval_seconds is None or stale),
                self.saves and self.save_seconds is None)

    def record(self, step: int, now: float, *, eval_seconds: float = 0.0, evals: int = 0,
               save_seconds: float = 0.0, saves: int = 0) -> bool:
        """Take the reading ``now`` (seconds of the budget spent) of optimizer step ``step`` (the steps done), with
        the ``evals`` evaluations and ``saves`` checkpoints since the previous step and their seconds; refit.
        Returns whether the run must stop after this step."""
        self._now = now
        if evals:
            self.eval_seconds, self.eval_timed_at = eval_seconds / evals, now
        if saves:
            self.save_seconds = save_seconds / saves
        if self._last is not None:
            self._seen += 1
            if self._seen > SKIP:
                self._add_sample(now - self._last - eval_seconds - save_seconds)
        self._last = now
        if self.ready:
            self._fit(step, now)
        return self.spent(step, now)

    def _add_sample(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.samples += 1
        if self.step_time is None:
            self.step_time = seconds
        else:
            self.step_time += max(1.0 / self.samples, ALPHA) * (seconds - self.step_time)

    def begin(self, step: int, now: float) -> bool:
        """Refit at the start of an invocation (the budget or the epochs may have changed since the checkpoint);
        whether the budget is spent already."""
        if self.ready:
            self._fit(step, now)
        return self.spent(step, now)

    def spent(self, step: int, now: float) -> bool:
        """Whether no further step fits: past the deadline, or at the end the last fit found."""
        return now >= self.seconds or (self.end is not None and step >= self.end)

    # --- fitting -----------------------------------------------------------------------------------------------
    def final_seconds(self) -> float:
        """Time kept for the end: the last evaluation (to pick the best model), the checkpoint, the final splits."""
        e = self.eval_seconds or 0.0
        final = e * self.final_evals if self.evaluates else PROVISIONAL * self.seconds * (self.final_evals > 0)
        return SAFETY * ((e if self.evaluates else 0.0) + (self.save_seconds or 0.0) + final)

    def cost(self, step: int, k: int) -> float:
        """Seconds of ``k`` more steps after ``step`` steps, with the evaluations and checkpoints due before each of
        them (after step ``step`` itself too: it is read before they come)."""
        e = (self.eval_seconds or 0.0) if self.evaluates else 0.0
        c = self.save_seconds or 0.0
        spe, every = self.steps_per_epoch, self.eval_every
        ends = _multiples(spe, step, step + k)
        evals = _multiples(every, step, step + k) - _multiples(every * spe // math.gcd(every, spe) if every else 0,
                                                               step, step + k)
        return k * self.step_time + ends * (e + c) + evals * e

    def _fit(self, step: int, now: float) -> None:
        available = self.seconds * (1.0 - MARGIN) - now - self.final_seconds()
        rest = self.last_step - step
        if rest <= 0 or self.cost(step, rest) <= available:
            self.end, total = None, self.schedule_total  # the epochs end first
        else:
            lo, hi = 0, rest - 1  # the largest k with cost(k) <= available (cost(0) = 0)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if self.cost(step, mid) <= available else (lo, mid - 1)
            self.end = step + lo
            total = min(self.schedule_total, self.end)
        self.horizon.move(step, total)
        if self._logged is None or abs(self.horizon.total - self._logged) > 0.1 * max(self._logged, 1):
            self._logged = self.horizon.total
            if self.end is None:
                log.info("time budget: the epochs end first (step %d); %.3g s per step", self.last_step,
                         self.step_time)
            else:
                log.info("time budget: the run and its LR schedule end at step %d (%.3g s per step; %.3g s kept "
                         "for the final evaluation and checkpoint)", self.end, self.step_time, self.final_seconds())
