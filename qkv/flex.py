"""Attention with score and mask modifiers (:mod:`qkv.mods`): FlexAttention's fused kernel, or the reference path.

:func:`qkv.attention` comes here when it is given ``score_mod`` or ``mask_mod``. Two paths compute the same thing:

* **fused**: :func:`torch.nn.attention.flex_attention`, compiled per signature by ``torch.compile`` once that
  pays (:mod:`qkv.compiled`: after the first calls of a signature ran the reference path, or at once with
  ``QKV_COMPILE=1``), with block masks cached per mask modifier and shape. It builds no ``(Tq, Tk)`` tensor.
  Taken for the dot family (``dot``, ``scaled_dot``, ``cosine``) with softmax, no dropout, no weights asked for,
  a mask that is none or key padding ``(B, 1, 1, Tk)``, at least :data:`FUSED_MIN_SIZE` score entries per head,
  and gradients only where FlexAttention has a backward (not on the CPU).
* **reference**: the scores ``(..., Tq, Tk)`` built, the modifiers evaluated on broadcast index tensors, masked
  softmax, weighted sum. Every score, every normaliser, dropout, weights and gradients. On the CPU, for the dot
  family with softmax, it runs a block of the scores at a time through one fused block function (modifier, mask,
  softmax), compiled like the fused path, with a backward pass of its own that recomputes each block
  (:mod:`qkv.paths.chunked`): the weights at near fused cost, and training without the ``(Tq, Tk)`` scores.

When ``torch.compile`` cannot build the kernel (no C++ compiler, an unsupported device) the reference path is used
and the reason is logged once (:mod:`qkv.compiled`; ``QKV_COMPILE=0`` turns it off). Fully masked rows give zero
weights and a zero output on both paths.

A user's modifier is checked once, on the reference path's index tensors (a few positions of each axis), before
anything is compiled: one that raises, returns the wrong dtype or the wrong shape is a ``ValueError`` naming it. One
that passes but cannot be compiled (FlexAttention traces it: no ``.item()``, no Python branches on tensors) runs on
the reference path, said once, naming it; compiled kernels stay on for everything else. Only a failure with qkv's
own modifiers turns them off.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import OrderedDict

import torch
from torch import Tensor

from . import compiled
from .background import compiling
from .mod_checks import call_mask_mod, call_score_mod, check_mods, mod_name, user_mods
from .mods import MaskMod, ScoreMod, and_masks, causal, offset, uses
from .normalize import softmax
from .paths.chunked import chunked
from .paths.common import finish, masked_normalize, needs_grad, scaled_scores, work_dtype, zero_unseen_keys

logger = logging.getLogger(__name__)

__all__ = ["attention_with_mods", "fused_available", "FUSED_MIN_SIZE"]

#: the fused path is taken from ``Tq * Tk`` of this size up (smaller ones are cheaper explicit than compiled)
FUSED_MIN_SIZE = 128 * 128

_block_masks: OrderedDict = OrderedDict()
_eager_only: weakref.WeakSet = weakref.WeakSet()  # user modifiers FlexAttention could not compile


def fused_available(device: torch.device | str = "cpu") -> bool:
    """Whether the fused path may be tried (compiled kernels on, FlexAttention in this torch, CPU or CUDA)."""
    if _has_flex[0] is None:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
            _has_flex[0] = True
        except ImportError:
            _has_flex[0] = False
    return _has_flex[0] and compiled.available(device)


_has_flex: list = [None]  # whether this torch has FlexAttention (found once)


def _flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


#: FlexAttention compiled for fixed shapes (one compilation per shape and modifier)
FLEX = compiled.Kernel("the FlexAttention kernel", _flex_attention, cold_seconds=15.0, saving=0.7,
                       options={"dynamic": False})


def _code(m):
    """What tells a modifier's code apart (closures of one function share it)."""
    return None if m is None else getattr(m, "__code__", type(m))


def _signature(q4: Tensor, v4: Tensor, b: int, h: int, score_mod, mask_mod, padding, is_causal) -> tuple:
    """What a compilation of FlexAttention is made for: shapes, dtype, device and the modifiers' code."""
    return (b, h, q4.shape[-2], q4.shape[-1], v4.shape[-2], v4.shape[-1], q4.dtype, q4.device.type,
            _code(score_mod), _code(mask_mod), padding is not None, is_causal)


