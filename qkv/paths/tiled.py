"""The tiled path of the pairwise scores (additive, MLP): softmax attention over key tiles with a running maximum
and sum (the "online softmax" of Milakov & Gimelshein, 2018, https://arxiv.org/abs/1805.02867), so that neither the
``(..., Tq, Tk, hidden)`` pre-activations nor the ``(..., Tq, Tk)`` scores ever exist whole.

Taken by :func:`qkv.attention` in inference (no weights asked for, no gradient needed); the tiles come from
:meth:`qkv.scores.PairwiseScore.tiles` (:mod:`qkv.tiling`), compiled into one fused kernel where possible.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["online_softmax"]


def _slice(mask: Tensor, qi: slice, kj: slice) -> Tensor:
    """Slice the last two axes of a broadcastable mask, leaving size-1 axes alone."""
    rows = qi if mask.shape[-2] > 1 else slice(None)
    cols = kj if mask.shape[-1] > 1 else slice(None)
    return mask[..., rows, cols]


def online_softmax(sc, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor | None, bias: Tensor | None,
                   scale: float, key_prepared: bool) -> Tensor:
    """``softmax(scale * sc(query, key) + bias)`` (masked by ``allowed``) ``@ value`` -> ``(..., Tq, Dv)``, tile by
    tile; a query with no allowed key gets a zero output."""
    tq = query.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2],
                                   *([allowed.shape[:-2]] if allowed is not None else []),
                                   *([bias.shape[:-2]] if bias is not None else []))
    # float32 accumulators for float16/bfloat16, on every device: they are only (..., Tq, Dv)
    dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    acc = torch.zeros(*batch, tq, value.shape[-1], dtype=dtype, device=query.device)
    run_max = torch.full((*batch, tq, 1), float("-inf"), dtype=dtype, device=query.device)
    run_sum = torch.zeros((*batch, tq, 1), dtype=dtype, device=query.device)
    for qi, kj, s in sc.tiles(query, key, key_prepared=key_prepared):
        s = s.to(dtype)
        if scale != 1.0:
            s = s * scale
        if bias is not None:
            s = s + _slice(bias, qi, kj)
        if allowed is not None:
            s = s.masked_fill(~_slice(allowed, qi, kj), float("-inf"))
        m_old = run_max[..., qi, :]
        m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe)
        corr = torch.exp(m_old - m_safe)
        run_sum[..., qi, :] = run_sum[..., qi, :] * corr + p.sum(dim=-1, keepdim=True)
        acc[..., qi, :] = acc[..., qi, :] * corr + p @ value[..., kj, :].to(dtype)
        run_max[..., qi, :] = m_new
    out = torch.where(run_sum > 0, acc / run_sum.clamp(min=torch.finfo(dtype).tiny), torch.zeros_like(acc))
    return out.to(query.dtype)
