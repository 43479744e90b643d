"""Attention with score and mask modifiers (:mod:`qkv.mods`): FlexAttention's fused kernel, or the reference path.

:func:`qkv.attention` comes here when it is given ``score_mod`` or ``mask_mod``. Two paths compute the same thing:

* **fused**: :func:`torch.nn.attention.flex_attention`, compiled once per signature by ``torch.compile`` (kept in
  a cache), with block masks cached per mask modifier and shape. It builds no ``(Tq, Tk)`` tensor. Taken for the
  dot family (``dot``, ``scaled_dot``, ``cosine``) with softmax, no dropout, no weights asked for, a mask that is
  none or key padding ``(B, 1, 1, Tk)``, at least :data:`FUSED_MIN_SIZE` score entries per head, and gradients only
  where FlexAttention has a backward (not on the CPU).
* **reference**: the scores ``(..., Tq, Tk)`` built, the modifiers evaluated on broadcast index tensors, masked
  softmax, weighted sum. Every score, every normaliser, dropout, weights and gradients.

When ``torch.compile`` cannot build the kernel (no C++ compiler, an unsupported device) the reference path is used
and the reason is logged once (:mod:`qkv.compiled`; ``QKV_NO_COMPILE=1`` turns it off). Fully masked rows give zero
weights and a zero output on both paths.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from . import compiled
from .mods import MaskMod, ScoreMod, and_masks, causal, offset, uses

__all__ = ["attention_with_mods", "fused_available", "FUSED_MIN_SIZE"]

#: the fused path is taken from ``Tq * Tk`` of this size up (smaller ones are cheaper explicit than compiled)
FUSED_MIN_SIZE = 128 * 128

_block_masks: OrderedDict = OrderedDict()


def fused_available(device: torch.device | str = "cpu") -> bool:
    """Whether the fused path may be tried (compiled kernels on, FlexAttention in this torch, CPU or CUDA)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return compiled.available(device)


def _flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return compiled.kernel(flex_attention, dynamic=False)


def _block_mask(mask_mod: MaskMod | None, b: int, h: int, tq: int, tk: int, device: torch.device,
                key: tuple | None):
    from torch.nn.attention.flex_attention import create_block_mask

    if mask_mod is None:
        return None
    axes = uses(mask_mod)  # built once for the axes the modifier ignores (broadcast by FlexAttention)
    b, h = (b if "b" in axes else 1), (h if "h" in axes else 1)
    if key is None:
        return create_block_mask(mask_mod, b, h, tq, tk, device=device)
    cache_key = (*key, b, h, tq, tk, str(device))
    found = _block_masks.get(cache_key)
    if found is not None:
        _block_masks.move_to_end(cache_key)
        return found
    bm = create_block_mask(mask_mod, b, h, tq, tk, device=device)
    _block_masks[cache_key] = bm
    if len(_block_masks) > 64:
        _block_masks.popitem(last=False)
    return bm


def _as_4d(t: Tensor) -> Tensor:
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    if t.dim() == 4:
        return t
    raise ValueError(f"attention with score_mod/mask_mod takes (T, D), (B, T, D) or (B, H, T, D) tensors, got "
                     f"{tuple(t.shape)}")


