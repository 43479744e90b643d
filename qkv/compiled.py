"""Kernels compiled by ``torch.compile`` (inductor), with one switch and one fallback for all of them.

qkv compiles two kinds of kernels: FlexAttention for score and mask modifiers (:mod:`qkv.flex`) and the fused
tile of the additive and MLP scores (:mod:`qkv.scores`). Each is compiled on first use and cached by
``torch.compile`` (one compilation per signature). When compiling fails (no C++ compiler, an unsupported device or
dtype) the eager code runs instead, and the reason is logged once; ``QKV_NO_COMPILE=1`` turns compilation off.
Inside a caller's ``torch.compile`` the plain functions are returned: the caller's compilation covers them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

__all__ = ["available", "kernel", "failed", "reason"]

_kernels: dict[Callable, Callable] = {}
_broken: str | None = None


def available(device: torch.device | str = "cpu") -> bool:
    """Whether compiled kernels may be used on ``device`` (not after a failure, not with ``QKV_NO_COMPILE``)."""
    if _broken is not None or os.environ.get("QKV_NO_COMPILE"):
        return False
    return torch.device(device).type in ("cpu", "cuda")


def reason() -> str | None:
    """Why compiled kernels are off, if a compilation failed."""
    return _broken


def kernel(fn: Callable, **options) -> Callable:
    """``torch.compile(fn, **options)``, made once; ``fn`` itself when already inside a compilation."""
    if torch.compiler.is_compiling():
        return fn
    if fn not in _kernels:
        _kernels[fn] = torch.compile(fn, **options)
    return _kernels[fn]


def failed(error: BaseException, what: str) -> None:
    """Turn compiled kernels off after ``error`` (logged once, naming ``what`` falls back)."""
    global _broken
    if torch.compiler.is_compiling():
        raise error
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    _broken = f"{type(error).__name__}: {first}"
    logger.warning("qkv: compiled kernels are off (%s); %s uses the eager code", _broken, what)


class recompiles:
    """Allow more recompilations than dynamo's default (qkv compiles once per shape and modifier)."""

    def __enter__(self):
        import torch._dynamo

        cfg = torch._dynamo.config
        self.name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        self.before = getattr(cfg, self.name)
        setattr(cfg, self.name, max(self.before, 256))

    def __exit__(self, *exc):
        import torch._dynamo

        setattr(torch._dynamo.config, self.name, self.before)
        return False
