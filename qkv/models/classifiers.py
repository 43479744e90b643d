"""Text classifiers whose attention shows which words decided: every forward returns logits **and** weights.

* :class:`RNNClassifier`: embedding, a bidirectional GRU or LSTM, then attention pooling. One learned query is
  the word attention of Yang et al., 2016, "Hierarchical Attention Networks for Document Classification"
  (https://aclanthology.org/N16-1174), used here on a single sentence (no sentence level). ``hops=R`` is the
  structured self-attention of Lin et al., 2017, "A Structured Self-attentive Sentence Embedding"
  (https://arxiv.org/abs/1703.03130): R learned queries, their pooled vectors concatenated; its penalty
  ``||AA^T - I||_F^2`` is :meth:`qkv.AttentionPooling.penalty`. Differences from the papers: the output layer is
  dropout + linear (Lin et al. use a hidden layer: ``mlp_dim``), and padded positions are packed away.
* :class:`TransformerClassifier`: a pre-norm Transformer encoder (Vaswani et al., 2017,
  https://arxiv.org/abs/1706.03762, with the norm before each sub-layer as in Xiong et al., 2020,
  https://arxiv.org/abs/2002.04745) of :class:`qkv.layers.TransformerLayer`, with sinusoidal positions. Pooled
  by a [CLS]-style learned query or by attention pooling. Unlike BERT's [CLS] token, the query is a reader only:
  words never attend to it and it never attends to itself, so its weights over the words sum to 1 in every
  layer; in the last layer only the query row is computed.
* :class:`BigramAttentionClassifier`: attention pooling straight over word vectors plus hashed bigram vectors
  (fastText's buckets, :func:`bigram_ids`), no recurrence: fast on a CPU, its weights still one per word.
* :class:`NBSVMLogits`: a naive-Bayes-weighted bag of words and hashed bigrams (Wang & Manning's NBSVM), a linear
  path any of the classifiers above can add to its logits (``nbsvm=ROWS``); its per-word part is
  :meth:`NBSVMLogits.contributions`.
* :func:`load_word_vectors`: pretrained vectors from a GloVe/word2vec text file, for ``pretrained=``.

Axis letters: ``B`` batch, ``T`` tokens, ``R`` attention hops, ``C`` outputs (classes, or 1 for regression).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..layers import AttentionPooling, TransformerLayer, sinusoidal_positions

__all__ = ["ClassifierOutput", "RNNClassifier", "TransformerClassifier", "BigramAttentionClassifier", "NBSVMLogits",
           "bigram_ids", "load_word_vectors", "create_classifier", "CLASSIFIERS"]

log = logging.getLogger(__name__)


class ClassifierOutput(NamedTuple):
    """``logits (B, C)`` and the pooled attention ``weights``: ``(B, T)`` for one query, ``(B, R, T)`` for R hops;
    each row sums to 1 over the real tokens and is 0 on padding."""

    logits: Tensor
    weights: Tensor


def _check_inputs(ids: Tensor, mask: Tensor | None) -> Tensor:
    if ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"ids must be an integer (B, T) tensor, got {tuple(ids.shape)} {ids.dtype}")
    if mask is None:
        return torch.ones_like(ids, dtype=torch.bool)
    if mask.dtype != torch.bool or mask.shape != ids.shape:
        raise ValueError(f"mask must be a bool (B, T) = {tuple(ids.shape)} tensor, "
                         f"got {tuple(mask.shape)} {mask.dtype}")
    return mask


def _embedding(vocab_size: int, embed_dim: int, padding_idx: int, pretrained: Tensor | None,
               freeze: bool) -> nn.Embedding:
    if pretrained is not None:
        if pretrained.dim() != 2 or pretrained.shape[0] != vocab_size:
            raise ValueError(f"pretrained must be (vocab_size={vocab_size}, D), got {tuple(pretrained.shape)}")
        emb = nn.Embedding.from_pretrained(pretrained.float().clone(), freeze=freeze, padding_idx=padding_idx)
        with torch.no_grad():
            emb.weight[padding_idx].zero_()
        return emb
    return nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)


def _head(in_dim: int, num_classes: int, mlp_dim: int | None, dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Dropout(dropout)]
    if mlp_dim:
        layers += [nn.Linear(in_dim, mlp_dim), nn.ReLU(), nn.Dropout(dropout)]
        in_dim = mlp_dim
    layers.append(nn.Linear(in_dim, num_classes))
    return nn.Sequential(*layers)


class RNNClassifier(nn.Module):
    """Embedding + bidirectional GRU/LSTM + attention pooling (Yang et al., 2016; Lin et al., 2017 with ``hops``).

    Args:
        vocab_size: rows of the embedding; id ``padding_idx`` is padding.
        num_classes: ``C`` outputs; 1 for regression.
        embed_dim: word vector size (taken from ``pretrained`` when given).
        hidden_dim: the RNN's output at each position, both directions together (each has ``hidden_dim // 2``;
            must be even); the pooled vector is ``hidden_dim`` per hop.
        cell: ``"gru"`` or ``"lstm"``.  num_layers: stacked RNN layers.
        hops: ``R`` learned queries (1 = Yang et al.; more = Lin et al.'s structured self-attention).
        attn_dim: size of the attention keys ``tanh(W h + b)`` and queries (Lin et al.'s ``d_a``); default
            ``hidden_dim // 2``.
        mlp_dim: a hidden layer in the output (0/None = none).
        dropout: on the RNN outputs and before the output layer.  embed_dropout: on the word vectors.
        pretrained: ``(vocab_size, D)`` initial word vectors (see :func:`load_word_vectors`).
        freeze_embeddings: keep ``pretrained`` fixed.
        buckets: hashed bigram vectors added to the word vectors, as in :class:`BigramAttentionClassifier`
            (0 = none).
        nbsvm: rows of the bigram table of an :class:`NBSVMLogits` path added to the logits (0 = none; its
            ratios are set by ``model.nbsvm.fit(examples)``). The same in every classifier here.
    """

    def __init__(self, vocab_size: int, num_classes: int, *, embed_dim: int = 128, hidden_dim: int = 128,
                 cell: str = "gru", num_layers: int = 1, hops: int = 1, attn_dim: int | None = None,
                 mlp_dim: int | None = None, dropout: float = 0.5, embed_dropout: float = 0.3,
                 padding_idx: int = 0, pretrained: Tensor | None = None, freeze_embeddings: bool = False,
                 buckets: int = 0, nbsvm: int = 0):
        super().__init__()
        if buckets < 0:
            raise ValueError(f"buckets must be >= 0 (0 = no bigrams), got {buckets}")
        if cell not in ("gru", "lstm"):
            raise ValueError(f"cell must be 'gru' or 'lstm', got {cell!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if hidden_dim < 2 or hidden_dim % 2:
            raise ValueError(f"hidden_dim (both directions together) must be even and positive, got {hidden_dim}")
        self.embedding = _embedding(vocab_size, embed_dim, padding_idx, pretrained, freeze_embeddings)
        embed_dim = self.embedding.embedding_dim
        self.bigrams = _bigram_table(buckets, embed_dim)
        self.buckets = buckets
        self.embed_dropout = nn.Dropout(embed_dropout)
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn(embed_dim, hidden_dim // 2, num_layers=num_layers, batch_first=True, bidirectional=True,
                       dropout=dropout if num_layers > 1 else 0.0)
        self.rnn_dropout = nn.Dropout(dropout)
        self.pool = AttentionPooling(hidden_dim, attn_dim or hidden_dim // 2, num_queries=hops)
        self.head = _head(hidden_dim * hops, num_classes, mlp_dim, dropout)
        self.hops = hops
        self.nbsvm = _nbsvm(nbsvm, vocab_size, num_classes)

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """The RNN states ``(B, T, hidden_dim)``, zero at padding (padding is packed away)."""
        x = self.embedding(ids)
        if self.bigrams is not None:
            x = x + self.bigrams(bigram_ids(ids, mask, self.buckets))
        x = self.embed_dropout(x)
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return self.rnn_dropout(out)

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> ClassifierOutput:
        """``ids (B, T)`` token ids, ``mask (B, T)`` bool, True at real tokens -> ``(logits (B, C), weights)``."""
        mask = _check_inputs(ids, mask)
        pooled, weights = self.pool(self.encode(ids, mask), mask)
        return _output(self, self.head(pooled.reshape(ids.shape[0], -1)), weights, ids, mask)


class TransformerClassifier(nn.Module):
    """A pre-norm Transformer encoder of :class:`qkv.layers.TransformerLayer`, pooled by a query or attention pooling.

    Args:
        vocab_size, num_classes: as in :class:`RNNClassifier` (``num_classes=1`` for regression).
        dim: model width ``E``.  num_heads: attention heads.  num_layers: encoder layers.
        ffn_dim: feed-forward width (default ``4 * dim``).  dropout: on attention weights, sub-layers, output.
        embed_dim: word vector size (default ``dim``; projected to ``dim`` when different).
        pooling: ``"cls"`` (a learned [CLS]-style query that reads every layer; its last-layer weights, averaged
            over heads, are returned) or ``"attention"`` (:class:`qkv.AttentionPooling` on the last layer).
        hops: queries of the attention pooling (``pooling="attention"`` only).
        embed_dropout: on the word vectors.  activation: of the feed-forward networks, ``"gelu"`` or ``"relu"``.
        padding_idx, pretrained, freeze_embeddings, nbsvm: as in :class:`RNNClassifier`.
    """

    def __init__(self, vocab_size: int, num_classes: int, *, dim: int = 128, num_heads: int = 4, num_layers: int = 2,
                 ffn_dim: int | None = None, dropout: float = 0.1, embed_dim: int | None = None,
                 pooling: str = "cls", hops: int = 1, embed_dropout: float = 0.1, activation: str = "gelu",
                 padding_idx: int = 0, pretrained: Tensor | None = None, freeze_embeddings: bool = False,
                 nbsvm: int = 0):
        super().__init__()
        if pooling not in ("cls", "attention"):
            raise ValueError(f"pooling must be 'cls' or 'attention', got {pooling!r}")
        if pooling == "cls" and hops != 1:
            raise ValueError(f"hops={hops} needs pooling='attention' (the [CLS] query is one query)")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.embedding = _embedding(vocab_size, embed_dim or dim, padding_idx, pretrained, freeze_embeddings)
        e = self.embedding.embedding_dim
        self.proj = nn.Identity() if e == dim else nn.Linear(e, dim)
        self.embed_scale = math.sqrt(dim) if pretrained is None and e == dim else 1.0
        self.embed_dropout = nn.Dropout(embed_dropout)
        self.layers = nn.ModuleList(TransformerLayer(dim, num_heads, ffn_dim, dropout=dropout, activation=activation)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)
        self.pooling, self.hops, self.dim = pooling, hops, dim
        if pooling == "cls":
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pool = None
        else:
            self.cls = None
            self.pool = AttentionPooling(dim, num_queries=hops)
        self.head = _head(dim * hops, num_classes, None, dropout)
        self.nbsvm = _nbsvm(nbsvm, vocab_size, num_classes)
        if pretrained is None:
            nn.init.normal_(self.embedding.weight, std=dim ** -0.5)
            with torch.no_grad():
                self.embedding.weight[padding_idx].zero_()

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> ClassifierOutput:
        """``ids (B, T)``, ``mask (B, T)`` bool, True at real tokens -> ``(logits (B, C), weights)``."""
        mask = _check_inputs(ids, mask)
        b, t = ids.shape
        x = self.proj(self.embedding(ids)) * self.embed_scale
        x = self.embed_dropout(x + sinusoidal_positions(t, self.dim, device=x.device, dtype=x.dtype))
        if self.pooling == "attention":
            for layer in self.layers:
                x = layer(x, key_mask=mask)
            pooled, weights = self.pool(self.norm(x), mask)
            return _output(self, self.head(pooled.reshape(b, -1)), weights, ids, mask)
        # [CLS]-style query: position 0, hidden from every query (itself included) by the key mask
        x = torch.cat([self.cls.expand(b, 1, -1).to(x.dtype), x], dim=1)
        key_mask = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=mask.device), mask], dim=1)
        for layer in self.layers[:-1]:
            x = layer(x, key_mask=key_mask)
        q, weights = self.layers[-1](x[:, :1], context=x, key_mask=key_mask, return_weights=True)
        return _output(self, self.head(self.norm(q[:, 0])), weights[:, 0, 1:], ids, mask)


def _nbsvm(buckets: int, vocab_size: int, num_classes: int) -> NBSVMLogits | None:
    if buckets < 0:
        raise ValueError(f"nbsvm must be >= 0 (rows of its bigram table; 0 = no NBSVM path), got {buckets}")
    return NBSVMLogits(vocab_size, num_classes, buckets) if buckets else None


def _output(model: nn.Module, logits: Tensor, weights: Tensor, ids: Tensor, mask: Tensor) -> ClassifierOutput:
    """The classifier's output, its NBSVM path's logits added when it has one."""
    if model.nbsvm is not None:
        logits = logits + model.nbsvm(ids, mask).to(logits.dtype)
    return ClassifierOutput(logits, weights)


_HASH_A, _HASH_B = 1_000_003, 1_274_126_177  # odd multipliers below 2**31: every product fits in int64


def bigram_ids(ids: Tensor, mask: Tensor, buckets: int) -> Tensor:
    """The hashed bigram id of each position ``(B, T)``: the pair ``(ids[:, t], ids[:, t + 1])`` hashed into
    ``1..buckets``, and 0 (no bigram) where position ``t`` or ``t + 1`` is padding, so the last real word of a text
    has none and padding never changes a text's ids. The hash (31-bit: ``x = (a * 1000003 + b) mod 2^31``, then
    ``((x xor x >> 13) * 1274126177) mod 2^31``, then ``mod buckets``) is fixed: a saved model reads the same
    buckets everywhere."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    a = ids.long()
    b = torch.zeros_like(a)
    b[:, :-1] = a[:, 1:]
    real = torch.zeros_like(mask)
    real[:, :-1] = mask[:, :-1] & mask[:, 1:]
    x = (a * _HASH_A + b) & 0x7FFFFFFF
    y = torch.div(x, 8192, rounding_mode="floor")  # x >> 13; then x xor y as x + y - 2 (x and y) (no xor in ONNX)
    x = ((x + y - 2 * (x & y)) * _HASH_B) & 0x7FFFFFFF
    return torch.where(real, x % buckets + 1, torch.zeros_like(x))


def _bigram_table(buckets: int, dim: int) -> nn.Embedding | None:
    if not buckets:
        return None
    table = nn.Embedding(buckets + 1, dim, padding_idx=0)  # row 0: no bigram
    nn.init.normal_(table.weight, std=0.1)  # a bigram starts smaller than a word (N(0, 1))
    with torch.no_grad():
        table.weight[0].zero_()
    return table


class NBSVMLogits(nn.Module):
    """A naive-Bayes-weighted bag of words and hashed bigrams: a linear path to the logits beside the attention.

    Wang & Manning, 2012, "Baselines and Bigrams: Simple, Good Sentiment and Topic Classification"
    (https://aclanthology.org/P12-2018) scale each word and bigram feature by its log-count ratio ``r`` in the
    training texts (:func:`log_count_ratios`) before a linear classifier (NBSVM). Here the scaling is the
    parametrisation: class ``c``'s logit is ``b_c + sum_t r_w[w_t, c] u[w_t, c] + r_b[h_t, c] v[h_t, c]`` over the
    words ``w_t`` and the hashed bigrams ``h_t`` (:func:`bigram_ids`), with ``u`` and ``v`` learned from 0 (weight
    decay pulls them back to 0), so a feature the counts call telling moves fast and one they call neutral hardly
    moves. ``r`` is a buffer (saved with the weights), 0 until :meth:`fit` reads the training texts: before that
    the path gives its bias only. On the movie-review sentences it lifts the attention-pooled BiGRU beside it
    above a TF-IDF logistic regression (BENCHMARKS.md).

    Args:
        vocab_size: rows of the word table (the classifier's vocabulary).
        num_classes: ``C`` (classes only: the ratios need labels).
        buckets: rows of the hashed bigram table.
    """

    def __init__(self, vocab_size: int, num_classes: int, buckets: int):
        super().__init__()
        if buckets < 1:
            raise ValueError(f"nbsvm buckets must be >= 1, got {buckets}")
        if num_classes < 2:
            raise ValueError(f"the NBSVM path needs classes (num_classes >= 2), got {num_classes}")
        self.buckets = buckets
        self.words = nn.Parameter(torch.zeros(vocab_size, num_classes))
        self.bigrams = nn.Parameter(torch.zeros(buckets + 1, num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.register_buffer("word_ratios", torch.zeros(vocab_size, num_classes))
        self.register_buffer("bigram_ratios", torch.zeros(buckets + 1, num_classes))

    @torch.no_grad()
    def fit(self, examples, alpha: float = 1.0) -> None:
        """Set the ratios from ``examples`` of ``(ids, label)`` (the training split; classes ``0..C-1``)."""
        r_words, r_bigrams = log_count_ratios(examples, self.bias.numel(), self.words.shape[0], self.buckets, alpha)
        self.word_ratios.copy_(r_words)
        self.bigram_ratios.copy_(r_bigrams)

    def contributions(self, ids: Tensor, mask: Tensor) -> Tensor:
        """``(B, T, C)``: what each position adds to each class's logit (its word, and the bigram it starts); 0 at
        padding. Summed over ``T`` and added to the bias it is :meth:`forward`."""
        b = bigram_ids(ids, mask, self.buckets)
        words = self.words[ids] * self.word_ratios[ids] * mask.unsqueeze(-1).to(self.words.dtype)
        return words + self.bigrams[b] * self.bigram_ratios[b]  # row 0 (no bigram) has ratio 0

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """``(B, C)`` logits of the path."""
        return self.contributions(ids, mask).sum(1) + self.bias


def log_count_ratios(examples, num_classes: int, rows: int, buckets: int,
                     alpha: float = 1.0) -> tuple[Tensor, Tensor]:
    """Wang & Manning's log-count ratios ``r = log((p + a) / |p + a|_1) - log((q + a) / |q + a|_1)`` of every word
    and hashed bigram, for each class against the rest: ``(r_words (rows, C), r_bigrams (buckets + 1, C))`` from
    ``examples`` of ``(ids, label)``, ``p`` and ``q`` the counts of texts of the class and of the other classes
    holding the feature (a text counts once per word or bigram it holds: binarized counts, as in NBSVM); rows no
    text fills (padding, no bigram, empty buckets) are 0."""
    words = torch.zeros(rows, num_classes, dtype=torch.float64)
    bigrams = torch.zeros(buckets + 1, num_classes, dtype=torch.float64)
    for ids, label in examples:
        if not ids:
            continue
        if not 0 <= int(label) < num_classes:
            raise ValueError(f"log-count ratios: label {label} is not a class 0..{num_classes - 1}")
        t = torch.tensor([ids], dtype=torch.long)
        words[torch.unique(t), label] += 1
        if buckets:
            b = torch.unique(bigram_ids(t, torch.ones_like(t, dtype=torch.bool), buckets))
            bigrams[b[b > 0], label] += 1
    return _ratios(words, alpha), _ratios(bigrams, alpha)


def _ratios(counts: Tensor, alpha: float) -> Tensor:
    rest = counts.sum(1, keepdim=True) - counts
    p, q = counts + alpha, rest + alpha
    r = (p / p.sum(0)).log() - (q / q.sum(0)).log()
    r[counts.sum(1) == 0] = 0  # padding, and buckets no training text fills
    return r.float()


class BigramAttentionClassifier(nn.Module):
    """Attention pooling over word vectors enriched with hashed bigram vectors: fast, and its weights are per word.

    Position ``t``'s vector is ``E[w_t] + H[hash(w_t, w_{t+1})]`` (the bigram buckets of fastText, Joulin et al.,
    2017, "Bag of Tricks for Efficient Text Classification", https://aclanthology.org/E17-2068; :func:`bigram_ids`),
    optionally through a position-wise ``tanh`` layer (``hidden_dim``); the vectors are pooled by
    :class:`qkv.AttentionPooling` (Yang et al.'s learned query; ``hops`` for Lin et al.'s) instead of fastText's
    mean, so the pooled weights say which words (with the word after each) decided. No recurrence: a step costs a
    few matrix products, so a short budget gives many epochs.

    Args:
        vocab_size, num_classes: as in :class:`RNNClassifier`.  embed_dim: word and bigram vector size.
        buckets: rows of the bigram table (``0`` = words only).  hidden_dim: a position-wise ``tanh`` layer after
            the sum (0/None = none).  hops, attn_dim, mlp_dim, dropout, embed_dropout, padding_idx, pretrained,
            freeze_embeddings, nbsvm: as in :class:`RNNClassifier` (``dropout`` is on the pooled vector).
        word_dropout: in training, each word (with its bigram) is left out of the pooling with this probability
            (the first word always stays): Iyyer et al., 2015, "Deep Unordered Composition Rivals Syntactic
            Methods for Text Classification", https://aclanthology.org/P15-1162.
    """

    def __init__(self, vocab_size: int, num_classes: int, *, embed_dim: int = 64, buckets: int = 100_000,
                 hidden_dim: int | None = None, hops: int = 1, attn_dim: int | None = None,
                 mlp_dim: int | None = None, dropout: float = 0.5, embed_dropout: float = 0.3,
                 word_dropout: float = 0.0, padding_idx: int = 0, pretrained: Tensor | None = None,
                 freeze_embeddings: bool = False, nbsvm: int = 0):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if not 0 <= word_dropout < 1:
            raise ValueError(f"word_dropout must be in [0, 1), got {word_dropout}")
        if buckets < 0:
            raise ValueError(f"buckets must be >= 0 (0 = no bigrams), got {buckets}")
        self.embedding = _embedding(vocab_size, embed_dim, padding_idx, pretrained, freeze_embeddings)
        embed_dim = self.embedding.embedding_dim
        self.bigrams = _bigram_table(buckets, embed_dim)
        self.buckets, self.word_dropout = buckets, word_dropout
        self.embed_dropout = nn.Dropout(embed_dropout)
        self.hidden = nn.Sequential(nn.Linear(embed_dim, hidden_dim), nn.Tanh()) if hidden_dim else nn.Identity()
        dim = hidden_dim or embed_dim
        self.pool = AttentionPooling(dim, attn_dim or dim, num_queries=hops)
        self.head = _head(dim * hops, num_classes, mlp_dim, dropout)
        self.nbsvm = _nbsvm(nbsvm, vocab_size, num_classes)

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> ClassifierOutput:
        """``ids (B, T)``, ``mask (B, T)`` bool, True at real tokens -> ``(logits (B, C), weights)``."""
        mask = _check_inputs(ids, mask)
        x = self.embedding(ids)
        if self.bigrams is not None:
            x = x + self.bigrams(bigram_ids(ids, mask, self.buckets))
        pool_mask = mask
        if self.training and self.word_dropout:  # Iyyer et al. 2015's word dropout; one word always stays
            keep = torch.rand(mask.shape, device=mask.device) >= self.word_dropout
            first = torch.zeros_like(mask)
            first[torch.arange(len(mask), device=mask.device), mask.float().argmax(1)] = True
            pool_mask = mask & (keep | first)
        pooled, weights = self.pool(self.hidden(self.embed_dropout(x)), pool_mask)
        return _output(self, self.head(pooled.reshape(ids.shape[0], -1)), weights, ids, mask)


CLASSIFIERS = {"bigru": (RNNClassifier, {"cell": "gru"}), "bilstm": (RNNClassifier, {"cell": "lstm"}),
               "transformer": (TransformerClassifier, {}),
               "bigram": (BigramAttentionClassifier, {})}


def create_classifier(name: str, vocab_size: int, num_classes: int, **kwargs) -> nn.Module:
    """``create_classifier("bigru" | "bilstm" | "transformer", vocab_size, num_classes, **options)``."""
    if name not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {name!r}; one of {', '.join(CLASSIFIERS)}")
    cls, preset = CLASSIFIERS[name]
    return cls(vocab_size, num_classes, **{**preset, **kwargs})


def load_word_vectors(path: str | os.PathLike, vocab: Sequence[str], *, lowercase: bool = True,
                      seed: int = 0) -> tuple[Tensor, int]:
    """Word vectors for ``vocab`` from a text file in the GloVe or word2vec text format (``.gz`` too).

    Each line is ``word v_1 ... v_D``; a first line ``N D`` (word2vec's header) is skipped. ``vocab[i]`` is the
    token of id ``i`` (e.g. ``tok.tokens_of_ids(range(tok.vocab_size))``). A token not in the file tries its
    lower-case form (``lowercase=True``); tokens still missing get random vectors with the found vectors'
    standard deviation (from ``seed``), and id 0 (padding) is zero. The binary word2vec format is not read.

    Returns:
        ``(vectors (len(vocab), D), found)``: the matrix for ``pretrained=`` and how many tokens were found.
    """
    path = Path(path)
    index: dict[str, int] = {}
    for i, w in enumerate(vocab):
        index.setdefault(w, i)
    lower: dict[str, list[int]] = {}
    if lowercase:
        for w, i in index.items():
            lower.setdefault(w.lower(), []).append(i)
    from ..data.files import text_lines

    rows: dict[int, list[float]] = {}
    exact: set[int] = set()
    dim = None
    for line_no, line in text_lines(path):
        parts = line.rstrip().split(" ")
        if line_no == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
            continue  # word2vec header
        if len(parts) < 2:
            continue
        if dim is None:
            dim = len(parts) - 1
        elif len(parts) - 1 != dim:
            raise ValueError(f"{path}:{line_no}: {len(parts) - 1} numbers, expected {dim}")
        word = parts[0]
        targets = []
        if word in index:
            targets.append((index[word], True))
        for i in lower.get(word.lower(), ()) if lowercase else ():
            targets.append((i, False))
        for i, is_exact in targets:
            if i in exact or (not is_exact and i in rows):
                continue
            try:
                rows[i] = [float(v) for v in parts[1:]]
            except ValueError:
                raise ValueError(f"{path}:{line_no}: not a number in the vector of {word!r}") from None
            if not all(math.isfinite(v) for v in rows[i]):
                raise ValueError(f"{path}:{line_no}: the vector of {word!r} holds nan or inf; a model cannot "
                                 "train from it (fix or drop that line)")
            if is_exact:
                exact.add(i)
    if dim is None:
        raise ValueError(f"{path}: no word vectors found")
    found = torch.tensor(list(rows.values()), dtype=torch.float32) if rows else torch.zeros(0, dim)
    std = float(found.std()) if found.numel() > 1 else 0.1
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(len(vocab), dim, generator=gen) * std
    for i, v in rows.items():
        out[i] = torch.tensor(v)
    if len(vocab):
        out[0] = 0.0
    log.info("%s: vectors for %d of %d tokens (dimension %d)", path, len(rows), len(vocab), dim)
    return out, len(rows)