def _indices(b: int, h: int, tq: int, tk: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (torch.arange(b, device=device).view(b, 1, 1, 1), torch.arange(h, device=device).view(1, h, 1, 1),
            torch.arange(tq, device=device).view(1, 1, tq, 1), torch.arange(tk, device=device).view(1, 1, 1, tk))


def _key_padding(allowed: Tensor | None, b: int, tk: int) -> Tensor | None:
    """``allowed`` as a ``(B, Tk)`` key-padding mask if that is all it is; None otherwise."""
    if allowed is None or allowed.dim() != 4 or allowed.shape[1] != 1 or allowed.shape[2] != 1:
        return None
    return allowed.reshape(allowed.shape[0], tk).expand(b, tk)


def attention_with_mods(query: Tensor, key: Tensor, value: Tensor, *, sc, score_mod: ScoreMod | None,
                        mask_mod: MaskMod | None, q_offset: int, allowed: Tensor | None, bias: Tensor | None,
                        normalizer, dropout: float, scale: float | None, is_causal: bool, return_weights: bool,
                        key_prepared: bool, impl: str):
    """The body of :func:`qkv.attention` with modifiers (inputs already checked; ``allowed``/``bias`` from the
    mask, ``is_causal`` not yet folded in)."""
    from .functional import _finish, _normalize, _scores, _zero_unseen_keys
    from .normalize import softmax

    for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{name} must be a function (see qkv.mods), got {type(fn).__name__}")
    if q_offset < 0:
        raise ValueError(f"q_offset must be >= 0, got {q_offset}")
    if allowed is not None:  # keys no query may see: zeroed when they could hold NaN/inf (as the plain path)
        key, value = _zero_unseen_keys(allowed, key, value, query.shape[-1])
    q4, k4, v4 = _as_4d(query), _as_4d(key), _as_4d(value)
    b = max(q4.shape[0], k4.shape[0], v4.shape[0])
    h = max(q4.shape[1], k4.shape[1], v4.shape[1])
    tq, tk = q4.shape[-2], k4.shape[-2]
    ndim = max(query.dim(), key.dim(), value.dim())
    smod = offset(score_mod, q_offset, score=True) if score_mod is not None else None
    mmod = offset(mask_mod, q_offset, score=False) if mask_mod is not None else None
    if is_causal:  # top-left aligned as in SDPA, shifted by the offset like the modifiers
        shifted = offset(causal, q_offset, score=False)
        mmod = and_masks(mmod, shifted) if mmod else shifted

    pair = sc.dot_form(query, key, key_prepared=key_prepared)
    padding = _key_padding(allowed, b, tk) if allowed is not None else None
    cpu = query.device.type == "cpu"
    fused = (impl == "auto" and pair is not None and normalizer is softmax and dropout == 0.0 and not return_weights
             and bias is None and (allowed is None or padding is not None) and tq * tk >= FUSED_MIN_SIZE
             and query.dtype in ((torch.float32,) if cpu else (torch.float32, torch.bfloat16, torch.float16))
             and not (cpu and _needs_grad(query, key, value, score_mod, mask_mod)) and fused_available(query.device))
    if fused:
        result = _fused(pair, v4, b, h, tq, tk, smod, mmod, padding, sc, query, key, scale, (score_mod, mask_mod,
                                                                                            q_offset, is_causal))
        if result is not None:
            return _from_4d(result, ndim)

    # reference: explicit scores, modifiers on broadcast indices
    scores = _scores(sc, query, key, scale, key_prepared)
    s4 = base = _as_4d(scores)
    bi, hi, qi, ki = _indices(s4.shape[0], s4.shape[1], tq, tk, scores.device)
    if smod is not None:
        s4 = smod(s4, bi, hi, qi, ki)
        if s4.shape[-2:] != (tq, tk):
            raise ValueError(f"score_mod returned {tuple(s4.shape)}; it must keep the scores' shape")
    keep = None if allowed is None else _as_4d(allowed)
    if mmod is not None:
        m = mmod(bi, hi, qi, ki)
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise ValueError("mask_mod must return a boolean tensor (True = may attend)")
        keep = m if keep is None else keep & m
    # the scores are ours to overwrite when the core made them (dot family) or a modifier returned new ones
    own = pair is not None if s4 is base else (s4.shape == base.shape and s4._base is None)
    weights = _normalize(s4, keep, None if bias is None else _as_4d(bias), normalizer, inplace=own)
    result = _finish(weights.to(query.dtype), v4, dropout, return_weights)
    if return_weights:
        return _from_4d(result[0], ndim), _from_4d(result[1], ndim)
    return _from_4d(result, ndim)


def _from_4d(t: Tensor, ndim: int) -> Tensor:
    """Undo :func:`_as_4d` for inputs of ``ndim`` dimensions (axes that broadcasting made larger stay)."""
    if ndim == 2 and t.shape[:2] == (1, 1):
        return t[0, 0]
    if ndim == 3 and t.shape[1] == 1:
        return t[:, 0]
    return t


def _needs_grad(*things) -> bool:
    """Whether a backward pass may go through this call (FlexAttention has none on the CPU): inputs, or learned
    modifiers (a module such as T5's bias), that require gradients."""
    if not torch.is_grad_enabled():
        return False
    for t in things:
        if isinstance(t, Tensor) and t.requires_grad:
            return True
        if isinstance(t, torch.nn.Module) and any(p.requires_grad for p in t.parameters()):
            return True
    return False


def _fused(pair, v4, b, h, tq, tk, smod, mmod, padding, sc, query, key, scale, cache_key):
    q, k = _as_4d(pair[0]), _as_4d(pair[1])
    # contiguous (B, H, T, D): inductor's CPU template reads the layout of its inputs (a view fails inside a
    # caller's torch.compile)
    q, k, v = (t.expand(b, h, *t.shape[-2:]).contiguous() for t in (q, k, v4))
    factor = sc.default_scale(query, key) if scale is None else scale
    if padding is not None:
        pad = padding.contiguous()

        def padding_mod(bb, hh, q_idx, kv_idx):
            return pad[bb, kv_idx]

        padding_mod.qkv_uses = frozenset({"b"})
        mmod = and_masks(mmod, padding_mod) if mmod is not None else padding_mod
        cache_key = None  # a mask of this batch's padding: built anew every call
    try:
        block_mask = _block_mask(mmod, b, h, tq, tk, q.device, cache_key)
        with compiled.recompiles():
            return _flex()(q, k, v, score_mod=smod, block_mask=block_mask, scale=factor)
    except Exception as e:  # noqa: BLE001 - any failure to compile or run: the reference path, said once
        compiled.failed(e, "attention with score_mod/mask_mod")
        return None
