"""Pointer-generator networks: attention that is also a distribution over source words to copy, with coverage.

Paper: See, Liu & Manning, 2017, "Get To The Point: Summarization with Pointer-Generator Networks"
(https://arxiv.org/abs/1704.04368). Axis letters: ``B`` batch, ``S`` source positions, ``T`` target positions,
``V`` vocabulary, ``V' = V + X`` the extended vocabulary (``X`` source words outside the vocabulary, numbered in
the order they first occur in each source), ``H`` hidden size.

- :class:`PointerGenerator`: a bidirectional LSTM encoder and an LSTM decoder with additive (Bahdanau) attention
  over the encoder outputs, queried by the decoder state ``s_t``. The final distribution is
  ``P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: w_i = w} a_ti`` with the copy switch
  ``p_gen = sigmoid(w_h h*_t + w_s s_t + w_x x_t + b)`` (:func:`copy_distribution`). With ``coverage`` the score
  is :class:`qkv.Coverage`, ``e_ti = v^T tanh(W_h h_i + W_s s_t + w_c c_ti + b)``, ``c_t = sum_{t'<t} a_t'``,
  and :meth:`PointerGenerator.coverage_loss` is ``sum_t sum_i min(a_ti, c_ti)``. ``copy=False`` is the plain
  attentional encoder-decoder (the baseline: ``P = P_vocab`` over ``V``). Differs from the paper: the decoder
  input is ``Linear([E y_{t-1}; h*_{t-1}])`` (the paper's TensorFlow code does the same), and ``w_c`` starts at
  zero so that coverage can be switched on late (``--coverage-from``): until the first step that feeds a real
  coverage, ``w_c`` has no gradient and the model is exactly the one without coverage. ``oov_slots`` (not in the
  paper): the ``j``-th distinct source word outside the vocabulary is read (and, once copied, fed back) as its own
  learned slot embedding ``V + j`` rather than ``<unk>``, for ``j < oov_slots``, so that the decoder can tell two
  unknown names apart and match a name of the question with the same name in the passage (the placeholders of
  Luong et al. 2015, "Addressing the Rare Word Problem in Neural Machine Translation"). ``reader_layers`` (not in
  the paper): that many pre-norm Transformer layers (multi-head self-attention and a feed-forward network, each
  residual) over the BiLSTM's outputs before the decoder attends to them, so that every source word sees every other
  one: with question + passage as the source, a passage word can match the question's words (the self-matching
  layer of the readers, Wang et al. 2017, "Gated Self-Matching Networks"), which one LSTM pass carries only as far
  as its state remembers.
- :class:`TransformerPointer`: the :class:`~qkv.models.transformer.TransformerSeq2Seq` (shared source/target
  embeddings) whose last decoder layer's cross-attention, averaged over heads, is the copy distribution;
  ``p_gen = sigmoid(w^T [y_t; x_t])`` from the decoder output ``y_t`` and the input embedding ``x_t``.

Both take ``(src, src_mask, tgt_in, src_ext, n_ext)`` for teacher forcing and return :class:`PointerOutput`, and
implement the one decoder's protocol (``encode``/``decode_step`` with log-probabilities over ``V'`` and
``feed_tokens`` mapping copied ids ``>= V`` back to ``<unk>``): ``beam_search(model, src, src_mask, src_ext,
n_ext, normalize=False)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import attention
from ..layers import TransformerLayer
from ..location import Coverage
from ..scores import create_score
from .decoding import teacher_forced
from .seq2seq import RNNConfig, RNNEncoder, check_source
from .transformer import TransformerConfig, TransformerSeq2Seq

__all__ = ["PointerOutput", "PointerGenerator", "TransformerPointer", "copy_distribution", "coverage_loss",
           "POINTER_MODELS"]

UNK = 3  # qkv.data.UNK_ID: every tokeniser's <unk>


def copy_distribution(p_vocab: Tensor, attn: Tensor, p_gen: Tensor, src_ext: Tensor, n_ext: int) -> Tensor:
    """``P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: src_ext_i = w} attn_i`` over the extended vocabulary.

    Args:
        p_vocab: ``(B, T, V)`` probabilities.  attn: ``(B, T, S)`` attention (rows sum to one).
        p_gen: ``(B, T)`` in [0, 1].  src_ext: ``(B, S)`` extended ids of the source words.  n_ext: ``X``.
    Returns:
        ``(B, T, V + X)`` probabilities (rows sum to one).
    """
    gen = p_gen[..., None] * p_vocab
    if n_ext:
        gen = torch.cat([gen, gen.new_zeros(*gen.shape[:-1], n_ext)], dim=-1)
    index = src_ext[:, None, :].expand(-1, attn.shape[1], -1)
    return gen.scatter_add(-1, index, (1 - p_gen[..., None]) * attn)


def coverage_loss(attn: Tensor, coverage: Tensor, mask: Tensor | None = None) -> Tensor:
    """See et al.'s ``sum_t sum_i min(a_ti, c_ti)`` (``attn``, ``coverage``: ``(B, T, S)``), over the target
    positions where ``mask (B, T)`` is True: a scalar sum."""
    per_step = torch.minimum(attn, coverage).sum(-1)
    if mask is not None:
        per_step = per_step * mask
    return per_step.sum()


def _log(p: Tensor) -> Tensor:
    return torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))


@dataclass
class PointerOutput:
    """Teacher forcing: ``log_probs (B, T, V')``, the copy attention ``(B, T, S)``, the coverage before each step
    ``(B, T, S)`` (zeros without coverage) and ``p_gen (B, T)`` (ones without copying)."""

    log_probs: Tensor
    attention: Tensor
    coverage: Tensor
    p_gen: Tensor


class PointerGenerator(nn.Module):
    """See et al.'s pointer-generator (with ``copy``) and coverage (with ``coverage``); see the module docstring.

    Example:
        >>> model = PointerGenerator(vocab=50, embed_dim=8, hidden_dim=16, attn_dim=16, coverage=True).eval()
        >>> src = torch.randint(4, 50, (2, 6)); mask = torch.ones(2, 6, dtype=torch.bool)
        >>> src_ext = src.clone(); src_ext[0, 1] = 50      # one source word outside the vocabulary: id V + 0
        >>> out = model(src, mask, torch.ones(2, 3, dtype=torch.long), src_ext, 1)
        >>> out.log_probs.shape, out.attention.shape      # (B, T, V + 1), (B, T, S)
        (torch.Size([2, 3, 51]), torch.Size([2, 3, 6]))
    """

    def __init__(self, vocab: int, embed_dim: int = 128, hidden_dim: int = 256, attn_dim: int = 256, *,
                 copy: bool = True, coverage: bool = False, dropout: float = 0.0, pad_id: int = 0,
                 oov_slots: int = 0, score: str = "additive", reader_layers: int = 0, reader_heads: int = 4):
        super().__init__()
        if coverage and not copy:
            raise ValueError("coverage needs copy (the seq2seq baseline has neither)")
        if score not in ("additive", "general") or (coverage and score != "additive"):
            raise ValueError(f"score must be 'additive' or 'general' (Luong's s^T W h), and additive with coverage; "
                             f"got {score!r}")
        if oov_slots < 0 or (oov_slots and not copy):
            raise ValueError(f"oov_slots must be >= 0, and needs copy (got {oov_slots}, copy={copy})")
        if reader_layers < 0 or (reader_layers and hidden_dim % reader_heads):
            raise ValueError(f"reader_layers must be >= 0, and reader_heads ({reader_heads}) must divide hidden_dim "
                             f"({hidden_dim}); got reader_layers={reader_layers}")
        self.vocab, self.copy, self.use_coverage, self.oov_slots = vocab, copy, coverage, oov_slots
        cfg = RNNConfig(vocab + oov_slots, vocab, embed_dim, hidden_dim, 1, "lstm", True, dropout, "additive",
                        attn_dim, pad_id)
        h = hidden_dim
        self.encoder = RNNEncoder(cfg)
        self.embed = self.encoder.embed  # one vocabulary: source and target share the embedding
        self.reader = nn.ModuleList(TransformerLayer(h, reader_heads, dropout=dropout) for _ in range(reader_layers))
        self.score = Coverage(h, h, attn_dim) if coverage else create_score(score, h, h, attn_dim)
        if coverage:
            nn.init.zeros_(self.score.coverage_proj.weight)
        self.input = nn.Linear(embed_dim + h, embed_dim)
        self.cell = nn.LSTMCell(embed_dim, h)
        self.hidden = nn.Linear(2 * h, h)
        self.out = nn.Linear(h, vocab)
        self.switch = nn.Linear(2 * h + embed_dim, 1) if copy else None
        self.dropout = nn.Dropout(dropout)
        #: training steps seen (kept in checkpoints): the task switches coverage on at ``--coverage-from``
        self.register_buffer("trained_steps", torch.zeros((), dtype=torch.long))

    def encode(self, src: Tensor, src_mask: Tensor, src_ext: Tensor | None = None, n_ext: int = 0) -> dict[str, Any]:
        """The decoding state of ``B`` sources (``src_ext``: their extended ids, ``src`` when None)."""
        check_source(src, src_mask)
        read = self.feed_tokens(src_ext) if self.oov_slots and src_ext is not None else src
        memory, (h0, c0) = self.encoder(read, src_mask)
        for layer in self.reader:
            memory = layer(memory, key_mask=src_mask)
        b, s = src.shape
        return {"memory": memory, "keys": self.score.prepare_key(memory), "mask": src_mask[:, None, :],
                "src_ext": src if src_ext is None else src_ext, "n_ext": int(n_ext) if self.copy else 0,
                "h": h0[:, 0], "c": c0[:, 0], "context": memory.new_zeros(b, memory.shape[-1]),
                "coverage": memory.new_zeros(b, s)}

    def step(self, y_prev: Tensor, state: dict[str, Any], use_coverage: bool = True):
        """One step: ``(probs (B, V'), attn (B, S), p_gen (B,), coverage before it (B, S), new state)``."""
        x = self.input(torch.cat([self.dropout(self.embed(y_prev)), state["context"]], -1))
        h, c = self.cell(x, (state["h"], state["c"]))
        cov = state["coverage"] if use_coverage else torch.zeros_like(state["coverage"])
        score = self.score.given(cov) if self.use_coverage else self.score
        context, w = attention(h[:, None], state["keys"], state["memory"], score=score, mask=state["mask"],
                               return_weights=True, key_prepared=True)
        context, w = context[:, 0], w[:, 0]
        p_vocab = torch.softmax(self.out(self.dropout(self.hidden(torch.cat([h, context], -1)))), -1)
        if self.copy:
            p_gen = torch.sigmoid(self.switch(torch.cat([context, h, x], -1)))[:, 0]
            probs = copy_distribution(p_vocab[:, None], w[:, None], p_gen[:, None], state["src_ext"],
                                      state["n_ext"])[:, 0]
        else:
            p_gen, probs = torch.ones_like(w[:, 0]), p_vocab
        new = {**state, "h": h, "c": c, "context": context, "coverage": state["coverage"] + w}
        return probs, w, p_gen, cov, new

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, src_ext: Tensor | None = None, n_ext: int = 0,
                *, use_coverage: bool = True) -> PointerOutput:
        """Teacher forcing: ``tgt_in (B, T)`` starts with ``<bos>``, copied ids ``>= V`` read as ``<unk>``;
        ``use_coverage=False`` feeds zero coverage (before ``--coverage-from``)."""
        def step(tokens: Tensor, state: dict[str, Any]):
            return self.step(self.feed_tokens(tokens), state, use_coverage)

        (probs, w, p_gen, cov), _ = teacher_forced(step, tgt_in, self.encode(src, src_mask, src_ext, n_ext))
        return PointerOutput(_log(probs), w, cov, p_gen)

    coverage_loss = staticmethod(coverage_loss)

    def feed_tokens(self, tokens: Tensor, _state: Any = None) -> Tensor:
        """Ids read by the encoder and fed back to the decoder: a source word outside the vocabulary (id ``V + j``)
        is its slot ``V + j`` when ``j < oov_slots``, else ``<unk>``."""
        return torch.where(tokens >= self.vocab + self.oov_slots, torch.full_like(tokens, UNK), tokens)

    def decode_step(self, tokens: Tensor, state: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """The one decoder's step: ``(log P (N, V'), attention (N, S), state)`` (``normalize=False``)."""
        probs, w, _, _, state = self.step(tokens, state)
        return _log(probs), w, state


class TransformerPointer(TransformerSeq2Seq):
    """A Transformer whose last cross-attention (averaged over heads) is the copy distribution (module docstring).

    ``copy=False`` is the plain Transformer over one shared vocabulary.
    """

    def __init__(self, vocab: int, dim: int = 128, num_heads: int = 4, ffn_dim: int = 512, num_layers: int = 2,
                 dropout: float = 0.1, max_len: int = 512, positions: str = "sinusoidal", *, copy: bool = True):
        super().__init__(TransformerConfig(vocab, vocab, dim, num_heads, None, ffn_dim, num_layers, None, dropout,
                                           positions, max_len, share_embeddings=True))
        self.vocab, self.copy = vocab, copy
        self.switch = nn.Linear(2 * dim, 1) if copy else None

    def _pointer(self, x: Tensor, memory: Tensor, src_mask: Tensor, src_ext: Tensor, n_ext: int, caches=None):
        """``x (B, T, E)`` embedded target inputs -> ``(probs (B, T, V'), attn (B, T, S), p_gen (B, T))``."""
        y, last = x, len(self.decoder) - 1
        attn = None
        for i, layer in enumerate(self.decoder):
            cache, cross = (None, None) if caches is None else (caches[0][i], caches[1][i])
            y = layer(y, is_causal=True, memory=memory, memory_mask=src_mask, cache=cache, cross_cache=cross,
                      return_weights=i == last, score_mod=self.tgt_bias)
            if i == last:
                y, attn = y
        y = self.decoder_norm(y)
        attn = attn.mean(1) if attn.dim() == 4 else attn  # (B, heads, T, S) -> (B, T, S)
        p_vocab = torch.softmax(self.out(y), -1)
        if not self.copy:
            return p_vocab, attn, torch.ones_like(attn[..., 0])
        p_gen = torch.sigmoid(self.switch(torch.cat([y, x], -1)))[..., 0]
        return copy_distribution(p_vocab, attn, p_gen, src_ext, n_ext), attn, p_gen

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, src_ext: Tensor | None = None, n_ext: int = 0,
                *, use_coverage: bool = True) -> PointerOutput:
        memory = self._encode(src, src_mask)
        probs, attn, p_gen = self._pointer(self._embed(self.feed_tokens(tgt_in), 0, "target"), memory, src_mask,
                                           src if src_ext is None else src_ext, n_ext if self.copy else 0)
        return PointerOutput(_log(probs), attn, torch.zeros_like(attn), p_gen)

    def encode(self, src: Tensor, src_mask: Tensor, src_ext: Tensor | None = None, n_ext: int = 0) -> dict[str, Any]:
        state = super().encode(src, src_mask)
        return {**state, "src_ext": src if src_ext is None else src_ext, "n_ext": int(n_ext) if self.copy else 0}

    def feed_tokens(self, tokens: Tensor, _state: Any = None) -> Tensor:
        return torch.where(tokens >= self.vocab, torch.full_like(tokens, UNK), tokens)

    def decode_step(self, tokens: Tensor, state: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        pos = state["self_cache"][0].length
        x = self._embed(tokens[:, None], pos, "target")
        probs, attn, _ = self._pointer(x, state["memory"], state["src_mask"], state["src_ext"], state["n_ext"],
                                       caches=(state["self_cache"], state["cross_cache"]))
        return _log(probs[:, 0]), attn[:, 0], state


POINTER_MODELS = {"pointer": PointerGenerator, "transformer-pointer": TransformerPointer}
