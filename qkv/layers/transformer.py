"""The pre-norm Transformer layer, its feed-forward network and positional encodings, shared by every model.

Paper: Vaswani et al., 2017, "Attention Is All You Need" (https://arxiv.org/abs/1706.03762): self-attention,
optional cross-attention over an encoder's output, and a position-wise feed-forward network, each a residual
sub-layer with dropout; sinusoidal positions added to the token embeddings.

What differs here:

- **Pre-norm** (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture",
  https://arxiv.org/abs/2002.04745): ``x + Dropout(Sublayer(LayerNorm(x)))`` instead of the paper's post-norm
  ``LayerNorm(x + Dropout(Sublayer(x)))``; a model ends its stack with one more LayerNorm.
- Learned positions (``kind="learned"``, as BERT and GPT) as an alternative to the sinusoids.
- Any qkv score can replace the scaled dot product, and ``kv_heads`` gives grouped-query attention (Ainslie et
  al., 2023); the feed-forward activation may be GELU (Hendrycks & Gimpel, 2016) instead of ReLU.
- ``context=``: queries that are a subset of the sequence (a classifier's [CLS] row) attend over the whole of
  it, normalised by the same LayerNorm, so that only the rows needed are computed.

Axis letters: ``B`` batch, ``T`` positions of ``x``, ``Tc`` of the context, ``S`` of the memory, ``E`` model
width (``dim``), ``F`` feed-forward width (``ffn_dim``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..scores import Score
from .multihead import KVCache, MultiHeadAttention

__all__ = ["sinusoidal_positions", "PositionalEncoding", "FeedForward", "TransformerLayer"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU}


def sinusoidal_positions(length: int, dim: int, *, device=None, dtype=None) -> Tensor:
    """``(length, dim)``: ``PE[p, 2i] = sin(p / 10000^(2i/dim))``, ``PE[p, 2i+1] = cos(...)`` (Vaswani et al.).

    Computed in float64 (on the CPU) and then cast to ``dtype`` (default: torch's default dtype) on ``device``.
    """
    if length < 0 or dim < 1:
        raise ValueError(f"length must be >= 0 and dim >= 1, got length={length}, dim={dim}")
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pe = torch.zeros(length, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)[:, :dim // 2]
    return pe.to(device=device, dtype=dtype or torch.get_default_dtype())


class PositionalEncoding(nn.Module):
    """Adds the positions ``start .. start + L - 1`` to ``x (B, L, E)``: sinusoids or a learned table.

    Args:
        dim: ``E``.  max_len: the number of positions (a longer input raises).
        kind: ``"sinusoidal"`` (a fixed, non-persistent buffer ``sinusoids``; ``dim`` must be even) or
            ``"learned"`` (``table``, an ``nn.Embedding(max_len, dim)`` initialised ``N(0, 0.02^2)``).
    """

    def __init__(self, dim: int, max_len: int = 256, kind: str = "sinusoidal"):
        super().__init__()
        if kind not in ("sinusoidal", "learned"):
            raise ValueError(f"kind must be 'sinusoidal' or 'learned', got {kind!r}")
        if dim < 1 or max_len < 1:
            raise ValueError(f"dim and max_len must be positive, got dim={dim}, max_len={max_len}")
        if kind == "sinusoidal" and dim % 2:
            raise ValueError(f"sinusoidal positions need an even dim, got {dim}")
        self.dim, self.max_len, self.kind = dim, max_len, kind
        if kind == "learned":
            self.table = nn.Embedding(max_len, dim)
        else:
            self.register_buffer("sinusoids", sinusoidal_positions(max_len, dim), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.kind == "learned":
            nn.init.normal_(self.table.weight, std=0.02)

    def positions(self, start: int, length: int) -> Tensor:
        """Rows ``start .. start + length - 1`` of the table, ``(length, E)``."""
        if start < 0 or start + length > self.max_len:
            raise ValueError(f"positions {start}..{start + length - 1} are beyond max_len ({self.max_len}); "
                             "build the model with a larger max_len")
        table = self.table.weight if self.kind == "learned" else self.sinusoids
        return table[start:start + length]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``x (B, L, E)`` -> ``x + positions[start:start + L]``."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (B, L, E={self.dim}), got {tuple(x.shape)}")
        return x + self.positions(start, x.shape[1]).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, kind={self.kind!r}"


class FeedForward(nn.Module):
    """Position-wise ``Linear(E, F) -> activation -> Dropout -> Linear(F, E)``.

    Args:
        dim: ``E``.  ffn_dim: ``F``.  dropout: on the hidden layer.  activation: ``"relu"`` or ``"gelu"``.
    """

    def __init__(self, dim: int, ffn_dim: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(_ACTIVATIONS)}, got {activation!r}")
        if dim < 1 or ffn_dim < 1:
            raise ValueError(f"dim and ffn_dim must be positive, got dim={dim}, ffn_dim={ffn_dim}")
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.act = _ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(ffn_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., E) -> (..., E)``."""
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class TransformerLayer(nn.Module):
    """Pre-norm Transformer layer: self-attention, optional cross-attention, feed-forward network.

    Args:
        dim: ``E``.  num_heads: attention heads (must divide ``E``).  ffn_dim: ``F`` (default ``4 * E``).
        dropout: on the attention weights, every sub-layer's output and the feed-forward hidden layer.
        activation: of the feed-forward network, ``"relu"`` or ``"gelu"``.
        cross_attention: add cross-attention over a ``memory`` (a decoder layer).
        kv_heads: key/value heads (grouped-query attention); default ``num_heads``.
        score: the score of every attention (see :class:`qkv.MultiHeadAttention`).
        score_mod, mask_mod: modifiers of the self-attention (:mod:`qkv.mods`), e.g. ALiBi.

    Submodules: ``attn_norm``, ``self_attn``, (``cross_norm``, ``cross_attn``), ``ffn_norm``, ``ffn``, ``dropout``.

    Example:
        >>> layer = TransformerLayer(64, 4, cross_attention=True)
        >>> y, w = layer(torch.randn(2, 5, 64), is_causal=True, memory=torch.randn(2, 7, 64), return_weights=True)
        >>> y.shape, w.shape                     # (B, T, E), cross-attention (B, T, S)
        (torch.Size([2, 5, 64]), torch.Size([2, 5, 7]))
    """

    def __init__(self, dim: int, num_heads: int, ffn_dim: int | None = None, *, dropout: float = 0.0,
                 activation: str = "relu", cross_attention: bool = False, kv_heads: int | None = None,
                 score: str | Score | Callable = "scaled_dot", score_mod: Callable | None = None,
                 mask_mod: Callable | None = None):
        super().__init__()
        if dim < 1 or num_heads < 1 or dim % num_heads:
            raise ValueError(f"dim ({dim}) must be a positive multiple of num_heads ({num_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(_ACTIVATIONS)}, got {activation!r}")
        ffn_dim = 4 * dim if ffn_dim is None else ffn_dim
        if ffn_dim < 1:
            raise ValueError(f"ffn_dim must be positive, got {ffn_dim}")
        self.dim, self.cross_attention = dim, cross_attention
        self.attn_norm = nn.LayerNorm(dim)
        self.self_attn = MultiHeadAttention(dim, num_heads, kv_heads=kv_heads, dropout=dropout, score=score,
                                            score_mod=score_mod, mask_mod=mask_mod)
        if cross_attention:
            self.cross_norm = nn.LayerNorm(dim)
            self.cross_attn = MultiHeadAttention(dim, num_heads, kv_heads=kv_heads, dropout=dropout, score=score)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, dropout, activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, is_causal: bool = False,
                context: Tensor | None = None, memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: KVCache | None = None, return_weights: bool = False,
                score_mod: Callable | None = None, mask_mod: Callable | None = None):
        """One layer.

        Args:
            x: ``(B, T, E)``.
            key_mask: ``(B, Tc)`` bool, True at the keys that may be attended to (``Tc = T`` without context).
            is_causal: causal self-attention (aligned bottom right after a cache).
            context: ``(B, Tc, E)``: the sequence ``x`` attends over instead of itself (``x`` being a few of
                its rows, e.g. a [CLS] query); normalised by the same ``attn_norm``.
            memory: ``(B, S, E)``, the encoder's output for the cross-attention.  memory_mask: ``(B, S)`` bool.
            cache: :class:`~qkv.layers.KVCache` of the self-attention (token-by-token decoding).
            cross_cache: a static :class:`~qkv.layers.KVCache` of the cross-attention's keys and values.
            score_mod, mask_mod: modifiers of this call's self-attention (after the layer's own), e.g. a bias
                module shared by the layers of a stack, or the documents of packed sequences.
            return_weights: also return the attention weights averaged over heads: the cross-attention's
                ``(B, T, S)`` when the layer has one, else the self-attention's ``(B, T, Tc)``.

        Returns:
            ``(B, T, E)``, or ``(output, weights)`` when ``return_weights``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (B, T, E={self.dim}), got {tuple(x.shape)}")
        if context is not None and (context.dim() != 3 or context.shape[0] != x.shape[0]
                                    or context.shape[-1] != self.dim):
            raise ValueError(f"context must be (B={x.shape[0]}, Tc, E={self.dim}), got {tuple(context.shape)}")
        if not self.cross_attention and (memory is not None or memory_mask is not None or cross_cache is not None):
            raise ValueError("memory, memory_mask and cross_cache need a layer built with cross_attention=True")
        if self.cross_attention and memory is None:
            raise ValueError("memory (B, S, E) is required by a layer with cross-attention")
        want_self = return_weights and not self.cross_attention
        h = self.attn_norm(x)
        kv = h if context is None else self.attn_norm(context)
        out = self.self_attn(h, kv, key_mask=key_mask, is_causal=is_causal, cache=cache, return_weights=want_self,
                             score_mod=score_mod, mask_mod=mask_mod)
        out, weights = out if want_self else (out, None)
        x = x + self.dropout(out)
        if self.cross_attention:
            out = self.cross_attn(self.cross_norm(x), memory, key_mask=memory_mask, cache=cross_cache,
                                  return_weights=return_weights)
            out, weights = out if return_weights else (out, None)
            x = x + self.dropout(out)
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return (x, weights) if return_weights else x

    def extra_repr(self) -> str:
        return f"dim={self.dim}, cross_attention={self.cross_attention}"
