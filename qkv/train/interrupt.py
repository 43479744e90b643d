"""Stopping a training by a signal: SIGINT (Ctrl-C) and SIGTERM (``kill``, ``timeout``, schedulers, ``torchrun``)
mean the same thing: finish the current step, write a checkpoint, and raise :class:`Interrupted`.

- :class:`StopFlag` (inside the training loop): the first signal sets a flag checked between steps; a second one
  raises :class:`Interrupted` at once.
- :func:`terminate_raises` (around the whole run): SIGTERM raises :class:`Interrupted` as SIGINT raises
  ``KeyboardInterrupt``, so that it is never a silent death.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["Interrupted", "StopFlag", "terminate_raises", "SIGNALS"]

log = logging.getLogger("qkv.train.trainer")

SIGNALS = tuple(s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None)) if s is not None)


class Interrupted(KeyboardInterrupt):
    """Training was stopped by signal ``signum``; ``exit_code`` is the shell's convention (130 SIGINT, 143 SIGTERM).

    A ``KeyboardInterrupt``, so that code catching Ctrl-C catches SIGTERM too.
    """

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _name(signum: int) -> str:
    return "interrupt" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"


def _install(handler) -> dict[int, object]:
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                previous[s] = signal.signal(s, handler)
    return previous


def _restore(previous: dict[int, object]) -> None:
    for s, h in previous.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(s, h if h is not None else signal.SIG_DFL)


class StopFlag:
    """Turns the first SIGINT or SIGTERM into a flag checked between steps (``set``, and ``signum`` says which); a
    second one raises :class:`Interrupted` at once. Signal handlers can only be set in the main thread: elsewhere
    it does nothing."""

    def __init__(self):
        self.set = False
        self.signum = int(signal.SIGINT)
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame):
        if self.set:
            raise Interrupted(signum)
        self.set, self.signum = True, int(signum)
        again = "press Ctrl-C again" if signum == signal.SIGINT else "send the signal again"
        log.warning("%s: stopping after this step and writing a checkpoint (%s to stop at once)", _name(signum),
                    again)

    def __enter__(self) -> StopFlag:
        self._previous = _install(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        _restore(self._previous)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Interrupted` (``exit_code`` 143) as SIGINT raises
    ``KeyboardInterrupt``; the previous handlers come back after it."""
    previous = {}
    if hasattr(signal, "SIGTERM") and threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            raise Interrupted(signum)

        with contextlib.suppress(ValueError, OSError):
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        _restore(previous)
