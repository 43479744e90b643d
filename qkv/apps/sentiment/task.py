"""Sentiment analysis's data, model, metric and the trainer's task: :func:`load_data`, :func:`make_splits`,
:func:`model_spec`, :func:`evaluate_classifier`, :class:`SentimentTask`, and :func:`train_folds` (k-fold
cross-validation)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...data.text_classification import collate_texts
from ...options import OptionError, ref
from ...train.threads import follow_threads
from ..base import ApplicationTask
from .options import SentimentOptions
from .upgrade import upgrade_config

logger = logging.getLogger(__name__)

BIGRAM_BUCKETS = 30_000  #: the bigram model's hashed bigram rows when ``buckets`` is not given
BIGRAM_DIM = 64  #: the bigram model's vector size when ``embed_dim`` is not given

__all__ = ["load_data", "make_splits", "model_spec", "SentimentTask", "train_folds", "evaluate_classifier"]


def load_data(options: SentimentOptions):
    """The :class:`qkv.data.text_classification.TextDataset` that ``options`` describes."""
    from ...data.text_classification import read_movie_reviews, read_table

    if not options.data:
        raise OptionError("no data file: give " + ref("data") + " (a file)", "data")
    if not Path(options.data).is_file():
        raise FileNotFoundError(f"no such data file: {options.data} (data)")
    if options.text_col is None:
        return read_movie_reviews(options.data, regression=options.regression, on_error=options.on_error)
    labels = [s.strip() for s in options.labels.split(",")] if options.labels else None
    return read_table(options.data, text_col=options.text_col, label_col=options.label_col,
                      delimiter=options.delimiter, header=options.header, labels=labels,
                      regression=options.regression, on_error=options.on_error)


def make_splits(labels, options: SentimentOptions) -> dict[str, list[int]]:
    """``{"train", "valid", "test"}`` indices: a stratified split, or fold ``options.fold`` of ``options.folds``
    (its test part; validation is carved, stratified, from the other folds). Every split must be non-empty."""
    from ...data.text_classification import kfold_splits, stratified_split

    o = options
    if not o.folds:
        train, valid, test = stratified_split(labels, valid=o.valid, test=o.test, seed=o.data_seed)
        splits = {"train": train, "valid": valid, "test": test}
    else:
        rest, test = kfold_splits(labels, o.folds, seed=o.data_seed)[o.fold]
        tr, va, _ = stratified_split([labels[i] for i in rest], valid=o.valid, test=0.0, seed=o.data_seed)
        splits = {"train": [rest[i] for i in tr], "valid": [rest[i] for i in va], "test": test}
    needed = ("train", "valid", "test") if o.test or o.folds else ("train", "valid")
    if not all(splits[s] for s in needed):
        raise ValueError(f"{o.data or 'the data'}: {len(labels)} examples give "
                         f"{', '.join(f'{len(splits[s])} {s}' for s in needed)}; every split needs at least one "
                         "example: use more data or larger fractions")
    return splits


def model_spec(options: SentimentOptions, *, vocab_size: int, num_classes: int, lm: dict[str, Any] | None = None,
               bos_id: int | None = None) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create` (JSON only: pretrained vectors and a language model's
    weights are loaded apart); model ``lm`` takes the language model's configuration ``lm`` and its document
    start ``bos_id``."""
    o = options
    if o.model == "lm":
        return {"name": "lm-classifier", "config": {"lm": lm, "num_classes": num_classes, "bos_id": bos_id,
                                                    "hops": o.hops, "dropout": o.dropout}}
    embed_dim = o.embed_dim or (BIGRAM_DIM if o.model == "bigram" else 128)
    config: dict[str, Any] = {"vocab_size": vocab_size, "num_classes": num_classes, "embed_dim": embed_dim,
                              "num_layers": o.num_layers, "hops": o.hops, "dropout": o.dropout,
                              "embed_dropout": o.embed_dropout}
    if o.nbsvm:
        config["nbsvm"] = o.nbsvm_buckets
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim, pooling=o.pooling)
        return {"name": "transformer-classifier", "config": config}
    if o.model == "bigram":
        del config["num_layers"]
        config.update(buckets=BIGRAM_BUCKETS if o.buckets is None else o.buckets, hidden_dim=o.bigram_hidden,
                      word_dropout=o.word_dropout, attn_dim=o.attn_dim, mlp_dim=o.mlp_dim)
        return {"name": "bigram-classifier", "config": config}
    config.update(hidden_dim=o.hidden_dim, attn_dim=o.attn_dim, mlp_dim=o.mlp_dim)
    if o.buckets:
        config["buckets"] = o.buckets
    return {"name": f"{o.model}-classifier", "config": config}


@torch.no_grad()
def encode_texts(data, indices, tokenizer, max_len: int) -> list[tuple[list[int], Any]]:
    """``(token ids, label)`` of the texts of ``data`` at ``indices`` (a split), each cut to ``max_len`` tokens:
    the examples the trainer and the predictor's evaluation read."""
    ids = tokenizer.encode_batch(data.texts[i] for i in indices)
    return [(x[:max_len], data.labels[i]) for x, i in zip(ids, indices, strict=True)]