def _block_mask(mask_mod: MaskMod | None, b: int, h: int, tq: int, tk: int, device: torch.device,
                key: tuple | None):
    from torch.nn.attention.flex_attention import create_block_mask

    if mask_mod is None:
        return None
    axes = uses(mask_mod)  # built once for the axes the modifier ignores (broadcast by FlexAttention)
    b, h = (b if "b" in axes else 1), (h if "h" in axes else 1)
    if key is None:
        return create_block_mask(mask_mod, b, h, tq, tk, device=device)
    cache_key = (*key, b, h, tq, tk, device)
    found = _block_masks.get(cache_key)
    if found is not None:
        _block_masks.move_to_end(cache_key)
        return found
    bm = create_block_mask(mask_mod, b, h, tq, tk, device=device)
    _block_masks[cache_key] = bm
    if len(_block_masks) > 64:
        _block_masks.popitem(last=False)
    return bm


def _full(t: Tensor, b: int, h: int) -> Tensor:
    """``t (b or 1, h or 1, T, D)`` as a contiguous ``(b, h, T, D)`` tensor (itself when it is one already)."""
    if t.shape[0] == b and t.shape[1] == h and t.is_contiguous():
        return t
    return t.expand(b, h, *t.shape[-2:]).contiguous()


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


class ModCall:
    """One call with modifiers, prepared: 4-D views, the shifted modifiers, the key padding, and whether the fused
    path may take it (``signature``: what FlexAttention would be compiled for, None when it may not)."""

    def __init__(self, query: Tensor, key: Tensor, value: Tensor, *, sc, score_mod: ScoreMod | None,
                 mask_mod: MaskMod | None, q_offset: int, allowed: Tensor | None, bias: Tensor | None, normalizer,
                 dropout: float, scale: float | None, is_causal: bool, return_weights: bool, key_prepared: bool,
                 impl: str):
        for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} must be a function (see qkv.mods), got {type(fn).__name__}")
        if q_offset < 0:
            raise ValueError(f"q_offset must be >= 0, got {q_offset}")
        if allowed is not None:  # keys no query may see: zeroed when they could hold NaN/inf (as the plain path)
            key, value = zero_unseen_keys(allowed, key, value, query.shape[-1])
        self.query, self.key, self.value, self.sc = query, key, value, sc
        self.score_mod, self.mask_mod, self.allowed, self.bias = score_mod, mask_mod, allowed, bias
        self.normalizer, self.dropout, self.scale, self.is_causal = normalizer, dropout, scale, is_causal
        self.return_weights, self.key_prepared, self.q_offset = return_weights, key_prepared, q_offset
        q4, k4, self.v4 = _as_4d(query), _as_4d(key), _as_4d(value)
        b = self.b = max(q4.shape[0], k4.shape[0], self.v4.shape[0])
        h = self.h = max(q4.shape[1], k4.shape[1], self.v4.shape[1])
        tq, tk = self.tq, self.tk = q4.shape[-2], k4.shape[-2]
        self.ndim = max(query.dim(), key.dim(), value.dim())
        self.smod = offset(score_mod, q_offset, score=True) if score_mod is not None else None
        mmod = offset(mask_mod, q_offset, score=False) if mask_mod is not None else None
        if is_causal:  # top-left aligned as in SDPA, shifted by the offset like the modifiers
            shifted = offset(causal, q_offset, score=False)
            mmod = and_masks(mmod, shifted) if mmod else shifted
        self.mmod = mmod
        self.pair = pair = sc.dot_form(query, key, key_prepared=key_prepared)
        self.padding = padding = _key_padding(allowed, b, tk) if allowed is not None else None
        cpu = query.device.type == "cpu"
        self.grad = needs_grad(query, key, value, score_mod, mask_mod)
        # (not under torch.export: ONNX and other exporters have no FlexAttention; the reference path computes the
        # same)
        fused = (impl == "auto" and not torch.compiler.is_exporting() and pair is not None and normalizer is softmax
                 and dropout == 0.0 and not return_weights
                 and bias is None and (allowed is None or padding is not None) and tq * tk >= FUSED_MIN_SIZE
                 and query.dtype in ((torch.float32,) if cpu else (torch.float32, torch.bfloat16, torch.float16))
                 and not (cpu and self.grad)
                 and not any(m in _eager_only for m in user_mods(score_mod, mask_mod))
                 and fused_available(query.device))
        self.signature = _signature(q4, self.v4, b, h, score_mod, mask_mod, padding, is_causal) if fused else None

    def fused_ready(self) -> bool:
        """Whether FlexAttention runs this call compiled now (``QKV_COMPILE=1``: compiled on this call)."""
        return self.signature is not None and FLEX.use(self.signature, self.query.device)

    def block_signature(self) -> tuple:
        """The signature the block kernels (:mod:`qkv.paths.chunked`) count this call under."""
        keep = None if self.allowed is None else _as_4d(self.allowed)
        bias = None if self.bias is None else _as_4d(self.bias)
        key = (_code(self.score_mod), _code(self.mask_mod), self.smod is not self.score_mod,
               self.mmod is not self.mask_mod)
        return (key, keep is not None, keep is not None and keep.shape, bias is not None,
                bias is not None and bias.shape, work_dtype(self.pair[0]), self.query.dtype,
                self.query.device.type)

    def blocks(self) -> bool:
        """Whether the reference path runs a block at a time (:mod:`qkv.paths.chunked`): the dot family with softmax
        on the CPU, not traced."""
        # (not traced by torch.compile or torch.export: the blocks are a Python loop over sizes that would be pinned)
        return (self.pair is not None and self.normalizer is softmax and self.query.device.type == "cpu"
                and self.tq > 0 and self.tk > 0 and not compiling())


