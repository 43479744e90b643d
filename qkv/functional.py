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

Hostile input, on every path:

- keys that no query may attend to (key padding; padding memory is often uninitialised) are zeroed in
  ``key`` and ``value`` before anything reads them (on a CPU, only when they hold NaN, inf or values large
  enough to overflow), so garbage there never reaches the output or the gradients, and their gradients are
  exactly zero; masked scores are replaced (``masked_fill``), never added to;
- ``Tq = 0`` or ``Tk = 0`` give an empty or an all-zero output, with gradients;
- float16/bfloat16 on CPU: scores and normalisation run in float32 (the fused kernel does so itself), and
  the scale is applied to ``q`` before the matmul, so nothing overflows where float32 would not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from . import capture as _capture
from .masks import broadcast_batch, causal_mask, prepare_mask
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
    query, key = _autocast_inputs(query, key)
    _check_qk(query, key, sc, key_prepared)
    return _scores(sc, query, key, scale, key_prepared).to(query.dtype)


def normalize_scores(
    scores: Tensor,
    mask: Tensor | None = None,
    normalize: str | Callable[[Tensor], Tensor] = "softmax",
) -> Tensor:
    """Stage two: weights ``(..., Tq, Tk)`` from scores, under a mask (``True`` = may attend).

    Masked positions get exactly 0 (whatever the scores hold there, NaN included); a row with no allowed
    key gets all zeros (finite gradients).
    """
    _check_float("scores", scores)
    allowed, bias = prepare_mask(mask, scores.shape[-2], scores.shape[-1], scores.shape[:-2])
    work = _work_dtype(scores)
    bias = None if bias is None else bias.to(work)
    return _normalize(scores.to(work), allowed, bias, get_normalizer(normalize), inplace=False).to(scores.dtype)


