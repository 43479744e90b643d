"""Score and mask modifiers with FlexAttention's signatures, for :func:`qkv.attention` and the layers.

A score modifier is ``score_mod(score, b, h, q_idx, kv_idx) -> score``; a mask modifier is
``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True where attention is allowed). Both are written with element-wise
tensor operations and tensor indexing, so the same function runs fused inside
:func:`torch.nn.attention.flex_attention` (scalar indices) and on broadcast index tensors in qkv's reference path
(``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,Tq,1)``, ``kv_idx (1,1,1,Tk)``).

============================================  ====================================================================
modifier                                      what it does
============================================  ====================================================================
``alibi(num_heads)``                          ALiBi (Press et al. 2022): ``score - m_h * (q - k)``, head slopes
                                              ``m_h`` geometric; ``symmetric=True`` uses ``|q - k|`` (encoders)
``relative_position_bias(...)``               T5's learned bias per head and log-spaced distance bucket (a module)
``softcap(cap)``                              ``cap * tanh(score / cap)`` (Gemma 2's logit soft-capping)
``causal``                                    keys up to the query's position
``sliding_window(window)``                    the ``window`` keys ending at the query's position (causal); or
                                              within ``window`` positions on both sides
``document(ids)``                             packed sequences: a query sees keys of its own document only
``prefix_lm(prefix_len)``                     the prefix is seen by every query; the rest causally
``and_masks``, ``or_masks``, ``chain``        combine mask modifiers; apply score modifiers one after another
============================================  ====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["ScoreMod", "MaskMod", "uses", "alibi", "alibi_slopes", "RelativePositionBias", "relative_position_bias",
           "softcap", "causal", "sliding_window", "document", "prefix_lm", "and_masks", "or_masks", "chain",
           "offset", "is_builtin"]

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def uses(mod: Callable) -> frozenset[str]:
    """Which of the batch and head indices (``"b"``, ``"h"``) a mask modifier depends on: qkv's modifiers say so;
    any other function is taken to use both. A block mask is built once for the axes a modifier ignores."""
    return getattr(mod, "qkv_uses", frozenset({"b", "h"}))


def _uses(mod: Callable, *axes: str) -> Callable:
    mod.qkv_uses = frozenset(axes)
    return mod


def _parts(mod: Callable, parts) -> Callable:
    mod.qkv_parts = tuple(parts)  # the modifiers a combination is made of (see is_builtin)
    return mod


def is_builtin(mod: Callable) -> bool:
    """Whether ``mod`` is one of the modifiers made here, or a combination of such only: a failure to compile it is
    the compiler's, never a user's error (:mod:`qkv.flex`)."""
    if isinstance(mod, RelativePositionBias):
        return True
    if getattr(mod, "__module__", None) != __name__:
        return False
    return all(is_builtin(p) for p in getattr(mod, "qkv_parts", ()))


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes: ``2^(-8 i / n)`` for ``n`` a power of two; otherwise those of the nearest lower power
    of two followed by every other slope of the next one (the paper's code)."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(low)
    if low < num_heads:
        slopes += power_of_two(2 * low)[0::2][: num_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi(num_heads: int, *, symmetric: bool = False) -> ScoreMod:
    """ALiBi: ``score - m_h (q_idx - kv_idx)`` (a key ``d`` positions back costs ``m_h d``); with ``symmetric``,
    ``score - m_h |q_idx - kv_idx|`` for bidirectional attention."""
    alibi_slopes(num_heads)  # checks num_heads
    low = 2 ** math.floor(math.log2(num_heads))

    def alibi_mod(score, b, h, q_idx, kv_idx):
        dist = q_idx - kv_idx
        if symmetric:
            dist = dist.abs()
        # alibi_slopes(num_heads)[h], computed from h (no table to move to the device inside a compiled kernel):
        # 2^(-8 (h + 1) / low) for the first `low` heads, then 2^(-4 (2 (h - low) + 1) / low)
        exponent = torch.where(h < low, 8.0 * (h + 1), 4.0 * (2 * (h - low) + 1)) / low
        return score - torch.exp2(-exponent) * dist

    alibi_mod.num_heads = num_heads
    return alibi_mod


class RelativePositionBias(nn.Module):
    """T5's relative position bias (Raffel et al. 2020): a learned scalar per head and per distance bucket.

    Distances below ``num_buckets / 2`` (half of that when ``bidirectional``) get a bucket each; longer ones
    share log-spaced buckets up to ``max_distance``. Call it as a score modifier.
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, *, bidirectional: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if num_heads < 1 or num_buckets < 2 or max_distance < 1:
            raise ValueError(f"num_heads >= 1, num_buckets >= 2 and max_distance >= 1 needed, got {num_heads}, "
                             f"{num_buckets}, {max_distance}")
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional = bidirectional
        self.bias = nn.Parameter(torch.zeros(num_buckets, num_heads, device=device, dtype=dtype))

    def bucket(self, relative: Tensor) -> Tensor:
        """The bucket of ``relative = kv_idx - q_idx`` (integer tensor of any shape)."""
        n = self.num_buckets
        out = torch.zeros_like(relative)
        if self.bidirectional:
            n //= 2
            out = out + (relative > 0).to(relative.dtype) * n
            dist = relative.abs()
        else:
            dist = (-relative).clamp(min=0)
        exact = n // 2
        large = exact + (torch.log(dist.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
                         * (n - exact)).to(relative.dtype)
        large = large.clamp(max=n - 1)
        return out + torch.where(dist < exact, dist, large)

    def forward(self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + self.bias[self.bucket(kv_idx - q_idx), h].to(score.dtype)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")


def relative_position_bias(num_buckets: int = 32, max_distance: int = 128, num_heads: int = 8, *,
                           bidirectional: bool = True) -> RelativePositionBias:
    """A new learned :class:`RelativePositionBias` (register it in your model so that it trains)."""
    return RelativePositionBias(num_heads, num_buckets, max_distance, bidirectional=bidirectional)


def softcap(cap: float) -> ScoreMod:
    """``cap * tanh(score / cap)``: scores bounded by ``cap`` in absolute value."""
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return softcap_mod


@_uses
def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """A query sees the keys up to its own position."""
    return q_idx >= kv_idx


def sliding_window(window: int, *, causal: bool = True) -> MaskMod:
    """Causal: the ``window`` keys ending at the query (``0 <= q - k < window``); else ``|q - k| < window``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")

    def sliding_window_mod(b, h, q_idx, kv_idx):
        dist = q_idx - kv_idx
        return ((dist >= 0) & (dist < window)) if causal else (dist.abs() < window)

    return _uses(sliding_window_mod)


def document(ids: Tensor) -> MaskMod:
    """Packed sequences: ``ids (B, T)`` or ``(T,)`` gives each position's document; a query sees its own only."""
    if ids.dim() not in (1, 2) or ids.dtype.is_floating_point:
        raise ValueError(f"ids must be an integer (B, T) or (T,) tensor, got {tuple(ids.shape)} {ids.dtype}")
    ids = ids if ids.dim() == 2 else ids[None]

    def document_mod(b, h, q_idx, kv_idx):
        rows = b if ids.shape[0] > 1 else torch.zeros_like(b)
        return ids[rows, q_idx] == ids[rows, kv_idx]

    return _uses(document_mod, *(("b",) if ids.shape[0] > 1 else ()))


def prefix_lm(prefix_len: int | Tensor) -> MaskMod:
    """Every query sees the first ``prefix_len`` keys (an int, or ``(B,)`` per sequence) and, after them, the
    keys up to its own position."""
    if isinstance(prefix_len, Tensor):
        if prefix_len.dim() != 1:
            raise ValueError(f"prefix_len must be an int or a (B,) tensor, got {tuple(prefix_len.shape)}")

        def prefix_mod(b, h, q_idx, kv_idx):
            return (kv_idx < prefix_len[b]) | (q_idx >= kv_idx)
    else:
        if prefix_len < 0:
            raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")

        def prefix_mod(b, h, q_idx, kv_idx):
            return (kv_idx < prefix_len) | (q_idx >= kv_idx)

    return _uses(prefix_mod, *(("b",) if isinstance(prefix_len, Tensor) else ()))


def _combine(mods: tuple[MaskMod, ...], op: Callable[[Tensor, Tensor], Tensor], name: str) -> MaskMod:
    if not mods:
        raise ValueError(f"{name} needs at least one mask modifier")

    def combined(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = op(out, m(b, h, q_idx, kv_idx))
        return out

    return _parts(_uses(combined, *frozenset().union(*(uses(m) for m in mods))), mods)


def and_masks(*mods: MaskMod) -> MaskMod:
    """Allowed where every one of ``mods`` allows."""
    return _combine(mods, torch.logical_and, "and_masks")


def or_masks(*mods: MaskMod) -> MaskMod:
    """Allowed where any one of ``mods`` allows."""
    return _combine(mods, torch.logical_or, "or_masks")


def chain(*mods: ScoreMod) -> ScoreMod:
    """Score modifiers applied one after another (e.g. ALiBi, then soft-capping)."""
    if not mods:
        raise ValueError("chain needs at least one score modifier")

    def chained(score, b, h, q_idx, kv_idx):
        for m in mods:
            score = m(score, b, h, q_idx, kv_idx)
        return score

    return _parts(chained, mods)


def offset(mod: Callable, by: int | Tensor, *, score: bool) -> Callable:
    """``mod`` with query positions shifted by ``by`` (new queries after ``by`` cached keys)."""
    if isinstance(by, int) and by == 0:
        return mod
    by_t = by if isinstance(by, Tensor) else torch.tensor(by)
    if score:
        def shifted_score(s, b, h, q_idx, kv_idx):
            return mod(s, b, h, q_idx + by_t.to(q_idx.device), kv_idx)
        return _parts(shifted_score, (mod,))

    def shifted_mask(b, h, q_idx, kv_idx):
        return mod(b, h, q_idx + by_t.to(q_idx.device), kv_idx)
    return _parts(_uses(shifted_mask, *uses(mod)), (mod,))