def attention_with_mods(query: Tensor, key: Tensor, value: Tensor, **kw):
    """The body of :func:`qkv.attention` with modifiers (inputs already checked; ``allowed``/``bias`` from the
    mask, ``is_causal`` not yet folded in): the fused path where it is compiled, else the reference path."""
    m = ModCall(query, key, value, **kw)
    return run_fused(m) if m.fused_ready() else run_reference(m)


def run_fused(m: ModCall):
    """FlexAttention's compiled kernel (the reference path when it fails: said once)."""
    users = user_mods(m.score_mod, m.mask_mod)
    if users:
        check_mods(m.score_mod, m.smod, m.mask_mod, m.mmod, m.b, m.h, m.tq, m.tk, m.query)
    result = _fused(m.pair, m.v4, m.b, m.h, m.tq, m.tk, m.smod, m.mmod, m.padding, m.sc, m.query, m.key, m.scale,
                    (m.score_mod, m.mask_mod, m.q_offset, m.is_causal), m.signature)
    if result is not None:
        return _from_4d(result, m.ndim)
    return _run_reference(m)


def run_reference(m: ModCall):
    """The reference path; where the fused path may take the call but is not compiled yet, timed for the rule that
    starts its compilation (in the background, on this call's arguments)."""
    if m.signature is None:
        return _run_reference(m)
    example = lambda: _flex_args(m.pair, m.v4, m.b, m.h, m.tq, m.tk, m.smod, m.mmod, m.padding, m.sc,  # noqa: E731
                                 m.query, m.key, m.scale, (m.score_mod, m.mask_mod, m.q_offset, m.is_causal))
    with FLEX.eager(m.signature, m.query.device, example):
        # (the block kernel is not compiled meanwhile: FlexAttention takes the call once it is, and one compilation
        # at a time on the background thread gets it there sooner)
        return _run_reference(m, standby=FLEX.may_compile(m.signature))


def _run_reference(m: ModCall, standby: bool = False):
    return _reference(m.query, m.key, m.value, m.sc, m.pair, m.smod, m.mmod, m.score_mod, m.mask_mod, m.allowed,
                      m.bias, m.normalizer, m.dropout, m.scale, m.key_prepared, m.return_weights, m.tq, m.tk, m.ndim,
                      m.v4, standby)


