"""Summarisation's data, model, metric and the trainer's task: :func:`load_data`, :func:`model_spec`,
:func:`train_tokenizer`, :func:`evaluate_summaries` and :class:`SummarizeTask`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from ...options import option_error, ref
from ..base import ApplicationTask
from .decode import collate, encode_example, summarize_batch, summary_metrics
from .options import SummarizeOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "train_tokenizer", "evaluate_summaries", "SummarizeTask"]


def load_data(options: SummarizeOptions):
    """The :class:`~qkv.apps.summarize.data.SummaryCorpus` that ``options`` describe; every split must hold an
    example."""
    from .data import debian_corpus, facts_corpus, read_summaries

    o = options
    if o.data == "facts":
        return facts_corpus(o.lang, n_train=o.n_train, n_eval=o.n_eval, seed=o.data_seed)
    if o.data == "debian":
        if not Path(o.debian_file).is_file():
            raise option_error(FileNotFoundError, "no Debian descriptions at {path} (" + ref("debian_file") + ")",
                               "debian_file", path=o.debian_file)
        corpus = debian_corpus(o.debian_file, on_error=o.on_error, seed=o.data_seed, max_examples=o.max_examples)
    else:
        corpus = read_summaries(o.data, source=o.source_column, target=o.target_column, fmt=o.format,
                                on_error=o.on_error, seed=o.data_seed, max_examples=o.max_examples)
    sizes = corpus.sizes()
    if not all(sizes.values()):
        raise ValueError(f"{o.data}: too few examples to split: {', '.join(f'{n} {s}' for s, n in sizes.items())}; "
                         "every split needs at least one (about 40 distinct texts for the 90/5/5 split)")
    return corpus


def train_tokenizer(options: SummarizeOptions, corpus):
    """One word vocabulary for sources and targets (the copy distribution adds the words outside it)."""
    from ...data import WordTokenizer

    texts = [t for ex in corpus.train for t in (ex.source, ex.target)]
    return WordTokenizer.train(texts, min_freq=options.min_freq, max_size=options.vocab_size)


def model_spec(options: SummarizeOptions, *, vocab: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`: the model ``options`` describe for a vocabulary."""
    o = options
    if o.model == "transformer":
        return {"name": "transformer-pointer",
                "config": {"vocab": vocab, "dim": o.dim, "num_heads": o.num_heads, "ffn_dim": o.ffn_dim or 4 * o.dim,
                           "num_layers": o.num_layers, "dropout": o.dropout, "max_len": max(512, o.max_source + 1)}}
    return {"name": "pointer",
            "config": {"vocab": vocab, "embed_dim": o.embed_dim, "hidden_dim": o.hidden_dim,
                       "attn_dim": o.attn_dim or o.hidden_dim, "copy": o.model == "pointer",
                       "coverage": o.coverage, "dropout": o.dropout, **({"oov_slots": o.slots} if o.slots else {}),
                       **({"score": o.score_name} if o.score_name != "additive" else {}),
                       **({"reader_layers": o.reader_layers} if o.reader_layers else {})}}


def evaluate_summaries(model: nn.Module, tokenizer, examples, options: SummarizeOptions, *, beam: int,
                       max_len: int, **decoding: Any) -> tuple[dict[str, float], list]:
    """Summarisation's metric, for the trainer and the predictor alike: ROUGE-1/2/L, ``repeated_trigrams``,
    ``copied``, ``copied_oov``, ``p_gen`` and ``length`` (``exact_match`` and ``f1`` for facts) of ``model``
    summarising ``examples`` (``decoding``: :func:`~qkv.apps.summarize.decode.summarize_batch`'s penalties); the
    figures and the summaries."""
    outputs = summarize_batch(model, tokenizer, [ex.source for ex in examples], beam=beam, max_len=max_len,
                              max_source=options.max_source, **decoding)
    figures = summary_metrics([s.text for s in outputs], [ex.target for ex in examples],
                              answers=options.data == "facts", summaries=outputs)
    return figures, outputs


