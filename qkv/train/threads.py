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

Long predictions and evaluations follow the machine the same way: :func:`follow_threads` passes a loop's batches
through and feeds each batch's time to a tuner (none when the count is fixed, on an accelerator, with one core, inside
a training or inside another such loop), and puts the count it found back when the loop ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

import torch

__all__ = ["ThreadTuner", "fixed_threads", "thread_tuner", "follow_machine", "threads_held", "loop_tuner",
           "follow_threads", "batch_starts", "LOOP_TUNER", "TRIAL_NEEDS"]

log = logging.getLogger("qkv.train.trainer")
apps_log = logging.getLogger("qkv.apps")  # the changes of the loops of predictions and evaluations

T = TypeVar("T")

#: the tuner of a loop over batches (:func:`follow_threads`): the first trial after 2 s of batches and past two
#: batches of warm-up, with 2 slots a count (A B B A: a steady drift of the batches' cost, such as length-sorted
#: batches growing longer, favours neither count)
LOOP_TUNER: dict[str, Any] = {"start_after": 2.0, "skip": 2, "slots": 2, "work": "batches"}
#: a trial starts only while the batches left are expected to take at least this many seconds (their number times
#: the mean time of a batch so far): a loop of a few seconds never runs a slot with the other count
TRIAL_NEEDS = 10.0

_held = 0  # the blocks of threads_held now running: while any runs, follow_threads changes nothing


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
        work: what a recorded unit of time is, in the line of a change (``"steps"``, ``"batches"``).
    """

    def __init__(self, most: int, *, now: float = 0.0, start_after: float = 0.0, skip: int = 2,
                 recheck_every: float = 120.0, slot_seconds: float = 0.5, slots: int = 3, margin: float = 0.1,
                 slower: float = 1.5, min_gap: float = 30.0,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 get_threads: Callable[[], int] = torch.get_num_threads, work: str = "steps"):
        if most < 1 or slots < 1:
            raise ValueError(f"most and slots must be >= 1, got most={most}, slots={slots}")
        self.most, self.start_after, self.recheck_every = most, start_after, recheck_every
        self.slot_seconds, self.slots, self.margin = slot_seconds, slots, margin
        self.slower, self.min_gap, self.work = slower, min_gap, work
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
        return (f"torch threads {was} -> {best}: {self.work} ran {faster:.1f}x faster with {best} than with {was} "
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


@contextlib.contextmanager
def threads_held(n: int | None = None) -> Iterator[None]:
    """Inside the block the thread count is its caller's, and :func:`follow_threads` changes nothing: ``n`` threads
    when given (put in force, and the count before put back at the end: ``qkv --threads N``), else whatever the
    caller chooses (a training with its own tuner, a loop that already follows the machine)."""
    global _held
    before = torch.get_num_threads()
    if n is not None and before != n:
        torch.set_num_threads(n)
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if n is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


def loop_tuner(configured: int | None = None, device: torch.device | str | None = None) -> ThreadTuner | None:
    """The tuner of a loop over batches (:data:`LOOP_TUNER`): ``None`` when the count is fixed (``configured``,
    ``OMP_NUM_THREADS``, inside :func:`threads_held`), when the work runs on an accelerator (``device``; ``None``
    is the CPU) or with one thread."""
    if _held or fixed_threads(configured) is not None or (device is not None and torch.device(device).type != "cpu"):
        return None
    most = torch.get_num_threads()
    return ThreadTuner(most, **LOOP_TUNER) if most > 1 else None


def follow_threads(batches: Iterable[T], units: Callable[[T], float] = len, *,
                   device: torch.device | str | None = None, configured: int | None = None,
                   tuner: ThreadTuner | None = None, clock: Callable[[], float] = time.perf_counter,
                   logger: logging.Logger = apps_log) -> Iterator[T]:
    """The items of ``batches``, unchanged and in order, while torch's thread count follows the machine.

    The time of an item is the consumer's (from its yield to the next resume); with its ``units`` (counted after
    that work: the batch's size, its tokens; ``0`` counts as 1) it is fed to ``tuner`` (by default
    :func:`loop_tuner` of ``configured`` and ``device``), and each change it makes is logged once on ``logger``,
    at INFO. A trial starts only while enough work is left (:data:`TRIAL_NEEDS`; any amount when ``batches`` has
    no length). Without a tuner the items pass through (inside :func:`threads_held` of ``configured``). The loop
    holds the count while it runs (a loop inside it follows nothing), and the count in force before it is put back
    when it ends, stops early or is closed, as the trainer puts it back after a training: the next loop starts from
    it and measures again. ``clock`` is the time in seconds (fakes in tests).
    """
    if tuner is None:
        tuner = loop_tuner(configured, device)
    if tuner is None:
        with threads_held(configured):
            yield from batches
        return
    total = len(batches) if isinstance(batches, Sized) else None
    before, done, spent = tuner.threads, 0, 0.0
    with threads_held():
        start = clock()
        try:
            for batch in batches:
                began = clock()
                yield batch
                ended = clock()
                done, spent = done + 1, spent + (ended - began)
                if tuner.trying or total is None or (total - done) * spent / done >= TRIAL_NEEDS:
                    line = tuner.record(ended - began, units(batch), ended - start)
                    if line is not None:
                        logger.info("%s", line)
        finally:
            tuner._use(before)


def batch_starts(n: int, batch_size: int, *, device: torch.device | str | None = None) -> Iterator[int]:
    """The first index of each batch of at most ``batch_size`` of ``n`` items, through :func:`follow_threads` (a
    batch's units: its size)."""
    return follow_threads(range(0, n, batch_size), lambda start: min(batch_size, n - start), device=device)