def _reference(query, key, value, sc, pair, smod, mmod, score_mod, mask_mod, allowed, bias, normalizer, dropout,
               scale, key_prepared, return_weights, tq, tk, ndim, v4, standby=False):
    """Explicit scores, the modifiers on broadcast indices, masked normalisation, weighted sum: on the CPU for the
    dot family with softmax a block of query rows at a time (:mod:`qkv.paths.chunked`), else whole. ``standby``:
    another kernel is being compiled for this call, the blocks run their eager code (not compiled)."""
    # (not traced by torch.compile or torch.export: the blocks are a Python loop over sizes that would be pinned)
    if (pair is not None and normalizer is softmax and query.device.type == "cpu" and tq > 0 and tk > 0
            and not compiling()):
        score_fn = None if smod is None else (
            lambda s, b, h, q, k: call_score_mod(score_mod, smod, s, b, h, q, k))
        mask_fn = None if mmod is None else (
            lambda b, h, q, k: call_mask_mod(mask_mod, mmod, b, h, q, k, (b.shape[0], h.shape[1], q.shape[2],
                                                                           k.shape[3])))
        grad = needs_grad(query, key, value, score_mod, mask_mod)
        q4 = _as_4d(pair[0])
        b, h = max(q4.shape[0], v4.shape[0]), max(q4.shape[1], v4.shape[1])
        traceable = not any(m in _eager_only for m in user_mods(score_mod, mask_mod))
        if traceable:  # the user's modifiers, checked before any compilation
            check_mods(score_mod, smod, mask_mod, mmod, b, h, tq, tk, query)
        result = chunked(q4, _as_4d(pair[1]), v4, sc.factor(query, key, scale), score_fn, mask_fn,
                         None if allowed is None else _as_4d(allowed), None if bias is None else _as_4d(bias),
                         dropout, return_weights, query.dtype, grad,
                         mods=(smod, mmod) if traceable and not standby else None,
                         key=(_code(score_mod), _code(mask_mod), smod is not score_mod, mmod is not mask_mod),
                         on_fail=lambda e: _fused_failed(e, score_mod, mask_mod),
                         mask_axes=None if mmod is None else uses(mmod))
        if return_weights:
            return _from_4d(result[0], ndim), _from_4d(result[1], ndim)
        return _from_4d(result, ndim)
    scores = scaled_scores(sc, query, key, scale, key_prepared)
    s4 = base = _as_4d(scores)
    bi, hi, qi, ki = _indices(s4.shape[0], s4.shape[1], tq, tk, scores.device)
    if smod is not None:
        s4 = call_score_mod(score_mod, smod, s4, bi, hi, qi, ki)
    keep = None if allowed is None else _as_4d(allowed)
    if mmod is not None:
        m = call_mask_mod(mask_mod, mmod, bi, hi, qi, ki, s4.shape)
        keep = m if keep is None else keep & m
    # the scores are ours to overwrite when the core made them (dot family) or a modifier returned new ones
    own = pair is not None if s4 is base else (s4.shape == base.shape and s4._base is None)
    weights = masked_normalize(s4, keep, None if bias is None else _as_4d(bias), normalizer, inplace=own)
    result = finish(weights.to(query.dtype), v4, dropout, return_weights)
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


def _fused_failed(error: BaseException, score_mod, mask_mod) -> None:
    """A failure of the fused path: the user's modifier's if there is one (it runs on the reference path from now
    on, said once), else the compiler's (compiled kernels off, said once)."""
    users = user_mods(score_mod, mask_mod)
    if not users or compiling():
        compiled.failed(error, "attention with score_mod/mask_mod")
        return
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    for m in users:
        with contextlib.suppress(TypeError):  # not weakly referable: tried again next time
            _eager_only.add(m)
    logger.warning("qkv: FlexAttention could not compile %s (%s: %s); it runs on the reference path (compiled "
                   "kernels stay on for everything else)", " and ".join(mod_name(m) for m in users),
                   type(error).__name__, first)


def _flex_args(pair, v4, b, h, tq, tk, smod, mmod, padding, sc, query, key, scale, mods) -> tuple[tuple, dict]:
    """FlexAttention's arguments for a call: contiguous ``(B, H, T, D)`` inputs (inductor's CPU template reads the
    layout of its inputs: a view fails inside a caller's torch.compile) and the block mask."""
    cache_key = mods
    q, k = _as_4d(pair[0]), _as_4d(pair[1])
    q, k, v = _full(q, b, h), _full(k, b, h), _full(v4, b, h)
    factor = sc.factor(query, key, scale)
    if padding is not None:
        pad = padding.contiguous()

        def padding_mod(bb, hh, q_idx, kv_idx):
            return pad[bb, kv_idx]

        padding_mod.qkv_uses = frozenset({"b"})
        mmod = and_masks(mmod, padding_mod) if mmod is not None else padding_mod
        cache_key = None  # a mask of this batch's padding: built anew every call
    block_mask = _block_mask(mmod, b, h, tq, tk, q.device, cache_key)
    return (q, k, v), {"score_mod": smod, "block_mask": block_mask, "scale": factor}


def _fused(pair, v4, b, h, tq, tk, smod, mmod, padding, sc, query, key, scale, mods, signature):
    """FlexAttention's fused kernel, or None when it did not run (it failed, said once, or is being compiled for
    these arguments' layout). ``mods``: ``(score_mod, mask_mod, q_offset, is_causal)`` as given, which key the
    cached block masks."""
    try:
        args, kwargs = _flex_args(pair, v4, b, h, tq, tk, smod, mmod, padding, sc, query, key, scale, mods)
    except Exception as e:  # noqa: BLE001 - the block mask could not be built: the reference path, said once
        _fused_failed(e, mods[0], mods[1])
        return None
    return FLEX.run(signature, lambda *a, **kw: None, *args, on_fail=lambda e: _fused_failed(e, mods[0], mods[1]),
                    **kwargs)
