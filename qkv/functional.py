"""The three stages of attention as plain functions: similarity -> normalisation -> weighted sum.

Shapes (axis letters used in every docstring of this package):

- ``...``: any batch axes (e.g. ``B`` batch, ``H`` heads), broadcast between the inputs.
- ``Tq``/``Tk``: query and key positions.  ``Dq``/``Dk``/``Dv``: query, key and value features.

``query (..., Tq, Dq)``, ``key (..., Tk, Dk)``, ``value (..., Tk, Dv)`` -> ``output (..., Tq, Dv)``;
weights ``(..., Tq, Tk)``.

:func:`attention` picks the fastest correct path; ``impl="reference"`` forces the readable one, which
is :func:`compute_scores` -> :func:`normalize_scores` -> dropout -> :func:`weighted_sum`:

- dot-product family (dot, scaled_dot, cosine, general) with softmax and no weights requested:
  :func:`torch.nn.functional.scaled_dot_product_attention` on the transformed ``q', k'``;
- the same with weights requested: one matmul, an in-place masked softmax, one matmul (no second pass);
- pairwise scores (additive, MLP): tiled under a memory bound; with no weights and no gradient needed,
  an online softmax over key tiles, so the ``(..., Tq, Tk)`` scores never exist either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask, prepare_mask
from .normalize import get_normalizer, softmax
from .scores import PairwiseScore, Score, get_score

__all__ = ["attention", "compute_scores", "normalize_scores", "weighted_sum"]

ScoreLike = str | Score | Callable[[Tensor, Tensor], Tensor]


def compute_scores(
    query: Tensor, key: Tensor, score: ScoreLike = "scaled_dot", *, scale: float | None = None,
    key_prepared: bool = False,
) -> Tensor:
    """Stage one: scaled similarity scores ``(..., Tq, Tk)``.

    ``scale`` multiplies the raw scores; by default ``1/sqrt(Dk)`` for ``scaled_dot``, ``1/temperature``
    for cosine and 1 otherwise.
    """
    sc = get_score(score)
    _check_qk(query, key, sc, key_prepared)
    s = sc(query, key, key_prepared=key_prepared)
    factor = sc.default_scale(query, key) if scale is None else scale
    return s if factor == 1.0 else s * factor


def normalize_scores(
    scores: Tensor,
    mask: Tensor | None = None,
    normalize: str | Callable[[Tensor], Tensor] = "softmax",
) -> Tensor:
    """Stage two: weights ``(..., Tq, Tk)`` from scores, under a mask (``True`` = may attend).

    Masked positions get exactly 0; a row with no allowed key gets all zeros (finite gradients).
    """
    allowed, bias = prepare_mask(mask, scores.shape[-2], scores.shape[-1])
    return _normalize(scores, allowed, bias, get_normalizer(normalize), inplace=False)


def weighted_sum(weights: Tensor, value: Tensor) -> Tensor:
    """Stage three: ``weights (..., Tq, Tk) @ value (..., Tk, Dv) -> (..., Tq, Dv)``."""
    if weights.shape[-1] != value.shape[-2]:
        raise ValueError(f"weights {tuple(weights.shape)} and value {tuple(value.shape)} disagree on Tk")
    return weights @ value


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    score: ScoreLike = "scaled_dot",
    mask: Tensor | None = None,
    normalize: str | Callable[[Tensor], Tensor] = "softmax",
    dropout: float = 0.0,
    scale: float | None = None,
    is_causal: bool = False,
    return_weights: bool = False,
    key_prepared: bool = False,
    impl: Literal["auto", "reference"] = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of ``query`` over ``key``/``value``: similarity -> normalisation -> weighted sum.

    Args:
        query: ``(..., Tq, Dq)``.
        key: ``(..., Tk, Dk)``; ``Dk`` may differ from ``Dq`` for ``General``, ``Additive`` and ``MLP``.
        value: ``(..., Tk, Dv)``; ``Dv`` may differ from both.
        score: a name (``dot``, ``scaled_dot``, ``cosine``), a :class:`qkv.scores.Score` module
            (``General``, ``Additive``, ``MLP``, ...) or any callable ``(q, k) -> (..., Tq, Tk)``.
        mask: boolean (``True`` = may attend) or floating (additive bias), broadcastable to ``(..., Tq, Tk)``.
        normalize: ``softmax``, ``sparsemax`` or a callable on the last axis.
        dropout: probability of dropping a weight. Applied whenever it is positive: layers pass 0 in eval.
        scale: factor on the raw scores (default: ``1/sqrt(Dk)`` for ``scaled_dot``, else 1).
        is_causal: also apply :func:`qkv.masks.causal_mask` (top-left aligned, as SDPA does).
        return_weights: also return the weights ``(..., Tq, Tk)`` (before dropout).
        key_prepared: ``key`` is already ``score.prepare_key(key)``: its key-only part (e.g. Bahdanau's
            ``W_k k``), computed once for keys that many queries attend to, such as a decoder's source.
        impl: ``auto`` takes the fastest correct path; ``reference`` the readable three stages.

    Returns:
        ``output (..., Tq, Dv)``, or ``(output, weights)`` when ``return_weights``.
    """
    sc = get_score(score)
    _check_qkv(query, key, value, sc, key_prepared)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if impl not in ("auto", "reference"):
        raise ValueError(f"impl must be 'auto' or 'reference', got {impl!r}")
    normalizer = get_normalizer(normalize)
    tq, tk = query.shape[-2], key.shape[-2]
    allowed, bias = prepare_mask(mask, tq, tk)
    if bias is not None:
        bias = bias.to(query.dtype)
    fast = impl == "auto" and normalizer is softmax and tk > 0
    pair = sc.dot_form(query, key, key_prepared=key_prepared) if fast else None
    factor = sc.default_scale(query, key) if pair is not None and scale is None else scale
    if pair is not None and not return_weights and is_causal and mask is None:  # SDPA's own causal kernel
        return F.scaled_dot_product_attention(pair[0], pair[1], value, dropout_p=dropout, is_causal=True,
                                              scale=factor)
    if is_causal:
        causal = causal_mask(tq, tk, device=query.device)
        allowed = causal if allowed is None else allowed & causal

    if fast:
        if pair is not None:
            if not return_weights:
                return _sdpa(pair[0], pair[1], value, allowed, bias, dropout, factor)
            scores = (pair[0] * factor) @ pair[1].transpose(-2, -1)
            weights = _normalize(scores, allowed, bias, normalizer, inplace=True)
            return _finish(weights, value, dropout, return_weights)
        if isinstance(sc, PairwiseScore) and not return_weights and not _needs_grad(sc, query, key, value):
            factor = 1.0 if scale is None else scale
            return _online_softmax(sc, query, key, value, allowed, bias, factor, key_prepared)

    scores = compute_scores(query, key, sc, scale=scale, key_prepared=key_prepared)
    weights = _normalize(scores, allowed, bias, normalizer, inplace=False)
    return _finish(weights, value, dropout, return_weights)


