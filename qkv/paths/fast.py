"""The fast path: :func:`torch.nn.functional.scaled_dot_product_attention` on the dot form ``(q', k')`` of a score.

Taken by :func:`qkv.attention` for the dot-product family (dot, scaled_dot, cosine, general) with softmax when no
weights are asked for. SDPA's own masks give NaN for a query with no allowed key; here such a row attends to every
(finite) key and its output is then zeroed, on every backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sdpa", "sdpa_causal"]


def sdpa(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, dropout: float,
         scale: float) -> Tensor:
    """``q (..., Tq, D)``, ``k (..., Tk, D)``, ``v (..., Tk, Dv)`` -> ``(..., Tq, Dv)`` under ``allowed`` (boolean,
    True = may attend) and an additive ``bias``, both broadcastable to ``(..., Tq, Tk)``."""
    if bias is not None:
        bias = bias.to(q.dtype)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    rows = allowed.any(dim=-1, keepdim=True)
    safe = allowed | ~rows  # a fully masked row attends everywhere (to finite keys), then its output is zeroed
    attn_mask = safe if bias is None else bias.masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
    # (on GPUs the check would cost a sync; traced by torch.compile or torch.export, it would branch on values)
    if out.device.type == "cpu" and not torch.compiler.is_compiling() and bool(rows.all()):
        return out
    return torch.where(rows, out, 0.0)


def sdpa_causal(q: Tensor, k: Tensor, v: Tensor, dropout: float, scale: float) -> Tensor:
    """SDPA's own causal kernel (top-left aligned). Only for ``Tk <= Tq``, where every key is seen by some query, so
    that there is no key to zero and no row without a key."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
