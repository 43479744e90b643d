"""Encoder-decoder models for translation: the fixed-context baseline, Bahdanau and Luong attention.

Axis letters: ``B`` batch, ``S`` source positions, ``T`` target positions, ``V`` vocabulary, ``E``
embedding, ``H`` hidden size.

Every model has the same interface (:class:`EncoderDecoder`), used by training (teacher forcing through
``forward``) and by greedy and beam decoding (``encode`` once, then ``decode_step`` per token):

- ``forward(src, src_mask, tgt_in, return_attention=False) -> logits (B, T, V)`` [, ``attn (B, T, S)``];
- ``encode(src, src_mask) -> state``; ``decode_step(y_prev (B,), state) -> (logits (B, V), attn (B, S), state)``:
  the :class:`~qkv.models.decoding.Decodable` protocol of the one decoder (:func:`~qkv.models.decoding.beam_search`).

Papers, and what differs here:

- Fixed context: Cho et al., 2014, "Learning Phrase Representations using RNN Encoder-Decoder for Statistical
  Machine Translation" (https://arxiv.org/abs/1406.1078): the encoder's last state ``c`` starts the decoder
  and is fed to every step and to the output layer. The "distracted" model: one context for every target word.
- Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and Translate"
  (https://arxiv.org/abs/1409.0473): bidirectional encoder; the decoder state ``s_{i-1}`` queries all encoder
  outputs with the additive score; ``c_i`` enters the GRU with ``y_{i-1}``. Differs: the output layer is
  ``Linear([s_i; c_i; E y_{i-1}])`` without the maxout, and any qkv score can replace the additive one.
- Luong et al., 2015, "Effective Approaches to Attention-based Neural Machine Translation"
  (https://arxiv.org/abs/1508.04025): global attention after the RNN step, ``h~_t = tanh(W_c [c_t; h_t])``,
  input feeding of ``h~_{t-1}``; scores ``dot``, ``general``, ``concat`` (= additive). Differs: a
  bidirectional encoder is allowed (its outputs are projected to the decoder size).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import attention
from ..scores import create_score
from .decoding import reorder_state, teacher_forced

__all__ = ["EncoderDecoder", "RNNConfig", "FixedContextSeq2Seq", "BahdanauSeq2Seq", "LuongSeq2Seq",
           "reorder_state", "check_source", "RNN_MODELS"]


def check_source(src: Tensor, src_mask: Tensor) -> None:
    """A ``ValueError`` unless ``src`` is ``(B, S)`` and ``src_mask`` a bool tensor of the same shape."""
    if src.dim() != 2 or src_mask.shape != src.shape or src_mask.dtype != torch.bool:
        raise ValueError(f"src must be (B, S) token ids and src_mask a bool tensor of the same shape, got "
                         f"{tuple(src.shape)} and {tuple(src_mask.shape)} {src_mask.dtype}")


class EncoderDecoder(nn.Module, ABC):
    """Interface of the translation models (see the module docstring): every model implements the three methods.

    ``forward`` is teacher forcing over a whole target, ``encode`` + ``decode_step`` decode token by token and
    give the same logits as ``forward``; the two are the :class:`~qkv.models.decoding.Decodable` protocol of the
    one decoder (``beam_search(model, src, src_mask, ...)``), whose default :func:`reorder_state` fits every
    state here.
    """

    @abstractmethod
    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, return_attention: bool = False):
        """Teacher forcing: ``src (B, S)``, ``src_mask (B, S)`` bool (True at real tokens), ``tgt_in (B, T)``
        starting with BOS -> ``logits (B, T, V)``; with ``return_attention`` also the alignment ``(B, T, S)``
        (zeros for the fixed-context model)."""

    @abstractmethod
    def encode(self, src: Tensor, src_mask: Tensor) -> dict[str, Any]:
        """The decoding state of a batch of sources: a dict of tensors (and caches), batch first."""

    @abstractmethod
    def decode_step(self, y_prev: Tensor, state: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """One token: ``y_prev (B,)`` -> ``(logits (B, V), alignment (B, S), new state)``."""


@dataclass
class RNNConfig:
    """Sizes of the RNN encoder-decoders."""

    src_vocab: int
    tgt_vocab: int
    embed_dim: int = 128  # E, source and target embeddings
    hidden_dim: int = 256  # H, decoder state and encoder output (each encoder direction has H // 2 if bidirectional)
    num_layers: int = 1  # RNN layers in the encoder and in the decoder
    cell: str = "gru"  # "gru" or "lstm"
    bidirectional: bool = True  # encoder direction(s)
    dropout: float = 0.1  # on embeddings and RNN outputs
    score: str = "additive"  # attention score (Bahdanau, Luong); ignored by the fixed-context model
    attn_dim: int = 256  # hidden size of the additive / MLP score
    pad_id: int = 0

    def __post_init__(self):
        if self.cell not in ("gru", "lstm"):
            raise ValueError(f"cell must be 'gru' or 'lstm', got {self.cell!r}")
        if self.bidirectional and self.hidden_dim % 2:
            raise ValueError(f"a bidirectional encoder needs an even hidden_dim, got {self.hidden_dim}")
        for name in ("src_vocab", "tgt_vocab", "embed_dim", "hidden_dim", "num_layers", "attn_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class RNNEncoder(nn.Module):
    """Embedding + (bi)GRU/LSTM over padded sources: outputs ``(B, S, H)`` and the decoder's first state
    (batch first: ``(B, layers, H)``, a pair for LSTMs)."""

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.src_vocab, cfg.embed_dim, padding_idx=cfg.pad_id)
        directions = 2 if cfg.bidirectional else 1
        self.rnn = rnn(cfg.embed_dim, cfg.hidden_dim // directions, num_layers=cfg.num_layers, batch_first=True,
                       bidirectional=cfg.bidirectional, dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(cfg.dropout)
        # the decoder's initial state from the encoder's final state(s) (Bahdanau: tanh(W_s h_1^<-))
        self.bridge = nn.Linear(cfg.hidden_dim, cfg.hidden_dim)

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Any]:
        check_source(src, src_mask)
        lengths = src_mask.sum(dim=1).clamp(min=1).cpu()
        x = self.dropout(self.embed(src))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        h = final[0] if isinstance(final, tuple) else final  # (layers * directions, B, H / directions)
        b = src.shape[0]
        h = h.view(self.cfg.num_layers, -1, b, h.shape[-1]).transpose(1, 2).reshape(self.cfg.num_layers, b, -1)
        h0 = torch.tanh(self.bridge(h)).transpose(0, 1)  # (B, layers, H)
        state = (h0, torch.zeros_like(h0)) if self.cfg.cell == "lstm" else h0
        return self.dropout(out), state


def _batch_first(hidden: Any) -> Any:
    """An RNN state ``(layers, B, H)`` (a pair for LSTMs) as ``(B, layers, H)``: decoding states are batch first."""
    if isinstance(hidden, tuple):
        return tuple(h.transpose(0, 1) for h in hidden)
    return hidden.transpose(0, 1)


def _layers_first(hidden: Any) -> Any:
    """Inverse of :func:`_batch_first`, for calling the RNN."""
    if isinstance(hidden, tuple):
        return tuple(h.transpose(0, 1).contiguous() for h in hidden)
    return hidden.transpose(0, 1).contiguous()


def _top(hidden: Any) -> Tensor:
    """The top layer's hidden state ``(B, H)`` of a batch-first GRU or LSTM state."""
    return (hidden[0] if isinstance(hidden, tuple) else hidden)[:, -1]


