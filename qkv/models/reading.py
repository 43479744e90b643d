"""Readers: question answering by pointing at the answer's start and end in the context.

Every reader takes the context and question token ids with their masks (True = a real token) and the flags of
each context token, ``match``: 1 where the token also occurs in the question (DrQA's exact-match feature: it lets a
reader match names its vocabulary has never seen), plus 2 where it starts with a capital letter (a shape feature,
as named-entity taggers use: where an unknown name begins and ends, ``<unk> <unk> 's`` alone does not say; readers
built with ``case_feature=False`` read only the first flag), and returns :class:`ReaderOutput`: start and end logits
over the context (``-inf`` on padding) and the question's attention over the context.

* :class:`AttentiveReader` -- the Attentive Reader (Hermann et al., 2015, "Teaching Machines to Read and
  Comprehend", https://arxiv.org/abs/1506.03340) as a span reader, in the form of Chen et al., 2016 ("A Thorough
  Examination of the CNN/Daily Mail Reading Comprehension Task", https://arxiv.org/abs/1606.02858) and DrQA: a
  question vector attends over the encoded context with any qkv score, and that attention **is** the pointer
  (Vinyals et al., 2015, "Pointer Networks", https://arxiv.org/abs/1506.03134). Two attentions: one for the start,
  then one for the end whose query also holds what the start attention read. The question's attention shown to
  users is the mean of the two.
* :class:`BiDAFReader` -- in the spirit of BiDAF (Seo et al., 2017, "Bidirectional Attention Flow for Machine
  Comprehension", https://arxiv.org/abs/1611.01603): context-to-question and question-to-context attention, a
  modelling BiGRU, then start and end pointers. Differences: no character CNN (the question-word flag instead),
  any qkv score in place of the trilinear one, one modelling layer. Its shown attention is question-to-context.
* :class:`TransformerReader` -- a pre-norm Transformer encoder (:class:`qkv.layers.TransformerLayer`) over
  ``[question; context]`` (segment embeddings, positions counted from 0 in each part, so padding never shifts them)
  with a linear start/end head, as BERT's span head (Devlin et al., 2019). Shown attention: the last layer's
  weights from the question's tokens to the context's, averaged over heads and question tokens.

:func:`decode_spans` picks ``argmax p_start(i) p_end(j)`` with ``i <= j < i + max_answer_len`` over real tokens.

Axis letters: ``B`` batch, ``Tc`` context tokens, ``Tq`` question tokens, ``E`` embedding, ``H`` encoder output
(both directions), ``D`` transformer width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..background import compiling
from ..functional import compute_scores, normalize_scores, weighted_sum
from ..layers import Attention, AttentionPooling, TransformerLayer
from ..layers.transformer import PositionalEncoding

__all__ = ["QA_MODELS", "ReaderOutput", "AttentiveReader", "BiDAFReader", "TransformerReader", "decode_spans",
           "token_flags"]


class ReaderOutput(NamedTuple):
    """``start_logits``, ``end_logits`` ``(B, Tc)`` (``-inf`` on padding) and the question's ``attention``
    ``(B, Tc)`` over the context (sums to 1 over real tokens, 0 on padding)."""

    start_logits: Tensor
    end_logits: Tensor
    attention: Tensor


def _check(context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor, match: Tensor | None):
    if context.dim() != 2 or question.dim() != 2 or context.shape[0] != question.shape[0]:
        raise ValueError(f"context and question must be (B, Tc) and (B, Tq) ids, got {tuple(context.shape)} and "
                         f"{tuple(question.shape)}")
    for name, t, like in (("context_mask", context_mask, context), ("question_mask", question_mask, question)):
        if t.dtype != torch.bool or t.shape != like.shape:
            raise ValueError(f"{name} must be a bool tensor of shape {tuple(like.shape)}, got {tuple(t.shape)} "
                             f"{t.dtype}")
    if match is not None and match.shape != context.shape:
        raise ValueError(f"match must be (B, Tc) = {tuple(context.shape)}, got {tuple(match.shape)}")
    if compiling():  # traced: no branch on the values
        return
    if not bool(context_mask.any(-1).all()) or not bool(question_mask.any(-1).all()):
        raise ValueError("every context and question needs at least one token")


def token_flags(match: Tensor | None, like: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The two flags packed in ``match (B, Tc)`` (zeros when None), each ``(B, Tc)`` long, 0 on padding: the token
    occurs in the question (bit 1), the token starts with a capital letter (bit 2)."""
    if match is None:
        zero = torch.zeros_like(like)
        return zero, zero
    m = match.long() * mask
    return m % 2, m // 2 % 2


