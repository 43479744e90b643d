"""Summarisation's data, model and the trainer's task: :func:`load_data`, :func:`model_spec`, :func:`build_model`,
:func:`train_tokenizer` and :class:`SummarizeTask`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from torch import nn

from ...train.task import Task
from .decode import collate, encode_example, summarize_batch, summary_metrics
from .options import SummarizeOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "build_model", "train_tokenizer", "SummarizeTask", "train_summarizer"]


def load_data(options: SummarizeOptions):
    """The :class:`qkv.data.summaries.SummaryCorpus` that ``options`` describe; every split must hold an example."""
    from ...data.summaries import debian_corpus, facts_corpus, read_summaries

    o = options
    if o.data == "facts":
        return facts_corpus(o.lang, n_train=o.n_train, n_eval=o.n_eval, seed=o.data_seed)
    if o.data == "debian":
        if not Path(o.debian_file).is_file():
            raise FileNotFoundError(f"no Debian descriptions at {o.debian_file} (--debian-file)")
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


def build_model(options: SummarizeOptions, *, vocab: int) -> nn.Module:
    """A new summariser (see :func:`model_spec`)."""
    from ...models import create

    spec = model_spec(options, vocab=vocab)
    return create(spec["name"], **spec["config"])


class SummarizeTask(Task):
    """Teacher-forced negative log-likelihood of the target words under the copy distribution, plus (from step
    ``coverage_from`` on) ``coverage_weight`` times the coverage loss."""

    name = "summarize"
    unit = "tokens"

    def __init__(self, options: SummarizeOptions, data=None):
        self.options = options
        self.corpus = data
        self.tok = None
        self._train: list | None = None
        #: the training step from which coverage is on: ``coverage_from`` as a step, or set by
        #: :meth:`coverage_callback` when the fraction ``coverage_from`` of the training is reached
        self.coverage_step: int | None = None
        self._fraction_watched = False
        o = options
        if o.coverage and o.coverage_fraction is None:
            self.coverage_step = int(o.coverage_from)

    def coverage_callback(self, config):
        """The trainer's callback that switches coverage on once the fraction ``coverage_from`` of the training
        is done: of ``config.max_minutes`` of training time, or of the steps (``max_steps``, ``schedule_steps``,
        else the epochs' batches), whichever comes first. ``None`` when ``coverage_from`` is not a fraction."""
        fraction = self.options.coverage_fraction
        if fraction is None:
            return None
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

        return switch

    def setup(self) -> None:
        o = self.options
        if self.corpus is None:
            self.corpus = load_data(o)
        logger.info("data %s: %s", o.data, ", ".join(f"{n} {s}" for s, n in self.corpus.sizes().items()))
        if self.tok is None:
            self.tok = train_tokenizer(o, self.corpus)
        self._train = [encode_example(self.tok, ex.source, ex.target, max_source=o.max_source,
                                      max_target=o.max_target) for ex in self.corpus.train]

    def train_examples(self):
        return self._train

    def lengths(self):
        return [len(e.src) for e in self._train]

    def collate(self, examples):
        return collate(examples)

    def save_assets(self, directory: Path) -> None:
        self.tok.save(directory / "tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ...data import load_tokenizer

        self.tok = load_tokenizer(directory / "tokenizer")

    def sizes(self) -> dict[str, Any]:
        """The sizes :func:`model_spec` takes, from the tokeniser (after :meth:`setup`)."""
        return {"vocab": self.tok.vocab_size}

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, **self.sizes()), "options": dataclasses.asdict(self.options)}

    def build_model(self) -> nn.Module:
        return build_model(self.options, **self.sizes())

    def loss(self, model, batch):
        o = self.options
        module = getattr(model, "module", model)  # under DDP
        if o.coverage_fraction is not None and not self._fraction_watched:
            raise ValueError(f"coverage_from {o.coverage_from} is a fraction of the training: train with "
                             "qkv.tasks.summarize.train_summarizer (or pass task.coverage_callback(config) to train)")
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
        examples = self.corpus.split(split)[:o.eval_max]
        outputs = summarize_batch(model, self.tok, [ex.source for ex in examples], beam=o.eval_beam,
                                  max_len=o.max_decode_len, max_source=o.max_source)
        return summary_metrics([s.text for s in outputs], [ex.target for ex in examples],
                               answers=o.data == "facts", summaries=outputs)


def train_summarizer(options: SummarizeOptions, config, data=None) -> list:
    """``qkv train summarize``: one run of :class:`SummarizeTask` with its coverage switch
    (:meth:`SummarizeTask.coverage_callback`); ``[TrainResult]``."""
    from ...train import train

    task = SummarizeTask(options, data=data)
    callback = task.coverage_callback(config)
    return [train(task, config, [callback] if callback else [])]
