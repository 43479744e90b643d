"""Transformer encoder-decoder for translation, built from :class:`qkv.layers.TransformerLayer`.

Paper: Vaswani et al., 2017, "Attention Is All You Need" (https://arxiv.org/abs/1706.03762): token
embeddings scaled by ``sqrt(d_model)`` plus sinusoidal positions; encoder layers of self-attention and a
position-wise feed-forward network; decoder layers of causal self-attention, cross-attention over the
encoder's output and the feed-forward network; residual connections and dropout around every sub-layer.

What differs here:

- **Pre-norm** (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture",
  https://arxiv.org/abs/2002.04745): ``x + Dropout(Sublayer(LayerNorm(x)))`` with a final LayerNorm after the
  last encoder and decoder layer, instead of the paper's post-norm ``LayerNorm(x + Dropout(Sublayer(x)))``;
  it trains without a long warm-up. The layer is :class:`qkv.layers.TransformerLayer`.
- Optional learned positions (``positions="learned"``, one table for each side) instead of the sinusoids, or
  no position embedding but a bias on the self-attention scores (:mod:`qkv.mods`): ``positions="alibi"`` (ALiBi,
  symmetric in the encoder, causal in the decoder; it extrapolates beyond ``max_len``) or ``positions="relative"``
  (T5's learned bias per distance bucket, one for each stack, shared by its layers).
- Sharing of the source and target embeddings and tying of the output projection to the target embedding
  (Press & Wolf, 2017, https://arxiv.org/abs/1608.05859) are options; the paper shares all three. Embeddings
  are initialised ``N(0, dim^-0.5)`` so that the scaled embeddings have unit variance.
- Any qkv score (``score="cosine"``, ``"general"``, ...) can replace the scaled dot product in every
  attention, ``kv_heads`` gives grouped-query attention (Ainslie et al., 2023), and the feed-forward
  activation may be GELU.
- The output layer has no bias. Label smoothing and the learning-rate schedule belong to the trainer.

Axis letters: ``B`` batch, ``S`` source positions, ``T`` target positions, ``V`` vocabulary, ``E`` model
width (``dim``, the paper's ``d_model``).

Incremental decoding (:meth:`TransformerSeq2Seq.decode_step`) keeps a :class:`~qkv.layers.KVCache` of the
self-attention keys/values of every decoder layer, and a static one of the cross-attention keys/values
(projected once from the encoder's output), so that a step attends over the cache instead of re-running the
prefix. ``encode`` + ``decode_step`` are the :class:`~qkv.models.decoding.Decodable` protocol of the one decoder
(``beam_search(model, src, src_mask, ...)``); the default :func:`~qkv.models.decoding.reorder_state` reorders
the caches by beam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..layers import KVCache, PositionalEncoding, TransformerLayer
from ..mods import alibi, relative_position_bias
from ..scores import score_names
from .seq2seq import EncoderDecoder

__all__ = ["TransformerConfig", "TransformerSeq2Seq"]


#: position encodings: added to the embeddings (sinusoidal, learned) or biasing the self-attention's scores
POSITIONS = ("sinusoidal", "learned", "alibi", "relative")


@dataclass
class TransformerConfig:
    """Sizes and options of :class:`TransformerSeq2Seq` (defaults: a small model for CPU training)."""

    src_vocab: int
    tgt_vocab: int
    dim: int = 256  # E (d_model), embeddings and every layer's input/output
    num_heads: int = 4  # attention heads; must divide dim
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None = num_heads
    ffn_dim: int = 1024  # hidden size of the position-wise feed-forward network
    num_layers: int = 3  # encoder layers (and decoder layers unless num_decoder_layers is given)
    num_decoder_layers: int | None = None  # None = num_layers
    dropout: float = 0.1  # on embeddings, attention weights, sub-layer outputs and the FFN hidden layer
    positions: str = "sinusoidal"  # "sinusoidal", "learned", or a score bias: "alibi" or "relative" (T5)
    max_len: int = 256  # longest source or target sequence (size of the position table)
    share_embeddings: bool = False  # one embedding for source and target (needs src_vocab == tgt_vocab)
    tie_output: bool = True  # output projection weight = target embedding weight
    score: str = "scaled_dot"  # score of every attention: any name in qkv.scores.score_names()
    activation: str = "relu"  # of the feed-forward network: "relu" or "gelu"
    pad_id: int = 0

    def __post_init__(self):
        for name in ("src_vocab", "tgt_vocab", "dim", "num_heads", "ffn_dim", "num_layers", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_decoder_layers is not None and self.num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers must be positive or None, got {self.num_decoder_layers}")
        if self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.num_heads % self.kv_heads):
            raise ValueError(f"kv_heads ({self.kv_heads}) must be a positive divisor of num_heads ({self.num_heads})")
        if self.positions == "sinusoidal" and self.dim % 2:
            raise ValueError(f"sinusoidal positions need an even dim, got {self.dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {self.activation!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_embeddings needs src_vocab == tgt_vocab, got {self.src_vocab} and "
                             f"{self.tgt_vocab}")
        if self.score not in score_names():
            raise ValueError(f"unknown score {self.score!r}; expected one of {score_names()}")
        if not 0 <= self.pad_id < min(self.src_vocab, self.tgt_vocab):
            raise ValueError(f"pad_id ({self.pad_id}) must be a token id of both vocabularies")

    @property
    def decoder_layers(self) -> int:
        """The number of decoder layers (``num_decoder_layers``, or ``num_layers`` when it is None)."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers


