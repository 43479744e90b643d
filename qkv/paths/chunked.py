"""Attention with score and mask modifiers on the CPU, a block of the scores at a time, with or without the weights.

The reference path builds the whole ``(B, H, Tq, Tk)`` scores and passes over them five or six times (matmul,
score modifier, mask modifier on broadcast indices, masked softmax, weighted sum): each pass a trip through main
memory. Here the same stages run on blocks of the scores small enough to stay in the CPU's caches
(:data:`BLOCK_ELEMENTS` scores: one batch row, a few heads, and all the query rows unless a head is larger), so only
the weights that are returned ever reach main memory. With gradients, each block is recomputed in the backward pass
(activation checkpointing): memory holds the inputs and the output, never the ``(Tq, Tk)`` scores, unless the
weights themselves are asked for.

The modifiers come wrapped by :mod:`qkv.flex` (shifted by ``q_offset`` and checked); this module only knows
callables ``score_fn(scores, b, h, q_idx, kv_idx)`` and ``mask_fn(b, h, q_idx, kv_idx)`` on broadcast indices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..normalize import softmax
from .common import masked_normalize, work_dtype

__all__ = ["chunked", "BLOCK_ELEMENTS"]

#: scores per block (4 MiB in float32: a block's passes stay in a CPU's L2/L3 caches)
BLOCK_ELEMENTS = 1 << 20
#: query rows per block at least (fewer would make the two matrix products of a block too thin to run fast)
MIN_ROWS = 128


def _pick(t: Tensor | None, bi: int, h0: int, h1: int, i0: int, i1: int) -> Tensor | None:
    """The block ``[bi, h0:h1, i0:i1, :]`` of a 4-D tensor broadcastable to the scores (size-1 axes kept)."""
    if t is None:
        return None
    b = slice(bi, bi + 1) if t.shape[0] > 1 else slice(None)
    h = slice(h0, h1) if t.shape[1] > 1 else slice(None)
    r = slice(i0, i1) if t.shape[2] > 1 else slice(None)
    return t[b, h, r]


def chunked(q: Tensor, k: Tensor, v: Tensor, factor: float, score_fn: Callable | None, mask_fn: Callable | None,
            keep: Tensor | None, bias: Tensor | None, dropout: float, return_weights: bool, out_dtype: torch.dtype,
            grad: bool):
    """``softmax(mods(factor * q k^T))`` (masked) ``@ v`` on 4-D ``q (B, H, Tq, D)``, ``k (B, H, Tk, D)``,
    ``v (B, H, Tk, Dv)`` (batch and head axes broadcast); ``keep``/``bias`` 4-D, broadcastable to the scores.
    ``grad``: a backward pass may follow (blocks are checkpointed). Returns the output, and the weights when
    ``return_weights``.

    A block is one batch row, some heads and some query rows (all of them unless one head's scores exceed
    :data:`BLOCK_ELEMENTS`), so that its matrix products stay wide."""
    work = work_dtype(q)
    b, h = max(q.shape[0], k.shape[0], v.shape[0]), max(q.shape[1], k.shape[1], v.shape[1])
    tq, tk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    rows = min(tq, max(MIN_ROWS, BLOCK_ELEMENTS // max(1, tk)))
    heads = max(1, min(h, BLOCK_ELEMENTS // max(1, rows * tk)))
    qs = (q.to(work) * factor).expand(b, h, tq, q.shape[-1])
    kt = k.to(work).expand(b, h, tk, k.shape[-1]).transpose(-2, -1)
    vw = v.to(out_dtype).expand(b, h, tk, dv)
    dev = q.device
    ki = torch.arange(tk, device=dev).view(1, 1, 1, tk)

    def block(bi: int, h0: int, h1: int, i0: int, i1: int, qc: Tensor, kc: Tensor, vc: Tensor
              ) -> tuple[Tensor, Tensor]:
        s = qc @ kc
        bix = torch.full((1, 1, 1, 1), bi, device=dev)
        hix = torch.arange(h0, h1, device=dev).view(1, h1 - h0, 1, 1)
        qix = torch.arange(i0, i1, device=dev).view(1, 1, i1 - i0, 1)
        fresh = s
        if score_fn is not None:
            s = score_fn(s, bix, hix, qix, ki)
        m = _pick(keep, bi, h0, h1, i0, i1)
        if mask_fn is not None:
            mm = mask_fn(bix, hix, qix, ki)
            m = mm if m is None else m & mm
        own = s is fresh or (s.shape == fresh.shape and s._base is None)
        w = masked_normalize(s, m, _pick(bias, bi, h0, h1, i0, i1), softmax, inplace=own).to(out_dtype)
        w = w.expand(1, h1 - h0, i1 - i0, tk)
        used = F.dropout(w, dropout) if dropout > 0 else w
        return used @ vc, w

    spans = [(bi, h0, min(h0 + heads, h), i0, min(i0 + rows, tq))
             for bi in range(b) for h0 in range(0, h, heads) for i0 in range(0, tq, rows)]
    if grad:
        outs, ws = {}, {}
        for bi, h0, h1, i0, i1 in spans:
            o, w = checkpoint(block, bi, h0, h1, i0, i1, qs[bi:bi + 1, h0:h1, i0:i1], kt[bi:bi + 1, h0:h1],
                              vw[bi:bi + 1, h0:h1], use_reentrant=False)
            outs[bi, h0, i0], ws[bi, h0, i0] = o, w

        def join(parts: dict) -> Tensor:
            return torch.cat([torch.cat([torch.cat([parts[bi, h0, i0] for i0 in range(0, tq, rows)], dim=-2)
                                         for h0 in range(0, h, heads)], dim=1) for bi in range(b)], dim=0)

        out = join(outs)
        return (out, join(ws)) if return_weights else out
    out = q.new_empty(b, h, tq, dv, dtype=out_dtype)
    weights = q.new_empty(b, h, tq, tk, dtype=out_dtype) if return_weights else None
    for bi, h0, h1, i0, i1 in spans:
        o, w = block(bi, h0, h1, i0, i1, qs[bi:bi + 1, h0:h1, i0:i1], kt[bi:bi + 1, h0:h1], vw[bi:bi + 1, h0:h1])
        out[bi:bi + 1, h0:h1, i0:i1] = o
        if return_weights:
            weights[bi:bi + 1, h0:h1, i0:i1] = w
    return (out, weights) if return_weights else out