def _step(rnn: nn.Module, x: Tensor, hidden: Any) -> tuple[Tensor, Any]:
    """One RNN step on ``x (B, F)`` from a batch-first state: ``(output (B, 1, H), new batch-first state)``."""
    out, new = rnn(x[:, None], _layers_first(hidden))
    return out, _batch_first(new)


class _RNNSeq2Seq(EncoderDecoder):
    """What the three RNN models share: the encoder, the target embedding, a decoder RNN reading
    ``[E y_{i-1}; x_i]`` (``x_i`` of size ``H``: a context or the input-fed state) and the output layer."""

    def __init__(self, cfg: RNNConfig, out_features: int):
        super().__init__()
        self.cfg = cfg
        rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
        self.encoder = RNNEncoder(cfg)
        self.embed = nn.Embedding(cfg.tgt_vocab, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.rnn = rnn(cfg.embed_dim + cfg.hidden_dim, cfg.hidden_dim, num_layers=cfg.num_layers, batch_first=True,
                       dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(out_features, cfg.tgt_vocab)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, return_attention: bool = False):
        # step by step, with the output layer applied once to every step's features: one (B*T, F) x (F, V)
        # product and one weight gradient instead of T of each (the largest layer)
        (features, attns), _ = teacher_forced(self.step_features, tgt_in, self.encode(src, src_mask))
        logits = self.out(features)
        return (logits, attns) if return_attention else logits

    def decode_step(self, y_prev, state):
        f, attn, state = self.step_features(y_prev, state)
        return self.out(f), attn, state

    @abstractmethod
    def step_features(self, y_prev: Tensor, state: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """One decoder step up to the output layer: ``(features (B, F), alignment (B, S), new state)``."""


class FixedContextSeq2Seq(_RNNSeq2Seq):
    """The "distracted" model: one context vector ``c`` for the whole target (Cho et al., 2014)."""

    def __init__(self, cfg: RNNConfig):
        super().__init__(cfg, 2 * cfg.hidden_dim + cfg.embed_dim)

    def encode(self, src, src_mask):
        _, hidden = self.encoder(src, src_mask)
        context = _top(hidden)
        return {"hidden": hidden, "context": context, "no_attn": torch.zeros(src.shape, dtype=context.dtype,
                                                                               device=src.device)}

    def step_features(self, y_prev, state):
        e = self.dropout(self.embed(y_prev))
        c = state["context"]
        out, hidden = _step(self.rnn, torch.cat([e, c], -1), state["hidden"])
        s = self.dropout(out[:, 0])
        return torch.cat([s, c, e], -1), state["no_attn"], {**state, "hidden": hidden}  # all-zero alignment


class BahdanauSeq2Seq(_RNNSeq2Seq):
    """Additive attention with the previous decoder state as the query (Bahdanau et al., 2015)."""

    def __init__(self, cfg: RNNConfig):
        super().__init__(cfg, 2 * cfg.hidden_dim + cfg.embed_dim)
        self.score = create_score(cfg.score, cfg.hidden_dim, cfg.hidden_dim, cfg.attn_dim)

    def encode(self, src, src_mask):
        memory, hidden = self.encoder(src, src_mask)
        # the key-only part of the score (Bahdanau's U_a h_j) once per sentence, not once per target word
        return {"memory": memory, "keys": self.score.prepare_key(memory), "mask": src_mask[:, None, :],
                "hidden": hidden}

    def step_features(self, y_prev, state):
        e = self.dropout(self.embed(y_prev))
        query = _top(state["hidden"])[:, None]  # s_{i-1}: (B, 1, H)
        c, w = attention(query, state["keys"], state["memory"], score=self.score, mask=state["mask"],
                         return_weights=True, key_prepared=True)
        c = c[:, 0]
        out, hidden = _step(self.rnn, torch.cat([e, c], -1), state["hidden"])
        s = self.dropout(out[:, 0])
        return torch.cat([s, c, e], -1), w[:, 0], {**state, "hidden": hidden}


class LuongSeq2Seq(_RNNSeq2Seq):
    """Global attention after the RNN step, with input feeding (Luong et al., 2015)."""

    def __init__(self, cfg: RNNConfig):
        super().__init__(cfg, cfg.hidden_dim)
        h = cfg.hidden_dim
        self.score = create_score(cfg.score, h, h, cfg.attn_dim)
        self.combine = nn.Linear(2 * h, h, bias=False)  # W_c

    def encode(self, src, src_mask):
        memory, hidden = self.encoder(src, src_mask)
        feed = torch.zeros(src.shape[0], self.cfg.hidden_dim, dtype=memory.dtype, device=memory.device)
        return {"memory": memory, "keys": self.score.prepare_key(memory), "mask": src_mask[:, None, :],
                "hidden": hidden, "feed": feed}

    def step_features(self, y_prev, state):
        e = self.dropout(self.embed(y_prev))
        out, hidden = _step(self.rnn, torch.cat([e, state["feed"]], -1), state["hidden"])  # input feeding
        h_t = out  # (B, 1, H)
        c, w = attention(h_t, state["keys"], state["memory"], score=self.score, mask=state["mask"],
                         return_weights=True, key_prepared=True)
        h_tilde = self.dropout(torch.tanh(self.combine(torch.cat([c, h_t], -1)[:, 0])))
        return h_tilde, w[:, 0], {**state, "hidden": hidden, "feed": h_tilde}


RNN_MODELS = {"fixed": FixedContextSeq2Seq, "bahdanau": BahdanauSeq2Seq, "luong": LuongSeq2Seq}
