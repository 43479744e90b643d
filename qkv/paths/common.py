"""What every execution path shares: the working dtype, scaled scores, masked normalisation, the weighted sum, and
the zeroing of keys that no query may see.

Private to the core: :mod:`qkv.functional` and :mod:`qkv.flex` call these once the inputs are checked.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

from ..background import compiling
from ..normalize import softmax
from ..scores import Score

__all__ = ["work_dtype", "scaled_scores", "masked_normalize", "finish", "zero_unseen_keys", "set_zero_unseen_keys",
           "zeroing_unseen_keys", "needs_grad"]


def work_dtype(t: Tensor) -> torch.dtype:
    """float32 for float16/bfloat16 on CPU, where the matmul rounds its output to the input dtype and
    overflows where float32 would not (the fused kernels accumulate in float32 themselves)."""
    return torch.float32 if t.device.type == "cpu" and t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def scaled_scores(sc: Score, query: Tensor, key: Tensor, scale: float | None, key_prepared: bool) -> Tensor:
    """Scaled scores ``(..., Tq, Tk)`` in the working dtype; the dot family scales ``q'`` before the matmul."""
    work = work_dtype(query)
    factor = sc.factor(query, key, scale)
    pair = sc.dot_form(query, key, key_prepared=key_prepared)
    if pair is not None:
        q, k = pair[0].to(work), pair[1].to(work)
        return (q if factor == 1.0 else q * factor) @ k.transpose(-2, -1)
    s = sc(query, key, key_prepared=key_prepared).to(work)
    return s if factor == 1.0 else s * factor


def finish(weights: Tensor, value: Tensor, dropout: float, return_weights: bool):
    """Stage three: ``dropout(weights) @ value``, and the weights (before dropout) when asked for."""
    used = F.dropout(weights, dropout) if dropout > 0 else weights
    out = used @ value
    return (out, weights) if return_weights else out


def masked_normalize(scores: Tensor, allowed: Tensor | None, bias: Tensor | None, normalizer, *,
                     inplace: bool) -> Tensor:
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
    every_row = scores.device.type == "cpu" and not compiling() and bool(rows.all())
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
    if normalizer is softmax and inplace and not _tracked(scores) and not compiling():
        return torch.softmax(scores, dim=-1, out=scores)
    return normalizer(scores)


def _reduce_to(unseen: Tensor, shape: torch.Size) -> Tensor:
    """AND ``unseen (..., Tk, 1)`` over the batch axes along which a tensor of ``shape`` is broadcast (size 1 or
    absent there): a key shared by several batch rows is unseen only if every one of them ignores it."""
    extra = unseen.dim() - len(shape)
    if extra > 0:
        unseen = unseen.all(dim=tuple(range(extra)))
    dims = tuple(i for i in range(unseen.dim() - 2) if unseen.shape[i] > 1 and shape[i - unseen.dim()] == 1)
    return unseen.all(dim=dims, keepdim=True) if dims else unseen


#: keys and values of at most this many elements (together) are zeroed without checking them first: on a CPU the
#: check (a gather of the unseen rows) costs more than the copies below it (18 against 4 us at 128 elements, 36
#: against 60 us at 64 Ki, measured)
CHECK_ABOVE = 1 << 14


_zero_unseen = [True]