def evaluate_classifier(model: nn.Module, examples: list[tuple[list[int], Any]], regression: bool,
                        batch_size: int = 256) -> dict[str, float]:
    """Sentiment's metric, for the trainer and the predictor alike: accuracy and loss (MSE and sign accuracy for a
    ``regression`` run) of ``model`` on encoded ``examples`` (``(ids, label)``), batched by length."""
    from ...metrics import classification_metrics, regression_metrics

    if not examples:
        return {}
    device = next(model.parameters()).device
    preds, ys = [], []
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    for s in follow_threads(range(0, len(order), batch_size),
                            lambda s: sum(len(examples[i][0]) for i in order[s:s + batch_size]), device=device):
        batch = collate_texts([examples[i] for i in order[s:s + batch_size]], regression=regression)
        preds.append(model(batch["ids"].to(device), batch["mask"].to(device)).logits.float().cpu())
        ys.append(batch["labels"])
    logits, labels = torch.cat(preds), torch.cat(ys)
    if regression:
        return regression_metrics(logits[:, 0], labels)
    return classification_metrics(logits, labels)


class SentimentTask(ApplicationTask, name="sentiment", unit="items", options=SentimentOptions, load_data=load_data,
                    model_spec=model_spec, assets=("tokenizer",), upgrade=upgrade_config):
    """Text classification (cross-entropy) or rating regression (MSE) with attention-pooled classifiers.

    ``data`` (a :class:`~qkv.data.text_classification.TextDataset`) may be given to skip reading ``options.data``
    (e.g. once for all folds).
    """

    #: model lm: the language model's configuration and run, kept with every checkpoint (a resumed run rebuilds its
    #: model without the language-model run)
    json_assets = ("init",)

    def __init__(self, options: SentimentOptions, data=None):
        super().__init__(options, data)
        self.encoded: dict[str, list[tuple[list[int], Any]]] = {}
        self.init: dict[str, Any] | None = None  #: model lm: the language model's configuration, where it came from
        self._lm_weights = None

    def setup(self) -> None:
        from ...data.tokenize import WordTokenizer

        o = self.options
        data = self.read_data()
        self.splits = make_splits(data.labels, o)
        if o.model == "lm" and self.init is None:
            self._read_init()
        if self.tokenizer is None:
            self.tokenizer = WordTokenizer.train((data.texts[i] for i in self.splits["train"]), min_freq=o.min_freq,
                                                 max_size=o.max_vocab, lowercase=o.lowercase)
        logger.info("%s: %d examples (train %d, valid %d, test %d), %d classes, vocabulary %d",
                    o.data, len(data), *(len(self.splits[s]) for s in ("train", "valid", "test")),
                    data.num_classes, self.tokenizer.vocab_size)
        for split, idx in self.splits.items():
            self.encoded[split] = encode_texts(data, idx, self.tokenizer, self.max_len)
        if self.init is not None:  # a language model's tokenizer may lack characters of this data
            from ..lm.coverage import warn_uncovered

            warn_uncovered(self.tokenizer, [x for x, _ in self.encoded["train"]],
                           [data.texts[i] for i in self.splits["train"]], self.init["run"])

    @property
    def max_len(self) -> int:
        """Tokens read per text: ``max_len``, and for model lm at most the language model's context less one (its
        document start)."""
        if self.init is None or self.init["model"].get("positions") == "alibi":
            return self.options.max_len
        return min(self.options.max_len, self.init["model"]["max_len"] - 1)

    def _read_init(self) -> None:
        """The language model of ``init``: its configuration, tokenizer and weights (a run of another task, or one
        without weights, is a ``ValueError`` naming ``init``)."""
        from ...data import load_tokenizer
        from ..lm.options import LMOptions
        from ..run import load_run

        path = self.options.init
        try:
            run = load_run(path, "lm", LMOptions, "cpu")
        except (ValueError, OSError) as e:
            raise type(e)(f"init {path}: {e}") from None
        spec = run.checkpoint.config["model"]
        try:
            tokenizer = load_tokenizer(run.checkpoint.assets / "tokenizer")
        except (ValueError, OSError) as e:
            raise ValueError(f"init {path}: no readable tokenizer ({e})") from None
        if tokenizer.vocab_size != spec["config"]["vocab_size"]:
            raise ValueError(f"init {path}: its tokenizer has {tokenizer.vocab_size} tokens but its model reads "
                             f"{spec['config']['vocab_size']}: the run's tokenizer does not belong to its weights")
        if self.tokenizer is not None and self.tokenizer != tokenizer:
            raise ValueError(f"init {path}: its tokenizer is not the one this run was started with (a resumed run "
                             "keeps its own): give the same language-model run")
        self.tokenizer = tokenizer
        self.init = {"run": str(path), "model": dict(spec["config"])}
        self._lm_weights = run.model.state_dict()
        logger.info("init: the %d-layer language model of %s (vocabulary %d)", spec["config"]["num_layers"], path,
                    tokenizer.vocab_size)

    def train_examples(self):
        return self.encoded["train"]

    def lengths(self):
        return [max(len(x), 1) for x, _ in self.encoded["train"]]

    def collate(self, examples):
        return collate_texts(examples, regression=self.data.regression)

    def run_config(self) -> dict[str, Any]:
        extra = {} if self.init is None else {"init": self.init["run"]}
        return {"label_names": self.data.label_names, "regression": self.data.regression, **extra}

    def sizes(self) -> dict[str, Any]:
        extra = {} if self.init is None else {"lm": self.init["model"], "bos_id": self.tokenizer.eos_id}
        return {"vocab_size": self.tokenizer.vocab_size, "num_classes": self.data.num_classes, **extra}

    def param_groups(self, model, config) -> list[dict[str, Any]]:
        """Model lm: discriminative learning rates (``lr_decay``) and gradual unfreezing (``unfreeze`` epochs per
        layer, from the top) over :meth:`~qkv.models.lm_classifier.LMClassifier.layer_groups`; the others one
        rate."""
        from ...train.precision import layered_groups

        if self.options.model != "lm":
            return super().param_groups(model, config)
        steps_per_epoch = math.ceil(len(self.encoded["train"]) / config.batch_size)
        return layered_groups(model.layer_groups(), config.weight_decay, lr_decay=self.options.lr_decay,
                              unfreeze_steps=round(self.options.unfreeze * steps_per_epoch))

    def build_model(self) -> nn.Module:
        """The classifier of :meth:`spec`; with ``vectors``, its embedding starts from the vectors of the
        vocabulary's words; the bigram model with ``count_init`` starts from the training counts, and the NBSVM
        path (``nbsvm``) takes its log-count ratios from them."""
        from ...models import create
        from ...models.classifiers import load_word_vectors

        o, spec = self.options, self.spec()
        if o.model == "lm":  # the language model's body; on a resume the checkpoint's weights replace it
            model = create(spec["name"], **spec["config"])
            if self._lm_weights is not None:
                model.body.load_state_dict(self._lm_weights)
            return model
        extra: dict[str, Any] = {}
        if o.vectors:
            vocab = self.tokenizer.tokens_of_ids(range(self.tokenizer.vocab_size))
            pretrained, found = load_word_vectors(o.vectors, vocab)
            logger.info("word vectors for %d of %d tokens from %s", found, len(vocab), o.vectors)
            extra = {"pretrained": pretrained, "freeze_embeddings": o.freeze_vectors}
        model = create(spec["name"], **spec["config"], **extra)
        if getattr(model, "nbsvm", None) is not None and "train" in self.encoded:  # the counts of the training split
            model.nbsvm.fit(self.encoded["train"])
        if o.model == "bigram" and o.count_init and not self.data.regression and "train" in self.encoded:
            from .count_init import count_init

            count_init(model, self.encoded["train"], self.data.num_classes)
        return model

    def loss(self, model, batch):
        out = model(batch["ids"], batch["mask"])
        y = batch["labels"]
        if self.data.regression:
            pred = out.logits[:, 0]
            loss = F.mse_loss(pred, y, reduction="sum")
            stats = {"correct": ((pred > 0) == (y > 0)).sum()}
        else:
            loss = F.cross_entropy(out.logits, y, reduction="sum")
            stats = {"correct": (out.logits.argmax(-1) == y).sum()}
        if self.options.penalty:
            from ...layers.pooling import AttentionPooling

            pen = AttentionPooling.penalty(out.weights).sum()
            loss = loss + self.options.penalty * pen
            stats["penalty"] = pen.detach()
        return loss, len(y), stats

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in self.encoded:
            raise ValueError(f"no split {split!r}; one of {', '.join(self.encoded)}")
        return evaluate_classifier(model, self.encoded[split], self.data.regression)


