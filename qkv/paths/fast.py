"""The fast path: :func:`torch.nn.functional.scaled_dot_product_attention` on the dot form ``(q', k')`` of a score.

Taken by :func:`qkv.attention` for the dot-product family (dot, scaled_dot, cosine, general) with softmax when no
weights are asked for. SDPA's own masks give NaN for a query with no allowed key; here such a row attends to every
(finite) key and its output is then zeroed, on every backend. On GPUs, a key-padding mask needs no zeroing pass over
the output: the values of a fully padded row's keys were zeroed already (the one copy of ``key`` and ``value`` that
:func:`~qkv.paths.common.zero_unseen_keys` makes there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..background import compiling
from .common import derived, zero_of, zeroing_unseen_keys

__all__ = ["sdpa", "sdpa_causal"]


def sdpa(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, dropout: float,
         scale: float) -> Tensor:
    """``q (..., Tq, D)``, ``k (..., Tk, D)``, ``v (..., Tk, Dv)`` -> ``(..., Tq, Dv)`` under ``allowed`` (boolean,
    True = may attend) and an additive ``bias``, both broadcastable to ``(..., Tq, Tk)``."""
    if bias is not None:
        bias = bias.to(q.dtype)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    rows = allowed.any(dim=-1, keepdim=True) if allowed.device.type == "cpu" else derived(allowed, "rows", _rows)
    # a fully masked row attends everywhere (to finite keys), then is zeroed
    safe = derived(allowed, "safe", _safe) if allowed.device.type != "cpu" else allowed | ~rows
    attn_mask = safe if bias is None else bias.masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
    if out.device.type == "cpu":  # (traced by torch.compile or torch.export: no branch on the values)
        return out if not compiling() and bool(rows.all()) else torch.where(rows, out, 0.0)
    if bias is None and _values_zeroed(allowed, v):
        return out  # every key of a fully masked row was zeroed: its output (the mean of zero values) is zero
    return torch.where(rows, out, zero_of(out))  # (on GPUs, checking the rows would cost a sync)


def _rows(allowed: Tensor) -> Tensor:
    return allowed.any(dim=-1, keepdim=True)


def _safe(allowed: Tensor) -> Tensor:
    return allowed | ~derived(allowed, "rows", _rows)


def _values_zeroed(allowed: Tensor, v: Tensor) -> bool:
    """Whether, on a GPU, :func:`qkv.paths.common.zero_unseen_keys` zeroed the values of every key of a fully masked
    row: a key-padding mask (no query axis, so a row is fully masked exactly when none of its keys is seen) whose
    batch axes ``v`` has too (its values were not shared with rows that see them)."""
    if allowed.shape[-2] != 1 or allowed.dim() > v.dim() or not zeroing_unseen_keys():
        return False
    return all(a == 1 or a == b for a, b in zip(allowed.shape[:-2], v.shape[v.dim() - allowed.dim():-2], strict=True))


def sdpa_causal(q: Tensor, k: Tensor, v: Tensor, dropout: float, scale: float) -> Tensor:
    """SDPA's own causal kernel (top-left aligned). Only for ``Tk <= Tq``, where every key is seen by some query, so
    that there is no key to zero and no row without a key."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