def _masked(logits: Tensor, mask: Tensor) -> Tensor:
    return logits.float().masked_fill(~mask, float("-inf"))


class _BiRNN(nn.Module):
    """A bidirectional GRU over packed sequences: ``(B, T, in) -> (B, T, H)``, zeros on padding."""

    def __init__(self, in_dim: int, hidden_dim: int, num_layers: int = 1, dropout: float = 0.0):
        super().__init__()
        if hidden_dim < 2 or hidden_dim % 2:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be even: it is split between two directions")
        self.rnn = nn.GRU(in_dim, hidden_dim // 2, num_layers, batch_first=True, bidirectional=True,
                          dropout=dropout if num_layers > 1 else 0.0)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        lengths = mask.sum(-1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out


class _Embedder(nn.Module):
    """Token embeddings (``padding_idx`` 0) with dropout; context tokens also get the question-word flag and the
    capital-letter flag (each when asked for)."""

    def __init__(self, vocab_size: int, embed_dim: int, dropout: float, match_feature: bool,
                 case_feature: bool = False):
        super().__init__()
        if vocab_size < 5 or embed_dim < 1:
            raise ValueError(f"vocab_size must be > 4 and embed_dim >= 1, got {vocab_size} and {embed_dim}")
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.match_feature, self.case_feature = match_feature, case_feature

    @property
    def context_dim(self) -> int:
        return self.embed.embedding_dim + int(self.match_feature) + int(self.case_feature)

    def forward(self, ids: Tensor, mask: Tensor, match: Tensor | None = None, *, context: bool = True) -> Tensor:
        """``ids (B, T)`` -> ``(B, T, E)``, or ``(B, T, E + flags)`` for a context."""
        x = self.dropout(self.embed(ids.masked_fill(~mask, 0)))
        if context and (self.match_feature or self.case_feature):
            in_question, capital = token_flags(match, ids, mask)
            used = [f for f, on in ((in_question, self.match_feature), (capital, self.case_feature)) if on]
            x = torch.cat([x, torch.stack(used, -1).to(x.dtype)], -1)
        return x


class _RecurrentReader(nn.Module):
    """What the recurrent readers share: the embedder (with the question-word flag) and a BiGRU over each side."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, num_layers: int, dropout: float,
                 match_feature: bool, case_feature: bool = False):
        super().__init__()
        self.embedder = _Embedder(vocab_size, embed_dim, dropout, match_feature, case_feature)
        self.context_rnn = _BiRNN(self.embedder.context_dim, hidden_dim, num_layers, dropout)
        self.question_rnn = _BiRNN(embed_dim, hidden_dim, num_layers, dropout)
        self.dropout = nn.Dropout(dropout)

    def _read(self, context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor,
              match: Tensor | None) -> tuple[Tensor, Tensor]:
        """The inputs checked, then the context's encoding ``(B, Tc, H)`` (after dropout) and the question's
        ``(B, Tq, H)``."""
        _check(context, context_mask, question, question_mask, match)
        h = self.dropout(self.context_rnn(self.embedder(context, context_mask, match), context_mask))
        u = self.question_rnn(self.embedder(question, question_mask, context=False), question_mask)
        return h, u


class AttentiveReader(_RecurrentReader):
    """The Attentive Reader as a span reader: the question vector's attention over the context points at the answer.

    Args:
        vocab_size: token ids ``0 .. vocab_size - 1`` (0 is padding).  embed_dim: ``E``.
        hidden_dim: ``H``, the BiGRU outputs (both directions).  num_layers: BiGRU layers.
        score: the attention score (any qkv score name; parametric ones are sized ``H``).
        dropout: on embeddings and encoder outputs.  match_feature: use the question-word flag.
        case_feature: use the capital-letter flag.
    """

    def __init__(self, vocab_size: int, *, embed_dim: int = 64, hidden_dim: int = 128, num_layers: int = 1,
                 score: str = "general", dropout: float = 0.1, match_feature: bool = True,
                 case_feature: bool = False):
        super().__init__(vocab_size, embed_dim, hidden_dim, num_layers, dropout, match_feature, case_feature)
        self.question_pool = AttentionPooling(hidden_dim)
        self.start_attn = Attention(score, query_dim=hidden_dim, key_dim=hidden_dim, hidden_dim=hidden_dim)
        self.end_query = nn.Linear(2 * hidden_dim, hidden_dim)  # [question; start's read] -> the end's query
        self.end_attn = Attention(score, query_dim=hidden_dim, key_dim=hidden_dim, hidden_dim=hidden_dim)

    def forward(self, context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor,
                match: Tensor | None = None) -> ReaderOutput:
        """``context (B, Tc)``, ``question (B, Tq)`` ids and bool masks, ``match (B, Tc)`` -> :class:`ReaderOutput`."""
        h, u = self._read(context, context_mask, question, question_mask, match)  # (B, Tc, H), (B, Tq, H)
        q, _ = self.question_pool(u, question_mask)  # (B, H)
        keep = context_mask[:, None, :]
        # the question attends over the context: the start pointer, and what it read (B, 1, H)
        read, a_start = self.start_attn(q[:, None], h, mask=keep, return_weights=True)
        q_end = self.end_query(torch.cat([q[:, None], read], -1))  # the end's query knows where the start looked
        _, a_end = self.end_attn(q_end, h, mask=keep, return_weights=True)
        # the same scores as logits, for the loss and the span decoder (B, 1, Tc)
        start = compute_scores(q[:, None], h, self.start_attn.score, scale=self.start_attn.scale)
        end = compute_scores(q_end, h, self.end_attn.score, scale=self.end_attn.scale)
        attention = 0.5 * (a_start + a_end)[:, 0]
        return ReaderOutput(_masked(start[:, 0], context_mask), _masked(end[:, 0], context_mask), attention)


class BiDAFReader(_RecurrentReader):
    """Bi-directional attention flow: context-to-question and question-to-context attention, then two pointers.

    Args: as :class:`AttentiveReader`; ``score`` is the similarity ``S (B, Tc, Tq)`` between context and question.
    """

    def __init__(self, vocab_size: int, *, embed_dim: int = 64, hidden_dim: int = 128, num_layers: int = 1,
                 score: str = "general", dropout: float = 0.1, match_feature: bool = True,
                 case_feature: bool = False):
        super().__init__(vocab_size, embed_dim, hidden_dim, num_layers, dropout, match_feature, case_feature)
        self.similarity = Attention(score, query_dim=hidden_dim, key_dim=hidden_dim, hidden_dim=hidden_dim)
        self.modelling = _BiRNN(4 * hidden_dim, hidden_dim, num_layers, dropout)
        self.end_rnn = _BiRNN(hidden_dim, hidden_dim, 1)
        self.start_head = nn.Linear(5 * hidden_dim, 1)
        self.end_head = nn.Linear(5 * hidden_dim, 1)

    def forward(self, context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor,
                match: Tensor | None = None) -> ReaderOutput:
        """As :meth:`AttentiveReader.forward`."""
        h, u = self._read(context, context_mask, question, question_mask, match)
        u = self.dropout(u)
        s = compute_scores(h, u, self.similarity.score, scale=self.similarity.scale)  # (B, Tc, Tq)
        c2q = self.similarity(h, u, mask=question_mask[:, None, :])  # context-to-question (B, Tc, H)
        best = s.masked_fill(~question_mask[:, None, :], float("-inf")).amax(-1)  # (B, Tc)
        b = normalize_scores(best[:, None, :], context_mask[:, None, :])  # (B, 1, Tc)
        q2c = weighted_sum(b, h)  # (B, 1, H)
        g = torch.cat([h, c2q, h * c2q, h * q2c], -1)  # (B, Tc, 4H)
        m = self.dropout(self.modelling(g, context_mask))
        m2 = self.dropout(self.end_rnn(m, context_mask))
        start = self.start_head(torch.cat([g, m], -1))[..., 0]
        end = self.end_head(torch.cat([g, m2], -1))[..., 0]
        return ReaderOutput(_masked(start, context_mask), _masked(end, context_mask), b[:, 0])


class TransformerReader(nn.Module):
    """A Transformer encoder over ``[question; context]`` with a start/end head on the context's positions.

    Args:
        vocab_size: as above.  dim: ``D``.  num_heads, num_layers, ffn_dim (default ``4 D``): the encoder.
        score: of every self-attention.  dropout: everywhere.  match_feature: a learned vector added to the
        context tokens that occur in the question.  case_feature: another added to those that start with a
        capital letter.  max_len: the longest question or context.
    """

    def __init__(self, vocab_size: int, *, dim: int = 128, num_heads: int = 4, num_layers: int = 2,
                 ffn_dim: int | None = None, score: str = "scaled_dot", dropout: float = 0.1,
                 match_feature: bool = True, max_len: int = 512, case_feature: bool = False):
        super().__init__()
        if vocab_size < 5:
            raise ValueError(f"vocab_size must be > 4, got {vocab_size}")
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.segment = nn.Embedding(2, dim)
        self.match = nn.Embedding(2, dim) if match_feature else None
        self.case = nn.Embedding(2, dim) if case_feature else None
        self.positions = PositionalEncoding(dim, max_len)
        self.layers = nn.ModuleList(TransformerLayer(dim, num_heads, ffn_dim, dropout=dropout, score=score)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)  # times sqrt(dim) in forward: unit variance
        with torch.no_grad():
            self.embed.weight[0].zero_()

    def forward(self, context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor,
                match: Tensor | None = None) -> ReaderOutput:
        """As :meth:`AttentiveReader.forward`."""
        _check(context, context_mask, question, question_mask, match)
        scale = self.dim ** 0.5
        xq = self.positions(self.embed(question.masked_fill(~question_mask, 0)) * scale) + self.segment.weight[0]
        xc = self.positions(self.embed(context.masked_fill(~context_mask, 0)) * scale) + self.segment.weight[1]
        in_question, capital = token_flags(match, context, context_mask)
        if self.match is not None:
            xc = xc + self.match(in_question)
        if self.case is not None:
            xc = xc + self.case(capital)
        x = self.dropout(torch.cat([xq, xc], 1))
        key_mask = torch.cat([question_mask, context_mask], 1)
        weights = None
        for i, layer in enumerate(self.layers):
            if i == len(self.layers) - 1:
                x, weights = layer(x, key_mask=key_mask, return_weights=True)
            else:
                x = layer(x, key_mask=key_mask)
        tq = question.shape[1]
        logits = self.head(self.norm(x[:, tq:]))  # (B, Tc, 2)
        qw = question_mask.to(weights.dtype)
        attention = (weights[:, :tq, tq:] * qw[..., None]).sum(1) / qw.sum(1, keepdim=True)  # (B, Tc)
        attention = attention / attention.sum(-1, keepdim=True).clamp_min(1e-12)
        return ReaderOutput(_masked(logits[..., 0], context_mask), _masked(logits[..., 1], context_mask), attention)


def decode_spans(start_logits: Tensor, end_logits: Tensor, mask: Tensor, max_answer_len: int = 15):
    """The best span of every row: ``argmax_{i <= j < i + max_answer_len} p_start(i) p_end(j)`` over real tokens.

    ``start_logits``, ``end_logits`` ``(B, Tc)`` (any values on padding), ``mask (B, Tc)`` bool. Returns
    ``(start (B,), end (B,), probability (B,))``: token indices with ``start <= end``, both real tokens, and
    ``p_start(start) * p_end(end)`` (each a softmax over the real tokens).
    """
    if max_answer_len < 1:
        raise ValueError(f"max_answer_len must be >= 1, got {max_answer_len}")
    if start_logits.shape != mask.shape or end_logits.shape != mask.shape:
        raise ValueError(f"logits {tuple(start_logits.shape)}, {tuple(end_logits.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape")
    if not compiling() and not bool(mask.any(-1).all()):  # (traced: no branch on the values)
        raise ValueError("every row needs at least one real token")
    ls = _masked(start_logits, mask).log_softmax(-1)
    le = _masked(end_logits, mask).log_softmax(-1)
    t = mask.shape[-1]
    i = torch.arange(t, device=mask.device)
    band = (i[None, :] >= i[:, None]) & (i[None, :] < i[:, None] + max_answer_len)  # (Tc, Tc): i <= j < i + L
    pair = (ls[:, :, None] + le[:, None, :]).masked_fill(~band, float("-inf"))
    pair = pair.masked_fill(~(mask[:, :, None] & mask[:, None, :]), float("-inf"))
    # the first best pair in (start, end) order: each start's best end, then the best start (no division by the
    # symbolic length, which ONNX's exporter cannot translate)
    best_end, end = pair.max(-1)
    best, start = best_end.max(-1)
    return start, end.gather(1, start[:, None])[:, 0], best.exp()


#: model name -> constructor taking keyword arguments (registered in :mod:`qkv.models.registry`)
QA_MODELS: dict[str, Callable[..., nn.Module]] = {
    "attentive-reader": AttentiveReader,
    "bidaf-reader": BiDAFReader,
    "transformer-reader": TransformerReader,
}
