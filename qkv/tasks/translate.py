"""Translation with attention: the options, data, model, the trainer's task and a :class:`Translator`.

The default data is the multilingual date task (human-written dates in 14 locales -> ISO 8601, characters);
any Tatoeba/Anki file works too (subword tokens trained on its training split). Models: the fixed-context
baseline (seed 002's "distracted" model), Bahdanau and Luong attention, and the Transformer.

Example::

    from qkv.tasks.translate import TranslateOptions, TranslationTask, Translator, train_defaults
    from qkv.train import train
    options = TranslateOptions(data="dates", model="bahdanau")
    train(TranslationTask(options), train_defaults(options).replace(max_minutes=5, out="runs/dates"))
    Translator.load("runs/dates").predict(["7 mars 2019"])[0].text      # '2019-03-07'
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..options import check_options, option
from ..train.task import Task
from .base import load_run, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["TranslateOptions", "load_data", "model_spec", "build_model", "train_defaults", "TranslationTask",
           "Translation", "Translator", "translate_batch", "MODELS"]

MODELS = ("fixed", "bahdanau", "luong", "transformer")
RNN_MODELS = ("fixed", "bahdanau", "luong")
_RNN = {"model": RNN_MODELS}
_TRANSFORMER = {"model": ("transformer",)}
_CORPUS = {"data": ("dates",)}  # as excludes: options of a corpus file


@dataclass
class TranslateOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("dates", help="'dates' (generated) or a source<TAB>target[<TAB>...] file, .gz allowed")
    src_lang: str | None = option(None, excludes=_CORPUS, help="source language of a corpus (picks the direction)")
    reverse: bool = option(False, excludes=_CORPUS, help="swap the corpus columns")
    max_pairs: int | None = option(None, low=1, excludes=_CORPUS, help="cap on corpus pairs (whole source groups)")
    max_length: int | None = option(20, low=1, excludes=_CORPUS, help="drop corpus pairs longer than this (words)")
    tokenizer: str = option("auto", choices=("auto", "char", "bpe", "unigram", "word"),
                            help="auto = char for dates, bpe for corpora")
    vocab_size: int = option(8000, low=8, excludes={"tokenizer": ("char", "word")},
                             help="subword vocabulary size of each side")
    n_train: int = option(50_000, low=1, applies={"data": ("dates",)}, help="generated training dates")
    n_eval: int = option(1_000, low=1, applies={"data": ("dates",)}, help="generated valid and test dates, each")
    data_seed: int = option(0, low=0, help="seed of the data's generation and split (not of training)")
    # model
    model: str = option("bahdanau", choices=MODELS, help="fixed (no attention), bahdanau, luong or transformer")
    score: str | None = option(None, applies={"model": ("bahdanau", "luong", "transformer")},
                               help="attention score, any qkv score name (default: additive for bahdanau, "
                                    "general for luong, scaled_dot for the transformer)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="RNNs: token embedding size")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNNs: decoder state and encoder output size")
    attn_dim: int | None = option(None, low=1, applies={"model": ("bahdanau", "luong")},
                                  help="hidden size of the additive/MLP score (default: hidden-dim)")
    cell: str = option("gru", choices=("gru", "lstm"), applies=_RNN, help="RNNs: recurrent cell")
    dim: int = option(128, low=2, applies=_TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=_TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=_TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")
    positions: str = option("sinusoidal", choices=("sinusoidal", "learned", "alibi", "relative"),
                            applies=_TRANSFORMER, help="transformer: position encoding: added to the embeddings "
                            "(sinusoidal, learned) or a bias on the self-attention scores (alibi, relative = T5's)")
    num_layers: int = option(1, low=1, help="RNN layers, or transformer layers in each stack")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # loss and evaluation
    label_smoothing: float = option(0.1, low=0, high=0.99, help="label smoothing of the cross-entropy")
    eval_beam: int = option(1, low=1, help="beam of the evaluations during training (1 = greedy)")
    eval_max: int = option(1000, low=1, help="sentences decoded per evaluation")
    max_decode_len: int = option(64, low=1, help="longest translation decoded in evaluations")

    def __post_init__(self):
        check_options(self)
        if self.model == "transformer" and self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")

    @property
    def score_name(self) -> str:
        if self.score:
            return self.score
        return {"bahdanau": "additive", "luong": "general", "transformer": "scaled_dot"}.get(self.model, "additive")

    @property
    def tokenizer_kind(self) -> str:
        if self.tokenizer != "auto":
            return self.tokenizer
        return "char" if self.data == "dates" else "bpe"


def train_defaults(options: TranslateOptions):
    """The trainer's settings for translation (the ``qkv train translate`` defaults)."""
    from ..train import TrainConfig

    return TrainConfig(epochs=10, batch_size=64, lr=2e-3, warmup_steps=200, schedule="cosine", weight_decay=0.01,
                       monitor="exact_match" if options.data == "dates" else "bleu")