# --------------------------------------------------------------------------------------------- helpers


def _finish(weights: Tensor, value: Tensor, dropout: float, return_weights: bool):
    used = F.dropout(weights, dropout) if dropout > 0 else weights
    out = used @ value
    return (out, weights) if return_weights else out


def _normalize(scores: Tensor, allowed: Tensor | None, bias: Tensor | None, normalizer, *, inplace: bool) -> Tensor:
    """Masked normalisation. ``inplace`` may overwrite ``scores`` (a fresh tensor owned by the caller)."""
    if bias is not None:
        own = inplace and scores.shape == torch.broadcast_shapes(scores.shape, bias.shape)
        scores = scores.add_(bias) if own else scores + bias
    if allowed is None:
        return _apply(normalizer, scores, inplace)
    rows = allowed.any(dim=-1, keepdim=True)
    # on CPU, knowing that every row has a key saves a pass below; on GPUs the check would cost a sync
    every_row = scores.device.type == "cpu" and bool(rows.all())
    keep = allowed if every_row else allowed & rows
    fill = torch.finfo(scores.dtype).min
    if inplace and scores.shape == torch.broadcast_shapes(scores.shape, keep.shape):
        scores = scores.masked_fill_(~keep, fill)
    else:
        scores = scores.masked_fill(~keep, fill)
    # a fully masked row holds only `fill`: finite, so the normaliser gives finite weights, zeroed below
    weights = _apply(normalizer, scores, inplace)
    if normalizer is softmax and every_row:
        return weights  # exp(fill - max) underflows to exactly 0 at every masked position
    return weights.masked_fill_(~keep, 0.0) if inplace and not _tracked(weights) else weights.masked_fill(~keep, 0.0)


