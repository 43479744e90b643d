"""Threads that follow the machine: :class:`ThreadTuner` picks the number of torch threads that trains fastest now.

On a quiet machine all cores make a step fastest; next to another busy process (a user's compile, a browser, a
second training), ``n`` torch threads on ``n`` cores wait at every parallel region for the core that is taken, and
one thread is then many times faster than all of them (on 2 cores, 2 threads beside one busy process were measured
several times slower than 1). No setting chosen at the start is right for a whole run on a laptop that does other
things, so the tuner measures: after the first steps it times a few slots of steps with each
candidate (1 thread and the count torch started with), interleaved (A B B A A B, so that a change of load during the
trial favours neither), compares their median seconds per unit of work (the loss's count: tokens, images), and keeps
the faster one when it is faster by more than ``margin``. It checks again every ``recheck_every`` seconds, and
sooner when the steps become much slower than at the last check (the machine changed).

Every change is returned as one line that says what changed and why, for the trainer to log. The tuner knows nothing
of the trainer: it is fed ``(seconds, units)`` per step and the time, so tests drive it with fake timings.
A thread count fixed by the user (``--threads N``, ``TrainConfig.threads``, ``OMP_NUM_THREADS``) is never changed.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable

import torch

__all__ = ["ThreadTuner", "fixed_threads", "thread_tuner", "follow_machine"]

log = logging.getLogger("qkv.train.trainer")


def fixed_threads(configured: int | None) -> int | None:
    """The thread count the user fixed: ``configured`` (``TrainConfig.threads``), else ``OMP_NUM_THREADS`` when it is
    a positive number; ``None``: nothing fixed, the tuner may follow the machine."""
    if configured is not None:
        return configured
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


class ThreadTuner:
    """Chooses between 1 thread and ``most`` threads by timing training steps; see the module docstring.

    Args:
        most: the larger candidate (the count torch uses at the start: its default is the number of cores).
        now: the time of the start, in the seconds that :meth:`record` is given (the trainer's training seconds).
        start_after: seconds of steps before the first trial ...
        skip: ... and steps (warm-up: the first steps are slow for other reasons).
        recheck_every: seconds between trials.
        slot_seconds: a trial slot ends after the first step that brings its time to at least this.
        slots: slots per candidate in a trial.
        margin: the other candidate must be faster by more than this fraction to be taken.
        slower: a step time per unit this many times the last trial's winner starts a trial early ...
        min_gap: ... but not within this many seconds of the last one.
        set_threads, get_threads: torch's, or fakes in tests.
    """

    def __init__(self, most: int, *, now: float = 0.0, start_after: float = 0.0, skip: int = 2,
                 recheck_every: float = 120.0, slot_seconds: float = 0.5, slots: int = 3, margin: float = 0.1,
                 slower: float = 1.5, min_gap: float = 30.0,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 get_threads: Callable[[], int] = torch.get_num_threads):
        if most < 1 or slots < 1:
            raise ValueError(f"most and slots must be >= 1, got most={most}, slots={slots}")
        self.most, self.start_after, self.recheck_every = most, start_after, recheck_every
        self.slot_seconds, self.slots, self.margin = slot_seconds, slots, margin
        self.slower, self.min_gap = slower, min_gap
        self._set, self._get = set_threads, get_threads
        self.threads = get_threads()  # the count now in force
        self.next_check = now + start_after
        self._skip = skip
        self.last_check: float | None = None
        self.baseline: float | None = None  # seconds per unit of the winner of the last trial
        self._recent: list[float] = []  # seconds per unit of the steps since the last trial (for the early check)
        self._order: list[int] = []  # the trial's slots still to run, as thread counts; empty: no trial running
        self._times: dict[int, list[float]] = {}
        self._slot = [0.0, 0.0]  # seconds and units of the slot running
        self.previous = self.threads  # the count before the last trial
        self.changes = 0

    @property
    def active(self) -> bool:
        """Whether there is a choice to make (more than one core)."""
        return self.most > 1

    @property
    def trying(self) -> bool:
        return bool(self._order)

    def record(self, seconds: float, units: float, now: float) -> str | None:
        """Feed one step: its wall time, its work (tokens, images; 0 counts as 1) and the time at its end. Returns a
        line saying what changed and why when the thread count changed, else ``None``."""
        if not self.active:
            return None
        units = units if units > 0 else 1.0
        if self._skip > 0:
            self._skip -= 1
            return None
        if self._order:
            return self._trial_step(seconds, units, now)
        self._recent = (self._recent + [seconds / units])[-8:]
        early = (self.baseline is not None and len(self._recent) >= 4 and self.last_check is not None
                 and now - self.last_check >= self.min_gap
                 and statistics.median(self._recent) > self.slower * self.baseline)
        if now >= self.next_check or early:
            self._begin(now)
        return None

    def _begin(self, now: float) -> None:
        first, other = self.threads, (1 if self.threads != 1 else self.most)
        self.previous = first
        pattern = [first, other, other, first]
        self._order = [pattern[i % 4] for i in range(2 * self.slots)]
        self._times = {first: [], other: []}
        self._slot = [0.0, 0.0]
        self._use(self._order[0])

    def _trial_step(self, seconds: float, units: float, now: float) -> str | None:
        self._slot[0] += seconds
        self._slot[1] += units
        if self._slot[0] < self.slot_seconds:
            return None
        self._times[self._order.pop(0)].append(self._slot[0] / self._slot[1])
        self._slot = [0.0, 0.0]
        if self._order:
            self._use(self._order[0])
            return None
        return self._decide(now)

    def _decide(self, now: float) -> str | None:
        was = self.previous
        rate = {n: statistics.median(t) for n, t in self._times.items()}
        other = next(n for n in rate if n != was)
        best = other if rate[other] < rate[was] * (1 - self.margin) else was
        self._use(best)
        self.baseline, self.last_check, self.next_check = rate[best], now, now + self.recheck_every
        self._recent = []
        if best == was:
            return None
        self.changes += 1
        faster = rate[was] / rate[best]
        why = "the cores are busy with other work" if best < was else "the cores are free again"
        return (f"torch threads {was} -> {best}: steps ran {faster:.1f}x faster with {best} than with {was} "
                f"({why}; checked again every {self.recheck_every / 60:g} min; --threads N fixes the number)")

    def _use(self, n: int) -> None:
        if n != self._get():
            self._set(n)
        self.threads = n


def thread_tuner(configured: int | None, device: torch.device, distributed: bool, now: float) -> ThreadTuner | None:
    """The trainer's tuner: ``None`` when the count is fixed (``configured`` is then put in force), on an
    accelerator, under ``torchrun`` (processes share the cores by design) or with one core."""
    if configured is not None and torch.get_num_threads() != configured:
        torch.set_num_threads(configured)
    if fixed_threads(configured) is not None or device.type != "cpu" or distributed:
        return None
    most = torch.get_num_threads()
    return ThreadTuner(most, now=now) if most > 1 else None


def follow_machine(trainer, logs: dict) -> dict[str, int]:
    """Feed the step just trained to ``trainer.tuner``; a change is logged and written to ``metrics.jsonl``.
    Returns the progress bar's field (``{"threads": n}``; empty without a tuner)."""
    tuner = trainer.tuner
    if tuner is None:
        return {}
    line = tuner.record(logs["seconds"], logs["count"], trainer.state.elapsed)
    if line is not None:
        log.info("%s", line)
        trainer.metrics.write({"event": "threads", "global_step": trainer.state.global_step, "threads": tuner.threads,
                               "was": tuner.previous, "why": line, "time": round(trainer.state.elapsed, 3)})
    return {"threads": tuner.threads}
