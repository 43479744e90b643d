"""The Transformer speech recogniser: strided convolutions shorten the log-mel frames 4x, a stack of self-attention
layers encodes them, and a causal decoder spells characters with cross-attention to the frames (Dong et al., 2018,
"Speech-Transformer", https://ieeexplore.ieee.org/document/8462506; their 2-D convolutions are 1-D here). An
optional CTC head on the encoder makes it a hybrid, as :class:`~qkv.models.speech.LAS`.

Axis letters as in :mod:`qkv.models.speech`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.tokenize import PAD_ID
from ..layers import KVCache, PositionalEncoding, TransformerLayer
from .speech import SpeechOutput, frames_mask

__all__ = ["SpeechTransformer"]


class SpeechTransformer(nn.Module):
    """Encoder-decoder Transformer on log-mel features (module docstring).

    Args:
        vocab_size: ``V``.  n_mels: ``M``.  dim, num_heads, ffn_dim (default ``4 * dim``): the layers' sizes.
        num_layers: encoder layers.  num_decoder_layers: decoder layers (default ``num_layers``).
        max_len: longest transcript, in characters (sinusoidal positions of the decoder).  max_frames: longest
            input after the convolutions (sinusoidal positions of the encoder).  ctc: a CTC head.
    """

    def __init__(self, vocab_size: int, n_mels: int, *, dim: int = 144, num_heads: int = 4, ffn_dim: int | None = None,
                 num_layers: int = 4, num_decoder_layers: int | None = None, max_len: int = 1024,
                 max_frames: int = 2048, ctc: bool = False, dropout: float = 0.1):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(n_mels, dim, 5, stride=2, padding=2),
                                    nn.Conv1d(dim, dim, 5, stride=2, padding=2)])
        self.frame_positions = PositionalEncoding(dim, max_frames)
        self.encoder = nn.ModuleList(TransformerLayer(dim, num_heads, ffn_dim, dropout=dropout)
                                     for _ in range(num_layers))
        self.encoder_norm = nn.LayerNorm(dim)
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=PAD_ID)
        self.positions = PositionalEncoding(dim, max_len)
        self.max_len = max_len
        self.layers = nn.ModuleList(TransformerLayer(dim, num_heads, ffn_dim, dropout=dropout, cross_attention=True)
                                    for _ in range(num_decoder_layers or num_layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab_size)
        self.ctc_head = nn.Linear(dim, vocab_size) if ctc else None
        self.dropout = nn.Dropout(dropout)
        self.dim = dim

    def _listen(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = features.transpose(1, 2)
        for conv in self.convs:  # padding zeroed first: a frame near the end reads no padding
            x = F.gelu(conv(x * frames_mask(lengths, x.shape[-1])[:, None]))
            lengths = (lengths + 1) // 2
        x = x.transpose(1, 2)
        lengths = lengths.clamp(min=1, max=x.shape[1])
        mask = frames_mask(lengths, x.shape[1])
        x = self.dropout(self.frame_positions(x))
        for layer in self.encoder:
            x = layer(x, key_mask=mask)
        return self.encoder_norm(x), lengths, mask

    def encode(self, features: Tensor, lengths: Tensor) -> dict:
        """The decoding state: the encoder's output ``(B, S, dim)``, its mask and lengths, empty key/value caches
        (and the CTC log-probabilities with a CTC head)."""
        memory, out_lengths, mask = self._listen(features, lengths)
        state = {"memory": memory, "mask": mask, "lengths": out_lengths,
                 "self_cache": [KVCache() for _ in self.layers],
                 "cross_cache": [KVCache(static=True) for _ in self.layers]}
        if self.ctc_head is not None:
            state["ctc_log_probs"] = torch.log_softmax(self.ctc_head(memory).float(), -1)
        return state

    def _decode(self, tokens: Tensor, start: int, memory: Tensor, mask: Tensor, caches=None) -> tuple[Tensor, Tensor]:
        y = self.dropout(self.positions(self.embed(tokens) * self.dim ** 0.5, start))
        attn = None
        for i, layer in enumerate(self.layers):
            cache, cross = (None, None) if caches is None else (caches[0][i], caches[1][i])
            y, attn = layer(y, is_causal=True, memory=memory, memory_mask=mask, cache=cache, cross_cache=cross,
                            return_weights=True)
        return self.out(self.norm(y)), attn

    def forward(self, features: Tensor, lengths: Tensor, tgt_in: Tensor) -> SpeechOutput:
        """Teacher forcing over the whole transcript at once (causal mask)."""
        memory, out_lengths, mask = self._listen(features, lengths)
        logits, attn = self._decode(tgt_in, 0, memory, mask)
        ctc = self.ctc_head(memory) if self.ctc_head is not None else None
        return SpeechOutput(logits, attn, ctc, out_lengths)

    def decode_step(self, tokens: Tensor, state: dict) -> tuple[Tensor, Tensor, dict]:
        pos = state["self_cache"][0].length
        logits, attn = self._decode(tokens[:, None], pos, state["memory"], state["mask"],
                                    (state["self_cache"], state["cross_cache"]))
        return logits[:, 0], attn[:, 0], state