class TransformerSeq2Seq(EncoderDecoder):
    """Pre-norm Transformer encoder-decoder with the :class:`~qkv.models.seq2seq.EncoderDecoder` interface.

    ``forward`` runs the whole target at once under a causal mask (teacher forcing); ``encode`` +
    ``decode_step`` decode token by token with key/value caches and give the same logits.

    Example:
        >>> cfg = TransformerConfig(src_vocab=100, tgt_vocab=120, dim=64, num_heads=4, ffn_dim=128)
        >>> model = TransformerSeq2Seq(cfg).eval()
        >>> src = torch.randint(4, 100, (2, 7)); src_mask = torch.ones(2, 7, dtype=torch.bool)
        >>> logits, attn = model(src, src_mask, torch.ones(2, 5, dtype=torch.long), return_attention=True)
        >>> logits.shape, attn.shape        # (B, T, V), (B, T, S)
        (torch.Size([2, 5, 120]), torch.Size([2, 5, 7]))
        >>> state = model.encode(src, src_mask)
        >>> step_logits, step_attn, state = model.decode_step(torch.ones(2, dtype=torch.long), state)
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        e = cfg.dim
        self.src_embed = nn.Embedding(cfg.src_vocab, e, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab, e,
                                                                                  padding_idx=cfg.pad_id)
        # learned positions: one table per side; the sinusoids are one buffer for both; score biases: none
        added = cfg.positions in ("sinusoidal", "learned")
        self.src_pos = PositionalEncoding(e, cfg.max_len, cfg.positions) if added else None
        self.tgt_pos = PositionalEncoding(e, cfg.max_len, "learned") if cfg.positions == "learned" else self.src_pos
        # score biases: one per stack, given to each of its layers' self-attention
        self.src_bias = self.tgt_bias = None
        if cfg.positions == "alibi":
            self.src_bias, self.tgt_bias = alibi(cfg.num_heads, symmetric=True), alibi(cfg.num_heads)
        elif cfg.positions == "relative":
            self.src_bias = relative_position_bias(num_heads=cfg.num_heads, bidirectional=True)
            self.tgt_bias = relative_position_bias(num_heads=cfg.num_heads, bidirectional=False)
        self.dropout = nn.Dropout(cfg.dropout)
        layer = dict(dropout=cfg.dropout, activation=cfg.activation, kv_heads=cfg.kv_heads, score=cfg.score)
        self.encoder = nn.ModuleList(TransformerLayer(e, cfg.num_heads, cfg.ffn_dim, **layer)
                                     for _ in range(cfg.num_layers))
        self.encoder_norm = nn.LayerNorm(e)
        self.decoder = nn.ModuleList(TransformerLayer(e, cfg.num_heads, cfg.ffn_dim, cross_attention=True, **layer)
                                     for _ in range(cfg.decoder_layers))
        self.decoder_norm = nn.LayerNorm(e)
        self.out = nn.Linear(e, cfg.tgt_vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings ``N(0, E^-0.5)`` (padding row zero), learned positions ``N(0, 0.02^2)``; the attention
        layers keep their own init."""
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.cfg.dim ** -0.5)
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()
        for pos in {self.src_pos, self.tgt_pos} - {None}:
            pos.reset_parameters()
        if self.cfg.tie_output:
            self.out.weight = self.tgt_embed.weight
        else:
            nn.init.normal_(self.out.weight, std=self.cfg.dim ** -0.5)

    # --- embeddings ---------------------------------------------------------------------------------------
    def _embed(self, tokens: Tensor, start: int, side: str) -> Tensor:
        """``tokens (B, L)`` at positions ``start .. start + L - 1`` -> ``(B, L, E)``."""
        embed, pos = (self.src_embed, self.src_pos) if side == "source" else (self.tgt_embed, self.tgt_pos)
        x = embed(tokens) * math.sqrt(self.cfg.dim)
        return self.dropout(x if pos is None else pos(x, start))

    # --- encoder ------------------------------------------------------------------------------------------
    def _encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        if src.dim() != 2 or src_mask.shape != src.shape or src_mask.dtype != torch.bool:
            raise ValueError(f"src must be (B, S) token ids and src_mask a bool (B, S) tensor, got "
                             f"{tuple(src.shape)} and {tuple(src_mask.shape)} {src_mask.dtype}")
        x = self._embed(src, 0, "source")
        for layer in self.encoder:
            x = layer(x, key_mask=src_mask, score_mod=self.src_bias)
        return self.encoder_norm(x)

    def encode(self, src: Tensor, src_mask: Tensor) -> dict[str, Any]:
        """The decoding state: encoder output, source mask and empty caches (their length is the next position)."""
        memory = self._encode(src, src_mask)
        return {"memory": memory, "src_mask": src_mask,
                "self_cache": [KVCache() for _ in self.decoder],
                "cross_cache": [KVCache(static=True) for _ in self.decoder]}

    # --- decoder ------------------------------------------------------------------------------------------
    def _decode(self, y: Tensor, memory: Tensor, src_mask: Tensor, caches=None, return_attention: bool = False):
        """``y (B, T, E)`` -> ``logits (B, T, V)`` and the last layer's cross-attention ``(B, T, S)`` (or None)."""
        last = len(self.decoder) - 1
        attn = None
        for i, layer in enumerate(self.decoder):
            cache, cross_cache = (None, None) if caches is None else (caches[0][i], caches[1][i])
            want = return_attention and i == last
            y = layer(y, is_causal=True, memory=memory, memory_mask=src_mask, cache=cache, cross_cache=cross_cache,
                      return_weights=want, score_mod=self.tgt_bias)
            y, attn = y if want else (y, attn)
        return self.out(self.decoder_norm(y)), attn

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, return_attention: bool = False):
        """Teacher forcing over the whole target in parallel.

        Args:
            src: ``(B, S)`` source ids.  src_mask: ``(B, S)`` bool, True at real tokens.
            tgt_in: ``(B, T)`` target ids starting with BOS (right-padded; padding only follows real tokens,
                so the causal mask keeps it out of every real position).
            return_attention: also return the last decoder layer's cross-attention averaged over heads.

        Returns:
            ``logits (B, T, V)``, or ``(logits, attention (B, T, S))``.
        """
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"tgt_in must be (B={src.shape[0]}, T) token ids, got {tuple(tgt_in.shape)}")
        memory = self._encode(src, src_mask)
        logits, attn = self._decode(self._embed(tgt_in, 0, "target"), memory, src_mask,
                                    return_attention=return_attention)
        return (logits, attn) if return_attention else logits

    def decode_step(self, y_prev: Tensor, state: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """One token: ``y_prev (B,)`` -> ``(logits (B, V), cross-attention (B, S), state)``.

        The caches in ``state`` are updated in place (the returned state is the same dict); the target
        position is the number of tokens already in the self-attention cache.
        """
        pos = state["self_cache"][0].length
        y = self._embed(y_prev[:, None], pos, "target")
        logits, attn = self._decode(y, state["memory"], state["src_mask"],
                                    caches=(state["self_cache"], state["cross_cache"]), return_attention=True)
        return logits[:, 0], attn[:, 0], state