def train_folds(options: SentimentOptions, config, data=None) -> dict[str, Any]:
    """Train one split, or every fold when ``options.folds`` (each into ``config.out/fold-K``).

    Returns ``{"runs": [TrainResult...], "test_accuracy": [...], "mean": m, "std": s}`` (one run without folds);
    with folds, the same figures (without the runs) go into ``config.out/kfold.json``.
    """
    from ...train import train

    if data is None:
        data = load_data(options)
    folds = range(options.folds) if options.folds else [None]
    runs, accs = [], []
    for f in folds:
        o, cfg = options, config
        if f is not None:
            o = dataclasses.replace(options, fold=f)
            cfg = config.replace(out=str(Path(config.out) / f"fold-{f}") if config.out else None)
            logger.info("fold %d of %d", f + 1, options.folds)
        result = train(SentimentTask(o, data), cfg)
        runs.append(result)
        accs.append(result.metrics.get("test", {}).get("accuracy", math.nan))
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else 0.0
    summary = {"test_accuracy": accs, "mean": mean, "std": std}
    if options.folds and config.out and int(os.environ.get("RANK", "0")) == 0:
        path = Path(config.out) / "kfold.json"
        tmp = path.with_name(f".kfold.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        logger.info("wrote %s", path)
    return {"runs": runs, **summary}
