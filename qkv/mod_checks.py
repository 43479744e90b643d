"""The checks of a user's score and mask modifiers (:mod:`qkv.mods`): run once on a few index tensors before
anything is compiled, so that an error of theirs is a ``ValueError`` naming them (what they got and what they must
return), never a compilation failure; and the same checks around every call of the reference path."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from .mods import is_builtin

__all__ = ["call_score_mod", "call_mask_mod", "user_mods", "check_mods", "mod_name"]

_checked: weakref.WeakSet = weakref.WeakSet()  # user modifiers whose output was checked


def mod_name(mod: Callable) -> str:
    """How an error names a modifier: its qualified name, else its type."""
    return getattr(mod, "__qualname__", None) or getattr(mod, "__name__", None) or type(mod).__name__


def _indexes(b: int, h: int, tq: int, tk: int) -> str:
    return f"b {(b, 1, 1, 1)}, h {(1, h, 1, 1)}, q_idx {(1, 1, tq, 1)}, kv_idx {(1, 1, 1, tk)}"


def call_score_mod(user: Callable, smod: Callable, s4: Tensor, bi, hi, qi, ki) -> Tensor:
    """``smod`` (the user's ``score_mod``, shifted) on the scores; ``ValueError`` naming it if it fails or returns
    anything but floating scores of the same shape."""
    try:
        out = smod(s4, bi, hi, qi, ki)
    except Exception as e:  # noqa: BLE001 - the user's function: say whose error it is
        raise ValueError(f"score_mod {mod_name(user)} failed on scores {tuple(s4.shape)} and index tensors "
                         f"{_indexes(bi.shape[0], hi.shape[1], qi.shape[2], ki.shape[3])}: "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(out, Tensor) or not out.dtype.is_floating_point or out.shape != s4.shape:
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"score_mod {mod_name(user)} returned {got} for scores {s4.dtype} {tuple(s4.shape)}; it must "
                         "keep the scores' shape and return floating scores")
    return out


def call_mask_mod(user: Callable, mmod: Callable, bi, hi, qi, ki, shape) -> Tensor:
    """``mmod`` (the user's ``mask_mod``, shifted) on the index tensors; ``ValueError`` naming it if it fails or does
    not return a boolean tensor that broadcasts to ``shape``."""
    try:
        out = mmod(bi, hi, qi, ki)
    except Exception as e:  # noqa: BLE001 - the user's function: say whose error it is
        raise ValueError(f"mask_mod {mod_name(user)} failed on index tensors "
                         f"{_indexes(bi.shape[0], hi.shape[1], qi.shape[2], ki.shape[3])}: "
                         f"{type(e).__name__}: {e}") from e
    ok = isinstance(out, Tensor) and out.dtype == torch.bool and out.dim() <= 4
    if ok:
        try:
            ok = torch.broadcast_shapes(out.shape, shape) == tuple(shape)
        except RuntimeError:
            ok = False
    if not ok:
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"mask_mod {mod_name(user)} returned {got} for index tensors "
                         f"{_indexes(bi.shape[0], hi.shape[1], qi.shape[2], ki.shape[3])}; it must return a "
                         f"boolean tensor (True = may attend) that broadcasts to {tuple(shape)}")
    return out


def user_mods(*mods: Callable | None) -> list[Callable]:
    """The modifiers that are not qkv's own."""
    return [m for m in mods if m is not None and not is_builtin(m)]


def check_mods(score_mod, smod, mask_mod, mmod, b: int, h: int, tq: int, tk: int, query: Tensor) -> None:
    """Run the user's modifiers once on the corners of the reference path's index tensors (the first and the last
    index of each axis) before they are compiled: an error of theirs is a ``ValueError`` naming them, never a
    compilation failure."""
    todo = [m for m in user_mods(score_mod, mask_mod) if m not in _checked]
    if not todo:
        return

    def corners(n: int, axis: int) -> Tensor:  # the first and the last index of an axis
        idx = sorted({0, max(n - 1, 0)})
        shape = [1, 1, 1, 1]
        shape[axis] = len(idx)
        return torch.tensor(idx, device=query.device).view(shape)

    bi, hi, qi, ki = corners(b, 0), corners(h, 1), corners(tq, 2), corners(tk, 3)
    nb, nh, nq, nk = bi.shape[0], hi.shape[1], qi.shape[2], ki.shape[3]
    with torch.no_grad():
        if score_mod is not None and score_mod in todo:
            call_score_mod(score_mod, smod, torch.zeros(nb, nh, nq, nk, dtype=query.dtype, device=query.device),
                            bi, hi, qi, ki)
        if mask_mod is not None and mask_mod in todo:
            call_mask_mod(mask_mod, mmod, bi, hi, qi, ki, (nb, nh, nq, nk))
    for m in todo:
        with contextlib.suppress(TypeError):  # not weakly referable: checked again next time
            _checked.add(m)
