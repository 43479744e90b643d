"""qkv's background thread for compilations (:mod:`qkv.compiled`): what tells apart the arguments a compiled kernel
runs without compiling again, copies of a call's arguments for the compilation to run on, and the thread itself.

A compilation saves the random number generators' states when it starts tracing and sets them back when it ends
(dynamo and inductor do, so that tracing draws nothing); dynamo does the same with the default dtype and the
deterministic-algorithms switch. These are the process's, not a thread's: set back from this thread, they would
undo what the caller's threads did meanwhile (the same dropout masks twice, a model initialised after
``torch.manual_seed`` with other weights than the seed gives, a default dtype changed back). While the thread runs,
those setters called from it leave the process as it is (:func:`_keep_process_state`)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch

__all__ = ["layout", "copies", "start", "wait", "compiling"]


def layout(args: tuple, kwargs: dict, options: dict) -> tuple:
    """What decides whether a compiled kernel runs these arguments without compiling again: per tensor its dtype,
    device, strides' order and its sizes (for a kernel compiled for any size, only which sizes are 0 or 1 and which
    are equal, as dynamo's guards see them), whether it needs gradients and which tensors share memory; other
    arguments as they are (a function by its code)."""
    dynamic = options.get("dynamic", False)
    sizes: dict[int, int] = {}
    storages: dict[int, int] = {}
    out = []
    for name, a in [(None, a) for a in args] + sorted(kwargs.items(), key=lambda kv: kv[0]):
        if isinstance(a, torch.Tensor):
            shape = tuple(s if s < 2 or not dynamic else -sizes.setdefault(s, len(sizes) + 2) for s in a.shape)
            ptr = a.untyped_storage().data_ptr() if a.device.type != "meta" else id(a)
            out.append((name, a.dtype, a.device.type, shape, a.stride() if not dynamic else a.is_contiguous(),
                        a.requires_grad, storages.setdefault(ptr, len(storages))))
        elif callable(a) and not isinstance(a, type):
            out.append((name, getattr(a, "__code__", type(a))))
        elif isinstance(a, (int, float, str, bool, type(None), torch.dtype)):
            out.append((name, a))
        else:
            out.append((name, type(a).__name__, tuple(getattr(a, "shape", ()))))
    return (torch.is_grad_enabled(), *out)


def copies(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every tensor a copy of the same strides, offsets and sharing: the same tensor twice is one
    copy; tensors of one dtype that share a storage are views (``as_strided``) of one copy of it, as a compiler sees
    views of one base (a tensor made by ``set_`` on a shared storage failed to compile with dynamic shapes)."""
    made: dict[int, torch.Tensor] = {}
    bases: dict[tuple, torch.Tensor] = {}

    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) in made:
            return made[id(t)]
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.dtype)
        base = bases.get(key)
        if base is None:
            n = storage.nbytes() // t.element_size()
            whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (n,), (1,))
            base = bases[key] = whole.clone()
        c = base.as_strided(t.shape, t.stride(), t.storage_offset())
        made[id(t)] = c = c.requires_grad_(t.requires_grad) if t.requires_grad else c
        return c

    with torch.no_grad():
        return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


_queue: list = []
_worker: list = [None]
_idle = threading.Condition()
_busy: list = [False]  # whether the background thread runs a job (a compilation) now


def compiling() -> bool:
    """``torch.compiler.is_compiling()`` as this thread sees it: whether this code is traced by ``torch.compile`` or
    ``torch.export``. Torch's flag is one for the process, set for the whole of a compilation: while the background
    thread compiles, the calls of other threads would read it as theirs (and take the paths meant for a trace)."""
    return torch.compiler.is_compiling() and _here()


@torch.compiler.assume_constant_result  # (run when traced, not traced into: a constant of the trace)
def _here() -> bool:
    if not _busy[0] or torch.compiler.is_exporting():
        return True
    from torch._guards import TracingContext

    return TracingContext.try_get() is not None  # (per thread: set in the thread that traces)


def _loop() -> None:
    while True:
        with _idle:
            while not _queue:
                _idle.wait()
            job = _queue[0]
        _busy[0] = True
        try:
            job()
        finally:
            _busy[0] = False
        with _idle:
            _queue.pop(0)
            _idle.notify_all()


#: what a compilation sets back when it ends, by module: the generators' states (``torch.random``'s for the CPU,
#: ``torch.cuda``'s and ``torch.xpu``'s for the devices), the default dtype, the deterministic-algorithms switch
_SETTERS = (("random", "set_rng_state"), ("cuda", "set_rng_state"), ("xpu", "set_rng_state"),
            (None, "set_default_dtype"), (None, "use_deterministic_algorithms"))


def _keep_process_state() -> None:
    """Have the setters of :data:`_SETTERS` do nothing when qkv's background thread calls them: a compilation there
    sets back what it read when it started, which would undo what every other thread did since. Other threads'
    calls, a compilation in the calling thread among them, set as before. Done once."""
    for module_name, name in _SETTERS:
        module = torch if module_name is None else getattr(torch, module_name, None)
        real = getattr(module, name, None)
        if real is None or getattr(real, "_qkv_keeps_process_state", False):
            continue

        @functools.wraps(real)
        def guarded(*args, _real=real, **kwargs):
            if threading.current_thread() is _worker[0]:
                return None  # (a background compilation changed none of these: what it would set back is stale)
            return _real(*args, **kwargs)

        guarded._qkv_keeps_process_state = True
        setattr(module, name, guarded)


def start(job: Callable[[], None]) -> None:
    """Run ``job`` on qkv's background thread (one, made on first use; replaced by an inline call in tests)."""
    with _idle:
        _queue.append(job)
        if _worker[0] is None or not _worker[0].is_alive():
            _keep_process_state()
            _worker[0] = threading.Thread(target=_loop, name="qkv-compile", daemon=True)
            _worker[0].start()
        _idle.notify_all()


def wait(timeout: float | None = None) -> bool:
    """Wait until the background compilations started so far are done (for tests and benchmarks; no call of qkv
    waits for them). Returns whether they are."""
    with _idle:
        return _idle.wait_for(lambda: not _queue, timeout)