def _tracked(t: Tensor) -> bool:
    return torch.is_grad_enabled() and t.requires_grad


def _apply(normalizer, scores: Tensor, inplace: bool) -> Tensor:
    """The normaliser; softmax overwrites ``scores`` when it may (owned, and no autograd graph to keep).

    Writing the weights over the scores saves allocating (and, on CPU, page-faulting in) a second
    ``(..., Tq, Tk)`` tensor: at B=8, H=8, T=1024 that is 256 MiB and a third of the weights path's time.
    """
    if normalizer is softmax and inplace and not _tracked(scores):
        return torch.softmax(scores, dim=-1, out=scores)
    return normalizer(scores)


def _sdpa(q, k, v, allowed, bias, dropout, scale):
    """``scaled_dot_product_attention`` with fully masked rows giving zeros on every backend."""
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    rows = allowed.any(dim=-1, keepdim=True)
    safe = allowed | ~rows  # a fully masked row attends everywhere, then its output is zeroed
    attn_mask = safe if bias is None else bias.masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
    if out.device.type == "cpu" and bool(rows.all()):  # (on GPUs, the check would cost a sync)
        return out
    return out * rows.to(out.dtype)


def _needs_grad(sc: Score, *tensors: Tensor) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in sc.parameters())


def _slice(mask: Tensor, qi: slice, kj: slice) -> Tensor:
    """Slice the last two axes of a broadcastable mask, leaving size-1 axes alone."""
    rows = qi if mask.shape[-2] > 1 else slice(None)
    cols = kj if mask.shape[-1] > 1 else slice(None)
    return mask[..., rows, cols]


def _online_softmax(sc: PairwiseScore, query, key, value, allowed, bias, scale, key_prepared) -> Tensor:
    """Softmax attention over key tiles with running max and sum (no ``(..., Tq, Tk)`` tensor)."""
    tq = query.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2],
                                   *([allowed.shape[:-2]] if allowed is not None else []),
                                   *([bias.shape[:-2]] if bias is not None else []))
    dtype = torch.promote_types(query.dtype, value.dtype)
    acc = torch.zeros(*batch, tq, value.shape[-1], dtype=dtype, device=query.device)
    run_max = torch.full((*batch, tq, 1), float("-inf"), dtype=dtype, device=query.device)
    run_sum = torch.zeros((*batch, tq, 1), dtype=dtype, device=query.device)
    for qi, kj, s in sc.tiles(query, key, key_prepared=key_prepared):
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
        acc[..., qi, :] = acc[..., qi, :] * corr + p @ value[..., kj, :]
        run_max[..., qi, :] = m_new
    return torch.where(run_sum > 0, acc / run_sum.clamp(min=torch.finfo(dtype).tiny), torch.zeros_like(acc))


def _check_qk(query: Tensor, key: Tensor, sc: Score, key_prepared: bool = False) -> None:
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be (..., T, D), got shape {tuple(t.shape)}")
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch axes of query {tuple(query.shape)} and key {tuple(key.shape)} do not broadcast") \
            from None
    sc.check(query, key, key_prepared=key_prepared)


def _check_qkv(query: Tensor, key: Tensor, value: Tensor, sc: Score, key_prepared: bool) -> None:
    _check_qk(query, key, sc, key_prepared)
    if not isinstance(value, Tensor) or value.dim() < 2:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"value must be (..., Tk, Dv), got {shape}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same Tk (axis -2)")
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch axes of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} do not broadcast") from None
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
