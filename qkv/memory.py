"""Process-wide CPU memory settings that make PyTorch's large temporaries cheap to allocate.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves a large block (above a threshold
that starts at 128 KiB and rises to at most 32 MiB) with a fresh ``mmap`` and gives it back to the kernel on
``free``; freed memory at the top of its heap is given back too. So every new large tensor starts as untouched
pages that fault in 4 KiB at a time when first written. In a loop that allocates the same shapes again and again
(a training step, attention weights ``(B, H, T, T)``), that is paid on every iteration: about 0.3 ms per MiB on
the machine of BENCHMARKS.md, ~80 ms of each ``qkv.attention(..., return_weights=True)`` at B=8, H=8, T=1024.

:func:`keep_freed_memory` tells glibc to serve large blocks from its heap and to keep freed memory there
for the next allocation, as a caching allocator (jemalloc, tcmalloc, PyTorch's CUDA allocator) does. The
cost: the process keeps its peak memory instead of returning it to the system. The ``qkv`` command calls it
before any of its commands (``qkv --release-memory ...`` does not); a library import never changes it. The
same without code: ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` in the environment, or
``LD_PRELOAD`` of jemalloc or tcmalloc.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_kept = False


@functools.cache
def _glibc():
    """glibc as a ``ctypes.CDLL``, or ``None`` on other C libraries and systems."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (no ldconfig subprocess, as find_library would run)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has mallopt but not this)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def keep_freed_memory() -> bool:
    """Keep freed CPU memory in the process for reuse (glibc only); returns whether the setting is in force.

    Affects allocations made after the call, in the whole process. Calling it again does nothing more.
    Returns ``False`` (and changes nothing) where the C library is not glibc, e.g. on macOS or musl.
    """
    global _kept
    if _kept:
        return True
    libc = _glibc()
    if libc is None:
        logger.info("keep_freed_memory: not glibc, malloc left as it is")
        return False
    # no mmap for large blocks (they come from the heap), and never shrink the heap on free
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, _INT_MAX) == 1
    _kept = ok
    return ok


def can_keep_freed_memory() -> bool:
    """Whether :func:`keep_freed_memory` can act here (the C library is glibc)."""
    return _glibc() is not None


def memory_is_kept() -> bool:
    """Whether :func:`keep_freed_memory` has put its setting in force in this process."""
    return _kept
