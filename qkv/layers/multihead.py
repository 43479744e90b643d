"""Multi-head attention (Vaswani et al., 2017, https://arxiv.org/abs/1706.03762), batch first.

Beyond ``torch.nn.MultiheadAttention``: any qkv score per head, grouped-query / multi-query attention
(Ainslie et al., 2023, https://arxiv.org/abs/2305.13245) through ``kv_heads``, weights per head or
averaged without leaving the fast path, and a key/value cache for token-by-token decoding.

Axis letters: ``B`` batch, ``T``/``Tq``/``Tk`` positions, ``E`` model width (``dim``), ``H`` heads, ``G`` key/value
heads, ``D`` head size (``E / H``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional import attention
from ..masks import causal_mask, combine_masks
from ..scores import Score, create_score

__all__ = ["MultiHeadAttention", "KVCache"]


@dataclass
class KVCache:
    """Projected keys and values ``(B, G, T, D)`` kept between decoding steps.

    For self-attention each call appends the new keys/values. With ``static=True`` (cross-attention
    over an encoder's memory) the first call fills the cache and later calls reuse it.
    """

    key: Tensor | None = None
    value: Tensor | None = None
    static: bool = False

    def __len__(self) -> int:
        return 0 if self.key is None else self.key.shape[-2]

    @property
    def length(self):
        """The positions held, as :func:`len` gives them; traced by ``torch.export`` a symbolic size (``len()``
        must return an ``int``, which would pin it)."""
        return 0 if self.key is None else self.key.shape[-2]

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if self.key is None:
            self.key, self.value = key, value
        elif not self.static:
            self.key = torch.cat([self.key, key], dim=-2)
            self.value = torch.cat([self.value, value], dim=-2)
        return self.key, self.value

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (beam search)."""
        if self.key is not None:
            self.key, self.value = self.key.index_select(0, index), self.value.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Multi-head self- and cross-attention, ``(B, T, E)`` batch first.

    Args:
        dim: ``E``, the model's width: the size of queries and of the output.
        num_heads: ``H``; must divide ``E``.
        kv_heads: ``G`` key/value heads shared by ``H / G`` query heads each (grouped-query attention;
            1 is multi-query). Default ``H``.
        key_dim, value_dim: feature sizes of the key and value inputs (default ``E``; ``torch.nn.MultiheadAttention``
            calls them ``kdim``, ``vdim``: the layer has those attributes too).
        bias: biases on the four projections.  dropout: on the weights, in training only.
        score: the score of every head: a name (``scaled_dot``, ``dot``, ``cosine``, ``general``,
            ``additive``, ``mlp``; parametric ones are built with size ``D`` and shared by the heads), a
            :class:`qkv.scores.Score` or a callable ``(q, k) -> scores``.
        normalize: ``softmax``, ``sparsemax`` or a callable.
        score_mod, mask_mod: modifiers of every call (:mod:`qkv.mods`: ALiBi, T5 bias, soft-capping, sliding
            windows...); a score modifier that is a module (learned, e.g. T5's bias) becomes a submodule. With a
            cache, query positions continue after the cached keys.

    Example:
        >>> mha = MultiHeadAttention(64, 8)
        >>> x = torch.randn(2, 10, 64)
        >>> out, w = mha(x, is_causal=True, return_weights=True)   # w: (2, 10, 10), averaged over heads
    """

    attention_kind = None  #: self or cross, from the call (no key, or the query as key: self)

    def __init__(self, dim: int, num_heads: int, *, kv_heads: int | None = None, key_dim: int | None = None,
                 value_dim: int | None = None, bias: bool = True, dropout: float = 0.0,
                 score: str | Score | Callable = "scaled_dot", normalize: str | Callable = "softmax",
                 score_mod: Callable | None = None, mask_mod: Callable | None = None, device=None, dtype=None):
        super().__init__()
        kv_heads = num_heads if kv_heads is None else kv_heads
        if dim <= 0 or num_heads <= 0 or dim % num_heads:
            raise ValueError(f"dim ({dim}) must be a positive multiple of num_heads ({num_heads})")
        if kv_heads <= 0 or num_heads % kv_heads:
            raise ValueError(f"kv_heads ({kv_heads}) must divide num_heads ({num_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        fk = {"device": device, "dtype": dtype}
        self.dim, self.num_heads, self.kv_heads = dim, num_heads, kv_heads
        self.head_dim = dim // num_heads
        self.key_dim = dim if key_dim is None else key_dim
        self.value_dim = dim if value_dim is None else value_dim
        self.dropout = dropout
        self.normalize = normalize
        self.q_proj = nn.Linear(dim, dim, bias=bias, **fk)
        self.k_proj = nn.Linear(self.key_dim, kv_heads * self.head_dim, bias=bias, **fk)
        self.v_proj = nn.Linear(self.value_dim, kv_heads * self.head_dim, bias=bias, **fk)
        self.out_proj = nn.Linear(dim, dim, bias=bias, **fk)
        self.score = create_score(score, self.head_dim, self.head_dim, **fk)
        self.score_mod, self.mask_mod = score_mod, mask_mod  # a module score_mod registers as a submodule
        self.reset_parameters()

    @property
    def kdim(self) -> int:
        """:attr:`key_dim`, as ``torch.nn.MultiheadAttention`` calls it."""
        return self.key_dim

    @property
    def vdim(self) -> int:
        """:attr:`value_dim`, as ``torch.nn.MultiheadAttention`` calls it."""
        return self.value_dim

    def reset_parameters(self) -> None:
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
        average_weights: bool = True,
        cache: KVCache | None = None,
        score_mod: Callable | None = None,
        mask_mod: Callable | None = None,
    ):
        """Attend from ``query`` to ``key``/``value`` (self-attention when ``key`` is None).

        Args:
            query: ``(B, Tq, E)``.  key: ``(B, Tk, key_dim)``.  value: ``(B, Tk, value_dim)`` (default ``key``).
            mask: boolean (True = may attend) or additive float, broadcastable to ``(B, H, Tq, Tk)``;
                ``(Tq, Tk)`` and ``(B, Tq, Tk)`` masks are broadcast over the heads.
            key_mask: ``(B, Tk)`` boolean, True at real (non-padding) keys.
            is_causal: causal mask; with a cache it is aligned bottom right (new queries follow the cache).
            return_weights: also return the weights, ``(B, Tq, Tk)`` averaged over heads or
                ``(B, H, Tq, Tk)`` when ``average_weights=False``.
            cache: a :class:`KVCache` updated in place with this call's keys and values.
            score_mod, mask_mod: modifiers of this call, applied after (and combined with) the layer's own.

        Returns:
            ``(B, Tq, E)``, or ``(output, weights)`` when ``return_weights``.
        """
        if query.dim() != 3 or query.shape[-1] != self.dim:
            raise ValueError(f"query must be (B, Tq, E={self.dim}), got {tuple(query.shape)}")
        b, tq, _ = query.shape
        h, g, d = self.num_heads, self.kv_heads, self.head_dim
        q = self.q_proj(query).view(b, tq, h, d).transpose(1, 2)

        cached = 0 if cache is None or cache.static else cache.length  # positions before this call's queries
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value
        else:
            key = query if key is None else key
            value = key if value is None else value
            for name, t, size in (("key", key, self.key_dim), ("value", value, self.value_dim)):
                if t.dim() != 3 or t.shape[0] != b or t.shape[-1] != size:
                    raise ValueError(f"{name} must be (B={b}, Tk, {size}), got {tuple(t.shape)} "
                                     f"for query {tuple(query.shape)}")
            if key.shape[1] != value.shape[1]:
                raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in Tk")
            k = self.k_proj(key).view(b, key.shape[1], g, d).transpose(1, 2)  # (sizes given: B or Tk may be 0)
            v = self.v_proj(value).view(b, value.shape[1], g, d).transpose(1, 2)
            if cache is not None:
                k, v = cache.update(k, v)
        tk = k.shape[-2]
        if g != h:  # every group of H / G query heads shares one key/value head
            k = k.repeat_interleave(h // g, dim=1)
            v = v.repeat_interleave(h // g, dim=1)

        full_mask = self._mask(mask, key_mask, b, tq, tk)
        if is_causal and tq == 1:  # one new query after the cache sees every key: nothing to mask
            is_causal = False
        lower_right = is_causal and tk != tq
        if lower_right:
            full_mask = combine_masks(full_mask, causal_mask(tq, tk, lower_right=True, device=query.device))
        smod = _chain(self.score_mod, score_mod, scores=True)
        mmod = _chain(self.mask_mod, mask_mod, scores=False)
        mods = {} if smod is None and mmod is None else {"score_mod": smod, "mask_mod": mmod, "q_offset": cached}
        result = attention(q, k, v, score=self.score, mask=full_mask, normalize=self.normalize,
                           dropout=self.dropout if self.training else 0.0, is_causal=is_causal and not lower_right,
                           return_weights=return_weights, **mods)
        out, weights = result if return_weights else (result, None)
        out = self.out_proj(out.transpose(1, 2).reshape(b, tq, self.dim))
        if not return_weights:
            return out
        return out, (weights.mean(dim=1) if average_weights else weights)

    def _mods_repr(self) -> str:
        return "".join(f", {n}={getattr(f, '__name__', type(f).__name__)}" for n, f in
                       (("score_mod", self.score_mod), ("mask_mod", self.mask_mod)) if f is not None)

    @staticmethod
    def _mask(mask: Tensor | None, key_mask: Tensor | None, b: int, tq: int, tk: int) -> Tensor | None:
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        if key_mask is not None:
            if key_mask.dtype != torch.bool or key_mask.shape != (b, tk):
                raise ValueError(f"key_mask must be a bool (B, Tk) = ({b}, {tk}) tensor, got "
                                 f"{tuple(key_mask.shape)} {key_mask.dtype}")
            key_mask = key_mask[:, None, None, :]
        return combine_masks(mask, key_mask)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``torch.nn.MultiheadAttention``'s weights, giving the same outputs and averaged weights.

        Inputs must be batch first here whatever ``module.batch_first`` says. PyTorch's boolean masks are
        True where attention is *not* allowed: convert them with :func:`qkv.masks.from_torch_mask`.
        """
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv or add_zero_attn")
        p = next(module.parameters())
        new = cls(module.embed_dim, module.num_heads, key_dim=module.kdim, value_dim=module.vdim,
                  bias=module.in_proj_bias is not None, dropout=module.dropout, device=p.device, dtype=p.dtype)
        e = module.embed_dim
        with torch.no_grad():
            if module._qkv_same_embed_dim:
                wq, wk, wv = module.in_proj_weight.split(e)
            else:
                wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
            for lin, w in ((new.q_proj, wq), (new.k_proj, wk), (new.v_proj, wv)):
                lin.weight.copy_(w)
            if module.in_proj_bias is not None:
                for lin, bias in zip((new.q_proj, new.k_proj, new.v_proj), module.in_proj_bias.split(e), strict=True):
                    lin.bias.copy_(bias)
            new.out_proj.weight.copy_(module.out_proj.weight)
            if module.out_proj.bias is not None:
                new.out_proj.bias.copy_(module.out_proj.bias)
        return new

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kv_heads={self.kv_heads}, "
                f"score={self.score!r}, dropout={self.dropout}{self._mods_repr()}")


def _chain(own: Callable | None, extra: Callable | None, *, scores: bool) -> Callable | None:
    """The layer's modifier and the call's, one after the other (scores) or both required (masks)."""
    if own is None or extra is None:
        return own if extra is None else extra
    from ..mods import and_masks, chain  # (imported here: most calls have one modifier or none)

    return chain(own, extra) if scores else and_masks(own, extra)