def weighted_sum(weights: Tensor, value: Tensor) -> Tensor:
    """Stage three: ``weights (..., Tq, Tk) @ value (..., Tk, Dv) -> (..., Tq, Dv)``.

    A zero weight does not hide a NaN or inf value (``0 * nan = nan``): :func:`attention` zeroes the values
    no query may attend to; when calling the stages yourself, give them finite values.
    """
    _check_float("weights", weights, 2)
    _check_float("value", value, 2)
    weights, value = _autocast_inputs(weights, value)
    if weights.dtype != value.dtype:
        raise ValueError(f"weights and value must share a dtype, got weights {weights.dtype}, value {value.dtype}")
    if weights.shape[-1] != value.shape[-2]:
        raise ValueError(f"weights {tuple(weights.shape)} and value {tuple(value.shape)} disagree on Tk")
    _broadcast("weights", weights, "value", value)
    if _capture.ACTIVE is not None:  # inside qkv.capture_attention: a model running the stages itself
        _capture.record_weights(weights)
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
    score_mod: Callable | None = None,
    mask_mod: Callable | None = None,
    q_offset: int = 0,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of ``query`` over ``key``/``value``: similarity -> normalisation -> weighted sum.

    Args:
        query: ``(..., Tq, Dq)``.
        key: ``(..., Tk, Dk)``; ``Dk`` may differ from ``Dq`` for ``General``, ``Additive`` and ``MLP``.
        value: ``(..., Tk, Dv)``; ``Dv`` may differ from both.
        score: a name (``dot``, ``scaled_dot``, ``cosine``), a :class:`qkv.scores.Score` module
            (``General``, ``Additive``, ``MLP``, ...) or any callable ``(q, k) -> (..., Tq, Tk)``.
        mask: boolean (``True`` = may attend) or floating (additive bias), broadcastable to ``(..., Tq, Tk)``.
            Keys that no query may attend to are ignored, NaN or inf in ``key`` and ``value`` included.
        normalize: ``softmax``, ``sparsemax`` or a callable on the last axis.
        dropout: probability of dropping a weight. Applied whenever it is positive: layers pass 0 in eval.
        scale: factor on the raw scores (default: ``1/sqrt(Dk)`` for ``scaled_dot``, else 1).
        is_causal: also apply :func:`qkv.masks.causal_mask` (top-left aligned, as SDPA does).
        return_weights: also return the weights ``(..., Tq, Tk)`` (before dropout).
        key_prepared: ``key`` is already ``score.prepare_key(key)``: its key-only part (e.g. Bahdanau's
            ``W_k k``), computed once for keys that many queries attend to, such as a decoder's source.
        impl: ``auto`` takes the fastest correct path; ``reference`` the readable three stages.
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` applied to the scaled scores (see
            :mod:`qkv.mods`: ALiBi, T5 bias, soft-capping...); FlexAttention's signature and semantics.
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool``, True where attention is allowed (causal, sliding
            window, documents, prefix LM...), combined with ``mask`` and ``is_causal``. With either modifier,
            inputs are ``(T, D)``, ``(B, T, D)`` or ``(B, H, T, D)``, and the dot family runs fused in
            FlexAttention where it can (:mod:`qkv.flex`).
        q_offset: the queries' first position for the modifiers (e.g. after ``q_offset`` cached keys).

    Returns:
        ``output (..., Tq, Dv)``, or ``(output, weights)`` when ``return_weights``.

    ``query``, ``key`` and ``value`` must share one floating-point dtype (no promotion, as in
    :func:`torch.nn.functional.scaled_dot_product_attention`); anything else raises a ``ValueError`` naming them.
    Under :func:`torch.autocast` inputs of different floating dtypes are first cast to the autocast dtype, as
    autocast does for SDPA and matmul.
    """
    if _capture.ACTIVE is not None and not _capture.ACTIVE.busy:  # inside qkv.capture_attention
        return _capture.record_call(attention, query, key, value, dict(
            score=score, mask=mask, normalize=normalize, dropout=dropout, scale=scale, is_causal=is_causal,
            return_weights=return_weights, key_prepared=key_prepared, impl=impl, score_mod=score_mod,
            mask_mod=mask_mod, q_offset=q_offset))
    sc = get_score(score)
    query, key, value = _autocast_inputs(query, key, value)
    batch = _check_qkv(query, key, value, sc, key_prepared)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if impl not in ("auto", "reference"):
        raise ValueError(f"impl must be 'auto' or 'reference', got {impl!r}")
    normalizer = get_normalizer(normalize)
    tq, tk = query.shape[-2], key.shape[-2]
    allowed, bias = prepare_mask(mask, tq, tk, batch)
    work = _work_dtype(query)
    if bias is not None:
        bias = bias.to(work)
    if score_mod is not None or mask_mod is not None:
        from .flex import attention_with_mods

        return attention_with_mods(query, key, value, sc=sc, score_mod=score_mod, mask_mod=mask_mod,
                                   q_offset=q_offset, allowed=allowed, bias=bias, normalizer=normalizer,
                                   dropout=dropout, scale=scale, is_causal=is_causal, return_weights=return_weights,
                                   key_prepared=key_prepared, impl=impl)
    fast = impl == "auto" and normalizer is softmax and tq > 0 and tk > 0
    # SDPA's own causal kernel; with Tk <= Tq every key is seen by some query, so there is nothing to zero
    if fast and not return_weights and is_causal and mask is None and tk <= tq:
        pair = sc.dot_form(query, key, key_prepared=key_prepared)
        if pair is not None:
            factor = sc.default_scale(query, key) if scale is None else scale
            return F.scaled_dot_product_attention(pair[0], pair[1], value, dropout_p=dropout, is_causal=True,
                                                  scale=factor)
    if is_causal:
        causal = causal_mask(tq, tk, device=query.device)
        allowed = causal if allowed is None else allowed & causal
    if allowed is not None and (mask is not None or tk > tq):  # a causal mask alone hides keys only if Tk > Tq
        key, value = _zero_unseen_keys(allowed, key, value, query.shape[-1])

    if fast:
        pair = sc.dot_form(query, key, key_prepared=key_prepared)
        if pair is not None:
            factor = sc.default_scale(query, key) if scale is None else scale
            if not return_weights:
                return _sdpa(pair[0], pair[1], value, allowed, bias, dropout, factor)
            q, k = pair[0].to(work), pair[1].to(work)
            scores = (q * factor) @ k.transpose(-2, -1)
            weights = _normalize(scores, allowed, bias, normalizer, inplace=True).to(query.dtype)
            return _finish(weights, value, dropout, return_weights)
        if isinstance(sc, PairwiseScore) and not return_weights and not _needs_grad(sc, query, key, value):
            factor = 1.0 if scale is None else scale
            return _online_softmax(sc, query, key, value, allowed, bias, factor, key_prepared)

    scores = _scores(sc, query, key, scale, key_prepared)
    weights = _normalize(scores, allowed, bias, normalizer, inplace=False).to(query.dtype)
    return _finish(weights, value, dropout, return_weights)


# --------------------------------------------------------------------------------------------- helpers


def _work_dtype(t: Tensor) -> torch.dtype:
    """float32 for float16/bfloat16 on CPU, where the matmul rounds its output to the input dtype and
    overflows where float32 would not (the fused kernels accumulate in float32 themselves)."""
    return torch.float32 if t.device.type == "cpu" and t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _scores(sc: Score, query: Tensor, key: Tensor, scale: float | None, key_prepared: bool) -> Tensor:
    """Scaled scores in the working dtype; the dot family scales ``q'`` before the matmul."""
    work = _work_dtype(query)
    factor = sc.default_scale(query, key) if scale is None else scale
    pair = sc.dot_form(query, key, key_prepared=key_prepared)
    if pair is not None:
        q, k = pair[0].to(work), pair[1].to(work)
        return (q if factor == 1.0 else q * factor) @ k.transpose(-2, -1)
    s = sc(query, key, key_prepared=key_prepared).to(work)
    return s if factor == 1.0 else s * factor


def _reduce_to(unseen: Tensor, shape: torch.Size) -> Tensor:
    """AND ``unseen (..., Tk, 1)`` over the batch axes along which a tensor of ``shape`` is broadcast (size 1 or
    absent there): a key shared by several batch rows is unseen only if every one of them ignores it."""
    extra = unseen.dim() - len(shape)
    if extra > 0:
        unseen = unseen.all(dim=tuple(range(extra)))
    dims = tuple(i for i in range(unseen.dim() - 2) if unseen.shape[i] > 1 and shape[i - unseen.dim()] == 1)
    return unseen.all(dim=dims, keepdim=True) if dims else unseen


def _zero_unseen_keys(allowed: Tensor, key: Tensor, value: Tensor, query_dim: int) -> tuple[Tensor, Tensor]:
    """Zero the keys and values that no query may attend to (O(Tk * D), next to attention's O(Tq * Tk * D)).

    Padding memory is often uninitialised: a NaN there would reach the output through ``0 * nan`` in the
    weighted sum, or through the scores and their gradients. Zeroed, it cannot; the gradients flowing back
    to those positions are exactly zero. A key masked for only some queries is seen by the others, so it
    holds real data, and its masked scores are replaced, never added to.

    On a CPU the copies of ``key`` and ``value`` cost 5-20% of the fused kernel's time (memory traffic and
    page faults), so they are only made when an unseen row could do harm: a value that is not finite, or a
    key that is not finite or so large that its product with a query could overflow. On GPUs the copies are
    cheap and the check would cost a sync, so they are always made.
    """
    used = allowed if allowed.shape[-2] == 1 else allowed.any(dim=-2, keepdim=True)  # some query sees the key
    if used.device.type == "cpu" and bool(used.all()):
        return key, value
    unseen = ~used.transpose(-2, -1)  # (..., Tk, 1)
    k_unseen = _reduce_to(unseen, key.shape)
    v_unseen = k_unseen if value.shape[:-1] == key.shape[:-1] else _reduce_to(unseen, value.shape)
    if key.device.type == "cpu":
        finfo = torch.finfo(_work_dtype(key))
        if (_harmless(key, k_unseen, math.sqrt(finfo.max) / max(key.shape[-1], query_dim, 1))
                and _harmless(value, v_unseen, finfo.max)):
            return key, value
    return torch.where(k_unseen, 0.0, key), torch.where(v_unseen, 0.0, value)  # one pass each (masked_fill: two)


@torch.no_grad()
def _harmless(t: Tensor, unseen: Tensor, bound: float) -> bool:
    """Whether the rows of ``t (..., Tk, D)`` flagged by ``unseen (..., Tk, 1)`` lie in ``[-bound, bound]`` (NaN
    does not). A query would have to exceed ``sqrt(max)`` to overflow against a key within ``sqrt(max) / D``."""
    rows = t.detach()[unseen.squeeze(-1).expand(t.shape[:-1])]
    if rows.numel() == 0:
        return True
    low, high = torch.aminmax(rows)  # one pass, and few parallel regions: each costs a time slice on a busy CPU
    return bool((low >= -bound) & (high <= bound))


def _finish(weights: Tensor, value: Tensor, dropout: float, return_weights: bool):
    used = F.dropout(weights, dropout) if dropout > 0 else weights
    out = used @ value
    return (out, weights) if return_weights else out


def _normalize(scores: Tensor, allowed: Tensor | None, bias: Tensor | None, normalizer, *, inplace: bool) -> Tensor:
    """Masked normalisation. ``inplace`` may overwrite ``scores`` (a fresh tensor owned by the caller)."""
    if scores.shape[-1] == 0:  # no key at all: empty weights, whatever the normaliser
        shapes = [m.shape for m in (allowed, bias) if m is not None]
        return scores.expand(torch.broadcast_shapes(scores.shape, *shapes))
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
    if bias is not None:
        bias = bias.to(q.dtype)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    rows = allowed.any(dim=-1, keepdim=True)
    safe = allowed | ~rows  # a fully masked row attends everywhere (to finite keys), then its output is zeroed
    attn_mask = safe if bias is None else bias.masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
    if out.device.type == "cpu" and bool(rows.all()):  # (on GPUs, the check would cost a sync)
        return out
    return torch.where(rows, out, 0.0)


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


def _autocast_inputs(*tensors):
    """Under :func:`torch.autocast`, floating tensors of different dtypes cast to the autocast dtype (what autocast
    does for SDPA and matmul, e.g. a float32 learned query against bfloat16 keys); otherwise unchanged."""
    dtypes = {t.dtype for t in tensors if isinstance(t, Tensor) and t.dtype.is_floating_point}
    if len(dtypes) < 2:
        return tensors
    device = next(t.device.type for t in tensors if isinstance(t, Tensor))
    if device not in ("cpu", "cuda", "xpu", "mps") or not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if isinstance(t, Tensor) and t.dtype.is_floating_point else t for t in tensors)


def _check_float(name: str, t, min_dim: int = 0) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must be (..., T, D), got shape {tuple(t.shape)}")


def _broadcast(*named) -> tuple[int, ...]:
    """The broadcast batch axes (all but the last two) of the named tensors; ``ValueError`` naming them if none."""
    names, tensors = named[::2], named[1::2]
    batch = broadcast_batch(*(tuple(t.shape[:-2]) for t in tensors))
    if batch is None:
        listed = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"batch axes of {listed} do not broadcast")
    return batch


def _check_qk(query: Tensor, key: Tensor, sc: Score, key_prepared: bool = False) -> None:
    _check_float("query", query, 2)
    _check_float("key", key, 2)
    if query.dtype != key.dtype:
        raise ValueError(f"query and key must share a dtype, got query {query.dtype}, key {key.dtype}")
    _broadcast("query", query, "key", key)
    sc.check(query, key, key_prepared=key_prepared)


def _check_qkv(query: Tensor, key: Tensor, value: Tensor, sc: Score, key_prepared: bool) -> tuple[int, ...]:
    """Validate the inputs of :func:`attention`; return their broadcast batch axes."""
    _check_float("query", query, 2)
    _check_float("key", key, 2)
    _check_float("value", value, 2)
    if not (query.dtype == key.dtype == value.dtype):  # as scaled_dot_product_attention requires: no promotion
        raise ValueError(f"query, key and value must share a dtype, got query {query.dtype}, key {key.dtype}, "
                         f"value {value.dtype}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same Tk (axis -2)")
    batch = _broadcast("query", query, "key", key, "value", value)
    sc.check(query, key, key_prepared=key_prepared)
    return batch
