"""Translation's data, model, metric and the trainer's task: :func:`load_data`, :func:`model_spec`,
:func:`evaluate_translations` and :class:`TranslateTask`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import nn

from ..base import ApplicationTask
from .decode import translate_batch
from .options import TranslateOptions
from .upgrade import upgrade_config

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "TranslateTask", "evaluate_translations"]


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


def evaluate_translations(model: nn.Module, src_tokenizer, tgt_tokenizer, grouped: list[tuple[str, list[str]]], *,
                          beam: int, max_len: int, buckets: tuple[tuple[int, int], ...] = (),
                          length_unit: str = "tokens", **fusion: Any) -> dict[str, float]:
    """Translation's metric, for the trainer and the predictor alike: BLEU, chrF and exact match (sacrebleu) of
    ``model`` on ``grouped`` (each distinct source once, with all of its translations), and with ``buckets`` the
    same by source length (``bleu@0-10``, ``sentences@0-10``... in ``length_unit``: tokens or words); ``fusion``:
    :func:`~qkv.apps.translate.decode.translate_batch`'s ``lm``, ``lm_weight`` and ``length_reward``."""
    from ...metrics import bleu_by_length, translation_metrics

    results = translate_batch(model, src_tokenizer, tgt_tokenizer, [s for s, _ in grouped], beam=beam,
                              max_len=max_len, **fusion)
    hyps, refs = [r.text for r in results], [r for _, r in grouped]
    figures = translation_metrics(hyps, refs)
    lengths = [len(r.source_tokens) if length_unit == "tokens" else len(r.source.split()) for r in results]
    for row in bleu_by_length(hyps, refs, lengths, buckets):
        figures[f"bleu@{row['bucket']}"] = row["bleu"]
        figures[f"sentences@{row['bucket']}"] = row["sentences"]
    return figures


class TranslateTask(ApplicationTask, name="translate", unit="tokens", options=TranslateOptions, load_data=load_data,
                    model_spec=model_spec, assets=("src_tokenizer", "tgt_tokenizer"), upgrade=upgrade_config):
    """Sequence-to-sequence training with label-smoothed cross-entropy over target tokens."""

    def setup(self) -> None:
        from ...data import EncodedPairs, train_tokenizer

        c = self.read_data()
        logger.info("data %s: %d train, %d valid, %d test pairs", self.options.data, len(c.train), len(c.valid),
                    len(c.test))
        if self.src_tokenizer is None:
            kind = self.options.tokenizer_kind
            kw = {"vocab_size": self.options.vocab_size} if kind in ("bpe", "unigram") else {}
            self.src_tokenizer = train_tokenizer(kind, (s for s, _ in c.train), **kw)
            self.tgt_tokenizer = train_tokenizer(kind, (t for _, t in c.train), **kw)
        self._train = EncodedPairs(c.train, self.src_tokenizer, self.tgt_tokenizer, max_src_len=256, max_tgt_len=256)

    def train_examples(self):
        return self._train

    def lengths(self):
        return self._train.lengths

    def collate(self, examples):
        from ...data import PairCollator

        return PairCollator()(examples)

    def sizes(self) -> dict[str, Any]:
        return {"src_vocab": self.src_tokenizer.vocab_size, "tgt_vocab": self.tgt_tokenizer.vocab_size}

    def loss(self, model, batch):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        target = batch.tgt_out
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=0,
                               reduction="sum", label_smoothing=self.options.label_smoothing)
        correct = ((logits.argmax(-1) == target) & batch.tgt_mask).sum()
        return loss, batch.tgt_mask.sum(), {"token_acc": correct}

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        # each distinct source once, scored against all of its translations (Tatoeba gives many sources several):
        # the figures `qkv evaluate` and benchmarks/translate.py give for the same run and beam
        return evaluate_translations(model, self.src_tokenizer, self.tgt_tokenizer,
                                     self.data.references(split)[: self.options.eval_max],
                                     beam=self.options.eval_beam, max_len=self.options.max_decode_len)