def set_zero_unseen_keys(enabled: bool) -> None:
    """Whether :func:`qkv.attention` zeroes the keys and values that no query may see (the default: True).

    Zeroed, NaN or inf in padding never reaches an output or a gradient. The copies cost little on a CPU, where they
    are made only when the padding holds such values, but on a GPU they are made on every masked call (checking
    would wait for the GPU): two copies of the keys and values, about a third of a small bfloat16 call's time
    (BENCHMARKS.md, "One GPU"). ``False`` skips them, as :func:`torch.nn.functional.scaled_dot_product_attention`
    does: for inputs whose padding is known to be finite (e.g. zero-padded, or the projection of finite inputs).
    With NaN or inf in padding, outputs are then NaN, as PyTorch's are.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"set_zero_unseen_keys takes True or False, got {enabled!r}")
    _zero_unseen[0] = enabled


def zeroing_unseen_keys() -> bool:
    """What :func:`set_zero_unseen_keys` set (True unless switched off)."""
    return _zero_unseen[0]


def zero_unseen_keys(allowed: Tensor, key: Tensor, value: Tensor, query_dim: int) -> tuple[Tensor, Tensor]:
    """Zero the keys and values that no query may attend to (O(Tk * D), next to attention's O(Tq * Tk * D)).

    Padding memory is often uninitialised: a NaN there would reach the output through ``0 * nan`` in the
    weighted sum, or through the scores and their gradients. Zeroed, it cannot; the gradients flowing back
    to those positions are exactly zero. A key masked for only some queries is seen by the others, so it
    holds real data, and its masked scores are replaced, never added to.

    On a CPU the copies of ``key`` and ``value`` cost 5-20% of the fused kernel's time (memory traffic and
    page faults), so they are only made when an unseen row could do harm: a value that is not finite, or a
    key that is not finite or so large that its product with a query could overflow; below
    :data:`CHECK_ABOVE` elements the copies cost less than that check, and are made. On GPUs the copies are
    cheap and the check would cost a sync, so they are always made. :func:`set_zero_unseen_keys` switches them
    off.
    """
    if not _zero_unseen[0]:
        return key, value
    traced = compiling()  # torch.compile, torch.export: always zero, never branch on values
    if allowed.device.type == "cpu":
        used = allowed if allowed.shape[-2] == 1 else allowed.any(dim=-2, keepdim=True)  # some query sees the key
        if not traced and bool(used.all()):
            return key, value
        unseen = ~used.transpose(-2, -1)  # (..., Tk, 1)
    else:
        unseen = derived(allowed, "unseen", _unseen)
    k_unseen = _reduce_to(unseen, key.shape)
    v_unseen = k_unseen if value.shape[:-1] == key.shape[:-1] else _reduce_to(unseen, value.shape)
    if key.device.type == "cpu" and not traced and key.numel() + value.numel() > CHECK_ABOVE:
        finfo = torch.finfo(work_dtype(key))
        if (_harmless(key, k_unseen, math.sqrt(finfo.max) / max(key.shape[-1], query_dim, 1))
                and _harmless(value, v_unseen, finfo.max)):
            return key, value
    return torch.where(k_unseen, zero_of(key), key), torch.where(v_unseen, zero_of(value), value)  # one pass each


_zeros: dict = {}  # (device, dtype) -> a 0-dim zero on that device


def zero_of(t: Tensor) -> Tensor | float:
    """Zero for ``torch.where`` beside ``t``: a Python number on a CPU or when traced; on a GPU a 0-dim zero of its
    device and dtype made once (a Python number there becomes a 0-dim tensor filled by a kernel of its own on every
    call, and a 0-dim CPU tensor is copied to the GPU on every call, and waited for)."""
    if t.device.type == "cpu" or compiling():
        return 0.0
    found = _zeros.get((t.device, t.dtype))
    if found is None:
        found = _zeros[(t.device, t.dtype)] = torch.zeros((), device=t.device, dtype=t.dtype)
    return found


_derived: dict[int, tuple] = {}  # id(mask) -> (weak reference, version, {name: tensor})


def _unseen(allowed: Tensor) -> Tensor:
    used = allowed if allowed.shape[-2] == 1 else allowed.any(dim=-2, keepdim=True)
    return ~used.transpose(-2, -1)


def derived(allowed: Tensor, name: str, make) -> Tensor:
    """``make(allowed)``, kept while ``allowed`` lives unchanged: the layers of a model share one mask, and on a GPU
    each small kernel launched costs more CPU time than its work (not kept inside a compilation)."""
    if compiling() or allowed.requires_grad:
        return make(allowed)
    key = id(allowed)
    entry = _derived.get(key)
    if entry is None or entry[0]() is not allowed or entry[1] != allowed._version:
        entry = (weakref.ref(allowed, lambda _, key=key: _derived.pop(key, None)), allowed._version, {})
        _derived[key] = entry
    found = entry[2].get(name)
    if found is None:
        found = entry[2][name] = make(allowed)
    return found


def _harmless(t: Tensor, unseen: Tensor, bound: float) -> bool:
    """Whether the rows of ``t (..., Tk, D)`` flagged by ``unseen (..., Tk, 1)`` lie in ``[-bound, bound]`` (NaN
    does not). A query would have to exceed ``sqrt(max)`` to overflow against a key within ``sqrt(max) / D``."""
    rows = t.detach()[unseen.squeeze(-1).expand(t.shape[:-1])]  # (detached: no graph, no no_grad context to enter)
    if rows.numel() == 0:
        return True
    low, high = torch.aminmax(rows)  # one pass, and few parallel regions: each costs a time slice on a busy CPU
    return low.item() >= -bound and high.item() <= bound  # (NaN compares False; Python numbers: 18x cheaper)


def needs_grad(*things) -> bool:
    """Whether a backward pass may go through this call: tensors, or modules (a learned score or modifier) with
    parameters, that require gradients."""
    if not torch.is_grad_enabled():
        return False
    for t in things:
        if isinstance(t, Tensor) and t.requires_grad:
            return True
        if isinstance(t, torch.nn.Module) and any(p.requires_grad for p in t.parameters()):
            return True
    return False