def load_data(options: TranslateOptions):
    """The :class:`qkv.data.ParallelCorpus` that ``options`` describes; every split must hold a sentence."""
    from ..data import date_corpus, load_parallel

    if options.data == "dates":
        corpus = date_corpus(options.n_train, options.n_eval, options.n_eval, seed=options.data_seed)
    else:
        if not Path(options.data).is_file():
            raise FileNotFoundError(f"no such corpus file: {options.data} (data)")
        kw: dict[str, Any] = {"max_length": options.max_length, "max_pairs": options.max_pairs,
                              "seed": options.data_seed}
        corpus = load_parallel(options.data, **({"src_lang": options.src_lang} if options.src_lang else
                                                {"reverse": options.reverse}), **kw)
    sizes = {s: len(corpus.split(s)) for s in ("train", "valid", "test")}
    if not all(sizes.values()):
        raise ValueError(f"{options.data}: too few sentence pairs to split: "
                         f"{', '.join(f'{n} {s}' for s, n in sizes.items())}; every split needs at least one "
                         "(a corpus needs at least 3 distinct source sentences, about 60 for the 90/5/5 split to "
                         "give each one)")
    return corpus


def model_spec(options: TranslateOptions, *, src_vocab: int, tgt_vocab: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`: the model ``options`` describe for these vocabularies."""
    o = options
    if o.model == "transformer":
        config = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "dim": o.dim, "num_heads": o.num_heads,
                  "ffn_dim": o.ffn_dim or 4 * o.dim, "num_layers": o.num_layers, "dropout": o.dropout,
                  "positions": o.positions, "score": o.score_name}
    else:
        config = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "embed_dim": o.embed_dim,
                  "hidden_dim": o.hidden_dim, "num_layers": o.num_layers, "cell": o.cell, "dropout": o.dropout,
                  "score": o.score_name, "attn_dim": o.attn_dim or o.hidden_dim}
    return {"name": o.model, "config": config}


def build_model(options: TranslateOptions, *, src_vocab: int, tgt_vocab: int) -> nn.Module:
    """A new translation model (see :func:`model_spec`)."""
    from ..models import create

    spec = model_spec(options, src_vocab=src_vocab, tgt_vocab=tgt_vocab)
    return create(spec["name"], **spec["config"])


class TranslationTask(Task):
    """Sequence-to-sequence training with label-smoothed cross-entropy over target tokens."""

    name = "translate"
    unit = "tokens"

    def __init__(self, options: TranslateOptions, corpus=None):
        self.options = options
        self.corpus = corpus
        self.src_tok = self.tgt_tok = None
        self._train = None

    def setup(self) -> None:
        from ..data import EncodedPairs, train_tokenizer

        if self.corpus is None:
            self.corpus = load_data(self.options)
        c = self.corpus
        logger.info("data %s: %d train, %d valid, %d test pairs", self.options.data, len(c.train), len(c.valid),
                    len(c.test))
        if self.src_tok is None:
            kind = self.options.tokenizer_kind
            kw = {"vocab_size": self.options.vocab_size} if kind in ("bpe", "unigram") else {}
            self.src_tok = train_tokenizer(kind, (s for s, _ in c.train), **kw)
            self.tgt_tok = train_tokenizer(kind, (t for _, t in c.train), **kw)
        self._train = EncodedPairs(c.train, self.src_tok, self.tgt_tok, max_src_len=256, max_tgt_len=256)

    def train_examples(self):
        return self._train

    def lengths(self):
        return self._train.lengths

    def collate(self, examples):
        from ..data import PairCollator

        return PairCollator()(examples)

    def save_assets(self, directory: Path) -> None:
        self.src_tok.save(directory / "src_tokenizer")
        self.tgt_tok.save(directory / "tgt_tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ..data import load_tokenizer

        self.src_tok = load_tokenizer(directory / "src_tokenizer")
        self.tgt_tok = load_tokenizer(directory / "tgt_tokenizer")

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, src_vocab=self.src_tok.vocab_size, tgt_vocab=self.tgt_tok.vocab_size),
                "options": dataclasses.asdict(self.options)}

    def build_model(self) -> nn.Module:
        return build_model(self.options, src_vocab=self.src_tok.vocab_size, tgt_vocab=self.tgt_tok.vocab_size)

    def loss(self, model, batch):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        target = batch.tgt_out
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=0,
                               reduction="sum", label_smoothing=self.options.label_smoothing)
        correct = ((logits.argmax(-1) == target) & batch.tgt_mask).sum()
        return loss, batch.tgt_mask.sum(), {"token_acc": correct}

    def evaluate(self, model, split: str) -> dict[str, float]:
        from ..metrics import translation_metrics

        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        pairs = self.corpus.split(split)[: self.options.eval_max]
        hyps = translate_batch(model, self.src_tok, self.tgt_tok, [s for s, _ in pairs], beam=self.options.eval_beam,
                               max_len=self.options.max_decode_len)
        return translation_metrics([h.text for h in hyps], [t for _, t in pairs])


# ----------------------------------------------------------------------------------------------- inference

@dataclass
class Translation:
    """One translated sentence: the ``text`` and its ``tokens`` (target pieces), the ``source_tokens``, the
    alignment ``attention (T, S)`` (a row per target token, the end token's included) and the beam ``score``."""

    source: str
    text: str
    tokens: list[str]
    source_tokens: list[str]
    attention: Tensor
    score: float


def translate_batch(model: nn.Module, src_tok, tgt_tok, texts: list[str], *, beam: int = 1, max_len: int = 64,
                    batch_size: int = 64, length_penalty: float = 0.6) -> list[Translation]:
    """Translate ``texts`` with ``model`` in length-sorted batches (greedy when ``beam`` is 1)."""
    from ..data import UNK_ID, pad_sequences
    from ..models.decoding import beam_search

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: dict[int, Translation] = {}
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids = [src_tok.encode(texts[i])[:256] or [UNK_ID] for i in idx]
            src, _, mask = pad_sequences(ids)
            hyps = beam_search(model, src.to(device), mask.to(device), beam=beam, max_len=max_len,
                               length_penalty=length_penalty)
            for i, ids_i, h in zip(idx, ids, hyps, strict=True):
                results[i] = Translation(texts[i], tgt_tok.decode(h.tokens), tgt_tok.tokens_of_ids(h.tokens),
                                         src_tok.tokens_of_ids(ids_i), h.attention[:, :len(ids_i)], float(h.score))
    model.train(was_training)
    return [results[i] for i in range(len(texts))]


def _upgrade_v1(config: dict[str, Any], state_dict: dict) -> tuple[dict, dict]:
    """A qkv 0.1.0 translation run (``{"model": KIND, "arch": {...}, "options": {...}}``) in the current format."""
    from ..models.legacy import upgrade_state_dict

    kind, arch = config["model"], dict(config["arch"])
    renames = {"layers": "num_layers", "heads": "num_heads"}
    if kind == "transformer":
        arch = {"src_vocab": arch["src_vocab"], "tgt_vocab": arch["tgt_vocab"], "dim": arch["d_model"],
                "num_heads": arch["heads"], "ffn_dim": arch["ffn_dim"], "num_layers": arch["encoder_layers"],
                "num_decoder_layers": arch["decoder_layers"], "dropout": arch["dropout"], "score": arch["score"]}
        renames = {**renames, "hidden_dim": "dim"}
    else:
        arch["num_layers"] = arch.pop("layers")
    options = upgrade_options(TranslateOptions, config["options"], renames)
    return ({"model": {"name": kind, "config": arch}, "options": dataclasses.asdict(options)},
            upgrade_state_dict(kind, state_dict))


class Translator:
    """A trained translation run, ready to translate: ``Translator.load("runs/dates").predict(["7 mars 2019"])``."""

    task = TranslationTask.name

    def __init__(self, model: nn.Module, src_tok, tgt_tok, options: TranslateOptions):
        self.model, self.src_tok, self.tgt_tok, self.options = model.eval(), src_tok, tgt_tok, options

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> Translator:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory, of any release."""
        from ..data import load_tokenizer

        run = load_run(run_dir, cls.task, _upgrade_v1, TranslateOptions, device)
        assets = run.checkpoint.assets
        return cls(run.model, load_tokenizer(assets / "src_tokenizer"), load_tokenizer(assets / "tgt_tokenizer"),
                   run.options)

    def predict(self, texts: list[str], *, beam: int = 5, max_len: int = 100, batch_size: int = 64,
                length_penalty: float = 0.6) -> list[Translation]:
        """Translations of ``texts`` by beam search (greedy with ``beam=1``). An empty text is a ``ValueError``."""
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to translate")
        if beam < 1 or max_len < 1:
            raise ValueError(f"beam and max_len must be >= 1, got {beam} and {max_len}")
        return translate_batch(self.model, self.src_tok, self.tgt_tok, list(texts), beam=beam, max_len=max_len,
                               batch_size=batch_size, length_penalty=length_penalty)
