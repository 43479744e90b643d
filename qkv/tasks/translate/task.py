"""Translation's data, model and the trainer's task: :func:`load_data`, :func:`model_spec`, :func:`build_model`
and :class:`TranslateTask`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import nn

from ...train.task import Task
from .decode import translate_batch
from .options import TranslateOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "build_model", "TranslateTask", "TranslationTask"]


def load_data(options: TranslateOptions):
    """The :class:`qkv.data.ParallelCorpus` that ``options`` describes; every split must hold a sentence."""
    from ...data import date_corpus, load_parallel

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
    from ...models import create

    spec = model_spec(options, src_vocab=src_vocab, tgt_vocab=tgt_vocab)
    return create(spec["name"], **spec["config"])


class TranslateTask(Task):
    """Sequence-to-sequence training with label-smoothed cross-entropy over target tokens."""

    name = "translate"
    unit = "tokens"

    def __init__(self, options: TranslateOptions, data=None):
        self.options = options
        self.corpus = data
        self.src_tok = self.tgt_tok = None
        self._train = None

    def setup(self) -> None:
        from ...data import EncodedPairs, train_tokenizer

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
        from ...data import PairCollator

        return PairCollator()(examples)

    def save_assets(self, directory: Path) -> None:
        self.src_tok.save(directory / "src_tokenizer")
        self.tgt_tok.save(directory / "tgt_tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ...data import load_tokenizer

        self.src_tok = load_tokenizer(directory / "src_tokenizer")
        self.tgt_tok = load_tokenizer(directory / "tgt_tokenizer")

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, **self.sizes()),
                "options": dataclasses.asdict(self.options)}

    def sizes(self) -> dict[str, Any]:
        """The sizes :func:`model_spec` takes, from the data (after :meth:`setup`)."""
        return {"src_vocab": self.src_tok.vocab_size, "tgt_vocab": self.tgt_tok.vocab_size}

    def build_model(self) -> nn.Module:
        return build_model(self.options, **self.sizes())

    def loss(self, model, batch):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        target = batch.tgt_out
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=0,
                               reduction="sum", label_smoothing=self.options.label_smoothing)
        correct = ((logits.argmax(-1) == target) & batch.tgt_mask).sum()
        return loss, batch.tgt_mask.sum(), {"token_acc": correct}

    def evaluate(self, model, split: str) -> dict[str, float]:
        from ...metrics import translation_metrics

        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        # each distinct source once, scored against all of its translations (Tatoeba gives many sources several):
        # the figures `qkv evaluate` and benchmarks/translate.py give for the same run and beam
        grouped = self.corpus.references(split)[: self.options.eval_max]
        hyps = translate_batch(model, self.src_tok, self.tgt_tok, [s for s, _ in grouped],
                               beam=self.options.eval_beam, max_len=self.options.max_decode_len)
        return translation_metrics([h.text for h in hyps], [refs for _, refs in grouped])


TranslationTask = TranslateTask  # the name before 0.3
