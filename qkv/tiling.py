"""How the pairwise scores (:class:`qkv.scores.PairwiseScore`: additive, MLP) are computed under a memory bound.

The textbook formula of a pairwise score materialises the ``(..., Tq, Tk, hidden)`` pre-activations. Here they are
computed in tiles of at most ``max_elements`` elements; when gradients are needed each tile is recomputed in the
backward pass instead of stored (activation checkpointing), so memory stays bounded in training too. Where
``torch.compile`` works, a large tile of a score whose rest is one elementwise layer and a dot product
(``sum_h w_h act(qp_h + kp_h) + b``: ``Additive``, a one-layer ``MLP``) is one fused kernel that never holds the
``(cq, ck, hidden)`` tile, forward or backward (:data:`FUSED_MIN_ELEMENTS`; :mod:`qkv.compiled`).

The functions take the score module (its ``query_proj``, ``key_proj``, ``hidden_dim``, ``max_elements``,
``pair`` and ``fused_form``); :class:`~qkv.scores.PairwiseScore`'s methods of the same names call them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from . import compiled

__all__ = ["DEFAULT_MAX_ELEMENTS", "FUSED_MIN_ELEMENTS", "ACTIVATIONS", "tile_sizes", "tiles", "tiled_scores"]

#: default tile bound of the pairwise scores: 2**24 elements of the ``(..., Tq, Tk, hidden)`` tensor per tile
#: (64 MiB in float32)
DEFAULT_MAX_ELEMENTS = 1 << 24
#: pairwise tiles of at least this many ``(query, key, hidden)`` elements use the compiled fused kernel (smaller
#: ones are cheaper eager than the first compilation)
FUSED_MIN_ELEMENTS = 1 << 20

#: elementwise activations the fused kernel knows, by module class name
ACTIVATIONS = {"Tanh": torch.tanh, "ReLU": torch.relu, "GELU": F.gelu, "SiLU": F.silu, "Sigmoid": torch.sigmoid}


def _pair_kernel(qp: Tensor, kp: Tensor, w: Tensor, b: Tensor | None, act: str) -> Tensor:
    """``sum_h w_h act(qp[..., i, h] + kp[..., j, h]) (+ b)``: ``(..., cq, H)``, ``(..., ck, H)`` -> ``(..., cq, ck)``.
    Compiled, the broadcast sum, the activation and the reduction are one loop: no ``(cq, ck, H)`` tensor."""
    s = (ACTIVATIONS[act](qp[..., :, None, :] + kp[..., None, :, :]) * w).sum(-1)
    return s if b is None else s + b


def tile_sizes(score, query: Tensor, key: Tensor) -> tuple[int, int]:
    """``(cq, ck)``: query and key rows per tile under ``score.max_elements`` (at least 1 each, even for empty
    axes)."""
    tq, tk = query.shape[-2], key.shape[-2]
    lead = math.prod(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
    per_pair = max(1, lead * score.hidden_dim)
    ck = max(1, min(tk, score.max_elements // (per_pair * max(tq, 1))))
    cq = max(1, min(tq, score.max_elements // (per_pair * ck)))
    return cq, ck


def _tile(score, qp: Tensor, kp: Tensor) -> Tensor:
    return score.pair(qp[..., :, None, :] + kp[..., None, :, :])


def _fused_form(score, qp: Tensor, elements: int):
    """The score's fused form, when a tile this large should use the compiled kernel."""
    if elements < FUSED_MIN_ELEMENTS or not compiled.available(qp.device) or qp.dtype == torch.float16:
        return None
    return score.fused_form()


def _fused_tile(score, form, qp: Tensor, kp: Tensor) -> Tensor | None:
    """One tile by the compiled kernel (its backward recomputes the activation: no checkpoint needed), or None when
    compiling failed (then the eager tiles run, and it is logged once)."""
    w, b, act = form
    try:
        with compiled.recompiles():
            return compiled.kernel(_pair_kernel, dynamic=True)(qp, kp, w, b, act)
    except Exception as e:  # noqa: BLE001 - no compiler, unsupported dtype...: the eager tiles
        compiled.failed(e, f"the {type(score).__name__} score")
        return None


def tiles(score, query: Tensor, key: Tensor, *, key_prepared: bool = False) -> Iterator[tuple[slice, slice, Tensor]]:
    """Yield ``(query_rows, key_rows, scores)`` tile by tile, never holding more than one tile."""
    qp, kp = score.query_proj(query), key if key_prepared else score.key_proj(key)
    cq, ck = tile_sizes(score, query, key)
    tq, tk = qp.shape[-2], kp.shape[-2]
    lead = math.prod(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
    fused = _fused_form(score, qp, lead * min(cq, tq) * min(ck, tk) * score.hidden_dim)
    remat = torch.is_grad_enabled() and (cq < tq or ck < tk) and fused is None
    for i in range(0, tq, cq):
        qi = slice(i, min(i + cq, tq))
        for j in range(0, tk, ck):
            kj = slice(j, min(j + ck, tk))
            s = None
            if fused is not None:
                s = _fused_tile(score, fused, qp[..., qi, :], kp[..., kj, :])
                fused = fused if s is not None else None
            if s is None and remat:
                s = checkpoint(_tile, score, qp[..., qi, :], kp[..., kj, :], use_reentrant=False)
            elif s is None:
                s = _tile(score, qp[..., qi, :], kp[..., kj, :])
            yield qi, kj, s


def tiled_scores(score, query: Tensor, key: Tensor, *, key_prepared: bool = False) -> Tensor:
    """The raw scores ``(..., Tq, Tk)``: one eager tile when it fits and is too small to fuse, else tile by tile."""
    if torch.compiler.is_compiling():  # traced by torch.compile or torch.export: one tile (its sizes are symbolic)
        return _tile(score, score.query_proj(query), key if key_prepared else score.key_proj(key))
    tq, tk = query.shape[-2], key.shape[-2]
    cq, ck = tile_sizes(score, query, key)
    one = (cq >= tq and ck >= tk) or tq == 0 or tk == 0  # one tile (an empty one holds no elements)
    if one and (tq * tk * score.hidden_dim < FUSED_MIN_ELEMENTS or score.fused_form() is None):
        return _tile(score, score.query_proj(query), key if key_prepared else score.key_proj(key))
    rows, row = [], []
    for _, kj, s in tiles(score, query, key, key_prepared=key_prepared):
        row.append(s)
        if kj.stop == tk:
            rows.append(torch.cat(row, dim=-1))
            row = []
    return torch.cat(rows, dim=-2)