class SummarizeTask(ApplicationTask, name="summarize", unit="tokens", options=SummarizeOptions, load_data=load_data,
                    model_spec=model_spec, assets=("tokenizer",)):
    """Teacher-forced negative log-likelihood of the target words under the copy distribution, plus (from step
    ``coverage_from`` on) ``coverage_weight`` times the coverage loss."""

    def __init__(self, options: SummarizeOptions, data=None):
        super().__init__(options, data)
        self._train: list | None = None
        #: the training step from which coverage is on: ``coverage_from`` as a step, or set by the callback of
        #: :meth:`callbacks` when the fraction ``coverage_from`` of the training is reached
        self.coverage_step: int | None = None
        self._fraction_watched = False
        o = options
        if o.coverage and o.coverage_fraction is None:
            self.coverage_step = int(o.coverage_from)

    def callbacks(self, config) -> list:
        """The trainer's callback that switches coverage on once the fraction ``coverage_from`` of the training
        is done: of ``config.max_minutes`` of training time, or of the steps (``max_steps``, ``schedule_steps``,
        else the epochs' batches), whichever comes first. None when ``coverage_from`` is not a fraction."""
        fraction = self.options.coverage_fraction
        if fraction is None:
            return []
        self._fraction_watched = True
        from ...train.schedule import num_batches

        def switch(state, logs) -> None:
            if self.coverage_step is not None:
                return
            steps = config.max_steps or config.schedule_steps or config.epochs * max(
                1, num_batches(len(self._train), config.batch_size, drop_last=config.drop_last))
            done = state.global_step / steps
            if config.max_minutes:
                done = max(done, state.elapsed / (60 * config.max_minutes))
            if done >= fraction:
                self.coverage_step = state.global_step
                logger.info("coverage on from step %d (%.0f%% of the training done)", state.global_step, 100 * done)

        return [switch]

    def setup(self) -> None:
        o = self.options
        self.read_data()
        logger.info("data %s: %s", o.data, ", ".join(f"{n} {s}" for s, n in self.data.sizes().items()))
        if self.tokenizer is None:
            self.tokenizer = train_tokenizer(o, self.data)
        self._train = [encode_example(self.tokenizer, ex.source, ex.target, max_source=o.max_source,
                                      max_target=o.max_target) for ex in self.data.train]

    def train_examples(self):
        return self._train

    def lengths(self):
        return [len(e.src) for e in self._train]

    def collate(self, examples):
        return collate(examples)

    def sizes(self) -> dict[str, Any]:
        return {"vocab": self.tokenizer.vocab_size}

    def loss(self, model, batch):
        o = self.options
        module = getattr(model, "module", model)  # under DDP
        if o.coverage_fraction is not None and not self._fraction_watched:
            raise ValueError(f"coverage_from {o.coverage_from} is a fraction of the training: train with "
                             "qkv.train.train, which registers the task's callbacks(config)")
        coverage = (o.model == "pointer" and self.coverage_step is not None
                    and int(module.trained_steps) >= self.coverage_step)
        if model.training and hasattr(module, "trained_steps"):
            module.trained_steps += 1
        out = model(batch.src, batch.src_mask, batch.tgt_in, batch.src_ext, batch.n_ext, use_coverage=coverage)
        mask = batch.tgt_mask
        # without copying, a target word outside the vocabulary can only be <unk>
        target = batch.tgt_out if module.copy else module.feed_tokens(batch.tgt_out)
        nll = -out.log_probs.gather(-1, target[..., None])[..., 0]
        loss = (nll * mask).sum()
        stats = {"p_gen": (out.p_gen * mask).sum().detach()}
        if coverage:
            cov = module.coverage_loss(out.attention, out.coverage, mask)
            loss = loss + o.coverage_weight * cov
            stats["coverage_loss"] = cov.detach()
        return loss, mask.sum(), stats

    def evaluate(self, model, split: str) -> dict[str, float]:
        o = self.options
        return evaluate_summaries(model, self.tokenizer, self.data.split(split)[:o.eval_max], o, beam=o.eval_beam,
                                  max_len=o.max_decode_len)[0]
