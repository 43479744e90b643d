"""The three stages of attention as plain functions: similarity -> normalisation -> weighted sum.

Shapes (axis letters used in every docstring of this package):

- ``...``: any batch axes (e.g. ``B`` batch, ``H`` heads), broadcast between the inputs.
- ``Tq``/``Tk``: query and key positions.  ``Dq``/``Dk``/``Dv``: query, key and value features.

``query (..., Tq, Dq)``, ``key (..., Tk, Dk)``, ``value (..., Tk, Dv)`` -> ``output (..., Tq, Dv)``;
weights ``(..., Tq, Tk)``.

:func:`attention` checks its inputs and picks the fastest correct path, each in :mod:`qkv.paths`;
``impl="reference"`` forces the readable one, which is :func:`compute_scores` -> :func:`normalize_scores` ->
dropout -> :func:`weighted_sum`:

- dot-product family (dot, scaled_dot, cosine, general) with softmax and no weights requested:
  :func:`torch.nn.functional.scaled_dot_product_attention` on the transformed ``q', k'`` (:mod:`qkv.paths.fast`);
- the same with weights requested: one matmul, an in-place masked softmax, one matmul (no second pass;
  :mod:`qkv.paths.weights`);
- pairwise scores (additive, MLP): tiled under a memory bound; with no weights and no gradient needed,
  an online softmax over key tiles, so the ``(..., Tq, Tk)`` scores never exist either (:mod:`qkv.paths.tiled`);
- with ``score_mod``/``mask_mod``: FlexAttention's fused kernel or its reference (:mod:`qkv.flex`).

Every path gives ``(*batch, Tq, Dv)``, ``batch`` the broadcast batch axes of ``query``, ``key`` and ``value``: a
mask may broadcast to them, not add to them (a ``ValueError`` names the shapes). Calls are reported to
:mod:`qkv.hooks` (what :func:`qkv.capture_attention` records) and to nothing above the core.

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

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import hooks
from .background import compiling
from .flex import ModCall
from .masks import broadcast_batch, prepare_mask
from .normalize import get_normalizer, softmax
from .path_table import Call, Plan, choose, plan_of, record
from .paths.common import masked_normalize, scaled_scores, work_dtype
from .scores import Score, get_score

__all__ = ["attention", "plan", "compute_scores", "normalize_scores", "weighted_sum"]

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
    return scaled_scores(sc, query, key, scale, key_prepared).to(query.dtype)


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
    work = work_dtype(scores)
    bias = None if bias is None else bias.to(work)
    return masked_normalize(scores.to(work), allowed, bias, get_normalizer(normalize), inplace=False).to(scores.dtype)


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
    if hooks.active():  # e.g. inside qkv.capture_attention: a model running the stages itself
        hooks.report_weights(weights)
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
            Keys that no query may attend to are ignored, NaN or inf in ``key`` and ``value`` included (unless
            :func:`qkv.set_zero_unseen_keys` switched that off).
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
    if hooks.active():  # e.g. inside qkv.capture_attention: the observer runs the call and records its weights
        return hooks.report_call(attention, query, key, value, dict(
            score=score, mask=mask, normalize=normalize, dropout=dropout, scale=scale, is_causal=is_causal,
            return_weights=return_weights, key_prepared=key_prepared, impl=impl, score_mod=score_mod,
            mask_mod=mask_mod, q_offset=q_offset))
    call = _describe(query, key, value, score=score, mask=mask, normalize=normalize, dropout=dropout, scale=scale,
                     is_causal=is_causal, return_weights=return_weights, key_prepared=key_prepared, impl=impl,
                     score_mod=score_mod, mask_mod=mask_mod, q_offset=q_offset)
    path = choose(call)
    record(path.name)
    return path.run(call)


def plan(query: Tensor, key: Tensor, value: Tensor, **kwargs) -> Plan:
    """The path :func:`attention` takes for this call (given the same arguments), and why, without running it.

    Returns a :class:`qkv.path_table.Plan`: ``path`` (one of :data:`qkv.path_table.PATHS`' names), ``kernel``
    (the compiled kernel that path runs, or None), ``compiled`` (whether it runs compiled for this call now:
    with ``QKV_COMPILE=auto`` a kernel is compiled in the background once its calls pay, so a later call of the same
    signature may say ``True``) and ``reason``. Inputs are checked as :func:`attention` checks them.
    """
    return plan_of(_describe(query, key, value, **kwargs))


def _describe(query: Tensor, key: Tensor, value: Tensor, *, score: ScoreLike = "scaled_dot", mask: Tensor | None = None,
              normalize: str | Callable[[Tensor], Tensor] = "softmax", dropout: float = 0.0,
              scale: float | None = None, is_causal: bool = False, return_weights: bool = False,
              key_prepared: bool = False, impl: str = "auto", score_mod: Callable | None = None,
              mask_mod: Callable | None = None, q_offset: int = 0) -> Call:
    """Check the inputs of :func:`attention` and describe the call (:class:`qkv.path_table.Call`)."""
    sc = get_score(score)
    query, key, value = _autocast_inputs(query, key, value)
    batch = _check_qkv(query, key, value, sc, key_prepared)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if impl not in ("auto", "reference"):
        raise ValueError(f"impl must be 'auto' or 'reference', got {impl!r}")
    normalizer = get_normalizer(normalize)
    tq, tk = query.shape[-2], key.shape[-2]
    mask = _mask_within_batch(mask, batch, query, key, value)
    allowed, bias = prepare_mask(mask, tq, tk, batch)
    if bias is not None:
        bias = bias.to(work_dtype(query))
    mods = None
    if score_mod is not None or mask_mod is not None:
        mods = ModCall(query, key, value, sc=sc, score_mod=score_mod, mask_mod=mask_mod, q_offset=q_offset,
                       allowed=allowed, bias=bias, normalizer=normalizer, dropout=dropout, scale=scale,
                       is_causal=is_causal, return_weights=return_weights, key_prepared=key_prepared, impl=impl)
    fast = impl == "auto" and normalizer is softmax and tq > 0 and tk > 0
    # the ONNX exporter translates SDPA of 4-D inputs only: other inputs take the weights path (the same sums)
    use_sdpa = not (torch.compiler.is_exporting() and max(query.dim(), key.dim(), value.dim()) != 4)
    # Tk <= Tq as a fact (symbolic sizes: provable without a guard that would pin their relation)
    # (traced by the TorchScript exporter, sizes are tensors: not a fact then, and the general path is taken)
    within = tk <= tq
    keys_within = not isinstance(within, Tensor) and statically_known_true(within)
    pair = sc.dot_form(query, key, key_prepared=key_prepared) if fast and mods is None else None
    return Call(query, key, value, sc, mask, allowed, bias, normalizer, dropout, scale, is_causal, return_weights,
                key_prepared, impl, mods, pair, fast, use_sdpa, keys_within, compiling())


# --------------------------------------------------------------------------------------------- checks


def _mask_within_batch(mask: Tensor | None, batch: tuple[int, ...], query: Tensor, key: Tensor,
                       value: Tensor) -> Tensor | None:
    """The mask with leading size-1 axes beyond the inputs' batch axes dropped; ``ValueError`` naming the shapes
    when its batch axes would make the output larger than the inputs' (every path gives ``(*batch, Tq, Dv)``)."""
    if mask is None or not isinstance(mask, Tensor) or mask.dim() < 2:
        return mask  # prepare_mask says what is wrong
    lead = tuple(mask.shape[:-2])
    if broadcast_batch(lead, tuple(batch)) is None:
        return mask  # does not broadcast at all: prepare_mask says so
    extra = len(lead) - len(batch)
    fits = all(m in (1, b) for m, b in zip(lead[max(extra, 0):], batch[max(-extra, 0):], strict=True))
    if not fits or any(m != 1 for m in lead[:max(extra, 0)]):
        raise ValueError(f"mask {tuple(mask.shape)} has batch axes {lead} that the inputs do not have: query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} broadcast to "
                         f"batch axes {tuple(batch)}; the mask's batch axes must broadcast to those (size 1 or "
                         f"equal), no more of them")
    return mask.reshape(mask.shape[extra:]) if extra > 0 else mask


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
    batch = broadcast_batch(*[t.shape[:-2] for t in tensors])
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
