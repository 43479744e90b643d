"""Kernels compiled by ``torch.compile`` (inductor): when they are compiled, where their cache lives, one switch
and one fallback for all of them.

qkv compiles kernels where they pay: FlexAttention for score and mask modifiers (:mod:`qkv.flex`), the block
function of the modifiers on the CPU (weights and training, forward and backward: :mod:`qkv.paths.chunked`) and the
fused tile of the additive and MLP scores (:mod:`qkv.tiling`). Each is a :class:`Kernel`, and every call site runs
it the same way, :meth:`Kernel.run` (the compiled kernel when it is ready for the call, else the eager code). A
compilation costs seconds (tens of seconds on a small CPU the first time on a machine):

- ``auto`` (the default): no call waits for a compilation. A kernel's calls run the eager code, timed per
  *signature* (the kernel, its device and dtype, and the shapes where it is compiled for fixed shapes); once
  more than :data:`MIN_CALLS` calls of one signature were made and their eager time reached
  :data:`BACKGROUND_SHARE` of the expected compile time (``eager seconds * saving >= share * expected seconds``),
  the kernel is compiled on a
  background thread while the eager calls go on, and used from the first call after it is ready. A single call, a
  test, a short script of small calls never compile. The expected compile time is what this machine took before
  (recorded beside the cache: a cache load after the first time), else :attr:`Kernel.cold_seconds`.
- ``1``: compile on first use, in the calling thread (what ``torch.compile`` users expect);
- ``0``: never compile; the eager code runs.

Set it with ``QKV_COMPILE=0|1|auto`` in the environment (checked when qkv is imported: any other value is a
``ValueError`` naming it) or :func:`set_compile` in Python (which wins). ``QKV_NO_COMPILE=1`` is an older spelling of
``QKV_COMPILE=0`` (``QKV_NO_COMPILE=0`` leaves compilation allowed).

Inductor's cache is kept across processes in ``~/.cache/qkv/inductor`` (``$XDG_CACHE_HOME/qkv/inductor``, or
``$QKV_CACHE_DIR/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` names another folder (inductor's own default is
a temporary folder, emptied at reboot): a second process loads a kernel in a few seconds instead of compiling it.
:func:`cache_dir` says where it is, :func:`clear_cache` empties it. One log line says when a kernel starts
compiling, one when it is in use.

When compiling fails (no C++ compiler, an unsupported device or dtype) the eager code runs instead and the reason
is logged once. Inside a caller's ``torch.compile`` the plain functions are used: the caller's compilation covers
them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .background import compiling
from .background import copies as _copies
from .background import layout as _layout
from .background import start as _start
from .background import wait as wait_background
from .compile_cache import cache_dir, clear_cache
from .compile_cache import read_record as _read_record
from .compile_cache import use_cache_dir as _use_cache_dir
from .compile_cache import write_record as _write_record

logger = logging.getLogger(__name__)

__all__ = ["Kernel", "available", "mode", "set_compile", "cache_dir", "clear_cache", "failed", "reason",
           "MIN_CALLS", "BACKGROUND_SHARE", "wait_background"]

#: calls of one signature that run eager before ``auto`` may start compiling it (a few calls never do)
MIN_CALLS = 3
#: the share of the expected compile time that one signature's eager calls must have saved-to-be before ``auto``
#: compiles it in the background (the compilation then costs no call any waiting, only CPU time beside them)
BACKGROUND_SHARE = 0.1
_MODES = {"0": "0", "1": "1", "auto": "auto", "false": "0", "true": "1", "off": "0", "on": "1", "no": "0",
          "yes": "1"}

#: the clock the ``auto`` rule reads (replaced by a fake one in tests)
clock: Callable[[], float] = time.perf_counter

_override: str | None = None
_broken: str | None = None
_lock = threading.Lock()


def _parse(value, what: str) -> str:
    key = str(int(value) if isinstance(value, bool) else value).strip().lower()
    if key not in _MODES:
        raise ValueError(f"{what} must be 0, 1 or auto, got {value!r}")
    return _MODES[key]


def set_compile(value: bool | str | None) -> None:
    """Compile qkv's kernels: ``True``/``"1"`` on first use, ``False``/``"0"`` never, ``"auto"`` once they pay;
    ``None`` goes back to the environment (``QKV_COMPILE``, default ``auto``)."""
    global _override
    _override = None if value is None else _parse(value, "set_compile")


def mode() -> str:
    """``"0"``, ``"1"`` or ``"auto"``: :func:`set_compile`'s, else ``QKV_COMPILE``'s, else ``QKV_NO_COMPILE``'s
    (``1`` means ``0``; ``0`` or empty means ``auto``), else ``auto``."""
    if _override is not None:
        return _override
    env = os.environ.get("QKV_COMPILE", "")
    old = os.environ.get("QKV_NO_COMPILE", "")
    if (env, old) == _read_env[0]:  # (read on every call: parsing it again cost more than a GPU kernel launch)
        return _read_env[1]
    found = _mode_of(env.strip(), old.strip())
    _read_env[:] = [(env, old), found]
    return found


_read_env: list = [None, None]  # [(QKV_COMPILE, QKV_NO_COMPILE) as last read, the mode they give]


def _mode_of(env: str, old: str) -> str:
    if env:
        return _parse(env, "QKV_COMPILE")
    if old:
        try:
            no = _parse(old, "QKV_NO_COMPILE")
        except ValueError:
            raise ValueError(f"QKV_NO_COMPILE must be 0 or 1, got {old!r} (or use QKV_COMPILE=0|1|auto)") from None
        if no == "auto":
            raise ValueError(f"QKV_NO_COMPILE must be 0 or 1, got {old!r} (or use QKV_COMPILE=0|1|auto)")
        return "0" if no == "1" else "auto"
    return "auto"


def available(device: torch.device | str = "cpu") -> bool:
    """Whether compiled kernels may be used on ``device`` (not after a failure, not when switched off)."""
    if _broken is not None or mode() == "0":
        return False
    return (device if isinstance(device, torch.device) else torch.device(device)).type in ("cpu", "cuda")


def reason() -> str | None:
    """Why compiled kernels are off, if a compilation failed."""
    return _broken


# ------------------------------------------------------------------------------------------ one kernel


@dataclass
class _Count:
    calls: int = 0
    eager_seconds: float = 0.0
    compiled: bool = False  # ready for this signature (for some arguments' layout: ``ready`` says which)
    expected: float | None = None  # the compile time expected, read once from the record
    pending: list = field(default_factory=list)  # (start, end) CUDA events of eager runs the GPU has not finished
    ready: set = field(default_factory=set)  # the layouts of arguments compiled for (see :func:`_layout`)
    queued: set = field(default_factory=set)  # the layouts being compiled in the background
    failed: dict = field(default_factory=dict)  # layout -> the error its compilation raised (reported once)


def _event():
    """A CUDA event that times (replaced by a fake one in tests)."""
    return torch.cuda.Event(enable_timing=True)


def _harvest(count: _Count) -> None:
    """Add the eager runs whose CUDA events have completed to ``count`` (never waits for the GPU)."""
    while count.pending and count.pending[0][1].query():
        start, end = count.pending.pop(0)
        count.calls += 1
        count.eager_seconds += start.elapsed_time(end) / 1000.0


@dataclass
class Kernel:
    """One compiled kernel, the rule that decides when to compile it, and how a call runs it (:meth:`run`).

    Args:
        name: what the log calls it (``"the additive kernel"``).
        fn: the function ``torch.compile`` compiles.
        cold_seconds: the expected first compilation on a machine, until this machine has measured its own.
        saving: the fraction of the eager time the compiled kernel saves (the ``auto`` rule's rate).
        options: keyword arguments of ``torch.compile``.
    """

    name: str
    fn: Callable
    cold_seconds: float
    saving: float = 0.5
    options: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict, repr=False)
    _compiled: Callable | None = field(default=None, repr=False)

    def _key(self, device: torch.device) -> str:
        return f"{self.name}|{device.type}|torch {torch.__version__}"

    def _count(self, signature: Hashable) -> _Count:
        count = self.counts.get(signature)
        if count is None:
            count = self.counts[signature] = _Count()
        return count

    def expected_seconds(self, device: torch.device | str) -> float:
        """What compiling is expected to cost here: this machine's last time (a cache load after the first), else
        :attr:`cold_seconds`."""
        entry = _read_record().get(self._key(torch.device(device)), {})
        return float(entry.get("again", entry.get("first", self.cold_seconds)))

    def use(self, signature: Hashable, device: torch.device | str) -> bool:
        """Whether this call should run the compiled kernel: with ``QKV_COMPILE=1`` always (compiled on first use),
        in ``auto`` once it is ready for ``signature`` (never waiting). When not, the caller runs the eager code
        inside :meth:`eager`, which times it and starts the compilation once that pays."""
        if not available(device):
            return False
        if compiling():
            return True  # the caller's compilation covers the plain function
        count = self._count(signature)
        if mode() == "1":
            return True
        _harvest(count)
        if count.failed:
            self._report(count, None)
            return False
        return count.compiled

    def may_compile(self, signature: Hashable) -> bool:
        """Whether this kernel is, or may become, compiled for ``signature`` (compiled kernels are on and no
        compilation for it failed)."""
        count = self.counts.get(signature)
        return _broken is None and mode() != "0" and (count is None or not count.failed)

    def ready(self, signature: Hashable, args: tuple, kwargs: dict | None = None) -> bool:
        """Whether the compiled kernel runs these arguments without compiling again (``QKV_COMPILE=1``: always)."""
        if mode() == "1":
            return True
        count = self.counts.get(signature)
        return count is not None and _layout(args, kwargs or {}, self.options) in count.ready

    @contextmanager
    def eager(self, signature: Hashable, device: torch.device | str, example: Callable[[], tuple] | None = None):
        """Time the eager code run for ``signature`` (on the clock, or on CUDA between two events read by a later
        :meth:`use` once the GPU has passed them: no synchronisation); in ``auto``, once the rule says it pays, start
        compiling in the background on ``example()``, ``(args, kwargs)`` of one call of the kernel."""
        count = self._count(signature)
        if count.compiled or compiling() or mode() != "auto" or not available(device):
            yield
            return
        if torch.device(device).type == "cuda":
            start = _event()
            start.record()
            yield
            end = _event()
            end.record()
            count.pending.append((start, end))
        else:
            start = clock()
            yield
            count.calls += 1
            count.eager_seconds += clock() - start
        _harvest(count)
        if not count.queued and count.calls > MIN_CALLS:
            if count.expected is None:
                count.expected = self.expected_seconds(device)
            if count.eager_seconds * self.saving >= BACKGROUND_SHARE * count.expected:
                found = example() if example is not None else None
                if found is not None:
                    self._submit(signature, count, *found)

    def run(self, signature: Hashable, eager: Callable | None, *args, on_fail: Callable | None = None, **kwargs):
        """One call of the kernel: ``fn(*args, **kwargs)`` compiled when it is ready for these arguments, else
        ``eager(*args, **kwargs)`` (``fn`` itself when None), timed for the rule, the compilation started in the
        background once it pays (``auto``) or done now (``QKV_COMPILE=1``). A compilation that fails is reported
        once, to ``on_fail(error)`` (by default compiled kernels are turned off, :func:`failed`), and the eager code
        runs."""
        eager = self.fn if eager is None else eager
        if compiling():
            return self.fn(*args, **kwargs)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        if not self.use(signature, device):
            with self.eager(signature, device, lambda: (args, kwargs)):
                return eager(*args, **kwargs)
        count = self._count(signature)
        layout = _layout(args, kwargs, self.options)
        if layout in count.failed:
            self._report(count, on_fail)
            return eager(*args, **kwargs)
        if layout not in count.ready and mode() != "1":  # a new layout of a ready signature: compiled beside it
            if layout not in count.queued:
                self._submit(signature, count, args, kwargs, layout)
            return eager(*args, **kwargs)
        try:
            with recompiles():
                return self(signature, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - no compiler, unsupported dtype, a modifier it cannot trace...
            count.failed[layout] = e
            self._report(count, on_fail)
            return eager(*args, **kwargs)

    def _report(self, count: _Count, on_fail: Callable | None) -> None:
        """Say once that a compilation of this signature failed (the eager code runs from now on)."""
        todo = [e for e in count.failed.values() if e is not None]
        if todo:
            (on_fail or (lambda err: failed(err, self.name)))(todo[0])
            count.failed = dict.fromkeys(count.failed)

    def __call__(self, signature: Hashable, *args, **kwargs):
        """Run the compiled kernel (compiled now if it is not: timed, logged and recorded); inside a caller's
        compilation, the plain function."""
        if compiling():
            return self.fn(*args, **kwargs)
        count = self._count(signature)
        layout = _layout(args, kwargs, self.options)
        if count.compiled and layout in count.ready:
            return self._compiled(*args, **kwargs)
        with _lock:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            self._say(device, "")
            start = clock()
            out = self._compiled(*args, **kwargs)
            self._done(device, count, layout, clock() - start)
        return out

    def _say(self, device: torch.device, how: str) -> None:
        """Log the start of a compilation (a warning the first time on a machine) and have the compiled function."""
        _use_cache_dir()
        if self._key(device) not in _read_record():
            logger.warning("qkv: compiling %s%s (once per machine, about %.0f s; cached in %s; QKV_COMPILE=0 turns "
                           "compilation off)", self.name, how, self.expected_seconds(device), cache_dir())
        else:
            logger.info("qkv: compiling %s%s (from the cache in %s)", self.name, how, cache_dir())
        if self._compiled is None:
            self._compiled = _compile(self.fn, **self.options)

    def _done(self, device: torch.device, count: _Count, layout, seconds: float) -> None:
        if not count.ready:
            _write_record(self._key(device), seconds)
        count.ready.add(layout)
        count.queued.discard(layout)
        count.compiled = True

    def _submit(self, signature: Hashable, count: _Count, args: tuple, kwargs: dict, layout=None) -> None:
        """Compile for these arguments on the background thread (a copy of them: the caller's stay its own)."""
        layout = _layout(args, kwargs, self.options) if layout is None else layout
        count.queued.add(layout)
        # (dynamo and inductor imported here, once: imported by two threads at once, a module half-initialised by
        # one fails in the other)
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
        grad = torch.is_grad_enabled()
        args, kwargs = _copies(args, kwargs)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        first = not count.ready

        def job():
            try:
                with _lock:
                    if first:
                        self._say(device, " in the background (calls run the eager code meanwhile)")
                    elif self._compiled is None:
                        self._compiled = _compile(self.fn, **self.options)
                    start = clock()
                    with torch.set_grad_enabled(grad), recompiles():
                        self._compiled(*args, **kwargs)
                    self._done(device, count, layout, clock() - start)
                if first:
                    logger.info("qkv: %s is compiled (%.1f s) and in use", self.name, clock() - start)
            except Exception as e:  # noqa: BLE001 - reported once by the next call, which runs the eager code
                logger.debug("qkv: compiling %s failed: %s", self.name, e)
                count.failed[layout] = e
                count.queued.discard(layout)

        _start(job)


def _compile(fn: Callable, **options) -> Callable:
    """``torch.compile`` (replaced by a fake one in tests)."""
    return torch.compile(fn, **options)


def failed(error: BaseException, what: str) -> None:
    """Turn compiled kernels off after ``error`` (logged once, naming ``what`` falls back)."""
    global _broken
    if compiling():
        raise error
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    _broken = f"{type(error).__name__}: {first}"
    logger.warning("qkv: compiled kernels are off (%s); %s uses the eager code", _broken, what)


class recompiles:
    """Allow more recompilations than dynamo's default (qkv compiles once per shape and modifier): the limit is
    raised to at least 256 once, for the process (setting it around every call cost more CPU time than a GPU
    kernel)."""

    raised = False

    def __enter__(self):
        if not recompiles.raised:
            import torch._dynamo

            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, name, max(getattr(cfg, name), 256))
            recompiles.raised = True

    def __exit__(self, *exc):
        return False


mode()  # QKV_COMPILE checked once at import: a value qkv does not know is an error now, not at a first compilation
