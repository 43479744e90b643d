"""The Transformer captioner: causal self-attention over the words, cross-attention to a CNN feature grid.

Part of :mod:`qkv.models.captioning` (re-exported and registered there as ``caption-transformer``); built on
:mod:`~qkv.models.caption_base` and :mod:`~qkv.models.caption_encoder`, never on :mod:`~qkv.models.captioning`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..layers import KVCache, PositionalEncoding, TransformerLayer
from .caption_base import CaptionLosses, CaptionOutput, rows_of
from .caption_encoder import GridEncoder

__all__ = ["TransformerCaptioner"]


class TransformerCaptioner(CaptionLosses, nn.Module):
    """A Transformer decoder over the grid: causal self-attention over the words, cross-attention to the
    annotations (projected to ``dim``, plus a learned embedding of each grid position), pre-norm
    :class:`~qkv.layers.TransformerLayer` s. ``attention`` is the last layer's cross-attention averaged over heads.

    ``max_len``: longest caption (positions of the learned word-position table); ``grid``: positions ``L`` of the
    feature grid the position table is made for (``(image_size / 8) ** 2``).
    """

    def __init__(self, vocab_size: int, *, in_channels: int = 1, widths: Sequence[int] = (16, 32, 64, 128),
                 dim: int = 128, num_heads: int = 4, ffn_dim: int | None = None, num_layers: int = 2,
                 dropout: float = 0.1, score: str = "scaled_dot", coords: bool = True, max_len: int = 64,
                 grid: int = 64, padding: str = "zeros"):
        super().__init__()
        self.encoder = GridEncoder(in_channels, widths, coords=coords, padding=padding)
        self.memory_proj = nn.Linear(self.encoder.dim, dim)
        self.grid_pos = nn.Parameter(torch.randn(grid, dim) * 0.02)
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.positions = PositionalEncoding(dim, max_len, "learned")
        self.layers = nn.ModuleList(TransformerLayer(dim, num_heads, ffn_dim, dropout=dropout, cross_attention=True,
                                                     score=score) for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab_size)
        self.dropout = nn.Dropout(dropout)
        self.dim = dim

    def encode(self, images: Tensor) -> dict:
        """The decoding state: the memory ``(B, L, dim)`` and empty key/value caches."""
        a, grid = self.encoder(images)
        if a.shape[1] != self.grid_pos.shape[0]:
            raise ValueError(f"images give a {grid[0]}x{grid[1]} grid ({a.shape[1]} positions) but the model was "
                             f"built for {self.grid_pos.shape[0]}")
        memory = self.memory_proj(a) + self.grid_pos
        return {"memory": memory, "grid": grid, "self_cache": [KVCache() for _ in self.layers],
                "cross_cache": [KVCache(static=True) for _ in self.layers]}

    def _decode(self, tokens: Tensor, start: int, memory: Tensor, caches=None) -> tuple[Tensor, Tensor]:
        y = self.dropout(self.positions(self.embed(tokens) * self.dim ** 0.5, start))
        attn = None
        for i, layer in enumerate(self.layers):
            cache, cross = (None, None) if caches is None else (caches[0][i], caches[1][i])
            y, attn = layer(y, is_causal=True, memory=memory, cache=cache, cross_cache=cross, return_weights=True)
        return self.out(self.norm(y)), attn

    def forward(self, images: Tensor, tgt_in: Tensor, owner: Tensor | None = None) -> CaptionOutput:
        """Teacher forcing over the whole caption at once (causal mask); ``owner`` as for the LSTM captioners."""
        state = rows_of(self.encode(images), owner)
        logits, attn = self._decode(tgt_in, 0, state["memory"])
        return CaptionOutput(logits, attn)

    def decode_step(self, y_prev: Tensor, state: dict) -> tuple[Tensor, Tensor, dict]:
        pos = state["self_cache"][0].length
        logits, attn = self._decode(y_prev[:, None], pos, state["memory"],
                                    (state["self_cache"], state["cross_cache"]))
        return logits[:, 0], attn[:, 0], state
