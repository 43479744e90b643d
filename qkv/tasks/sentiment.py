"""Sentiment analysis with attention: the options, data, model, the trainer's task and a
:class:`SentimentClassifier`.

The default data format is the movie-review snippets (``id<TAB>rating<TAB>text``, binary by the rating's sign,
or the rating itself with ``regression``); ``text_col``/``label_col`` read any CSV/TSV file instead. The
model's pooled attention weights are its visible output: each prediction carries a weight per word.

Example::

    from qkv.tasks.sentiment import SentimentClassifier, SentimentOptions, train_defaults, train_folds
    options = SentimentOptions(data="movie-review-snippets.tsv.gz", model="bigru")
    train_folds(options, train_defaults(options).replace(out="runs/mr"))
    SentimentClassifier.load("runs/mr").predict(["a gorgeous, witty, seductive movie."])[0].label
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.text_classification import collate_texts
from ..options import check_options, option
from ..train.task import Task
from .base import load_run, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["SentimentOptions", "load_data", "make_splits", "model_spec", "build_model", "train_defaults",
           "SentimentTask", "train_folds", "collate_texts", "Prediction", "SentimentClassifier", "MODELS"]

MODELS = ("bigru", "bilstm", "transformer")
_RNN = {"model": ("bigru", "bilstm")}
_TRANSFORMER = {"model": ("transformer",)}


@dataclass
class SentimentOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("", help="movie-review file (id<TAB>rating<TAB>text) or a CSV/TSV file, .gz allowed")
    text_col: str | None = option(None, help="CSV/TSV: the text column (name or 0-based index)")
    label_col: str | None = option(None, help="CSV/TSV: the label column (name or 0-based index)")
    delimiter: str | None = option(None, help="CSV/TSV delimiter (default: tab for .tsv, else comma)")
    header: bool = option(True, help="CSV/TSV: the first row names the columns")
    labels: str | None = option(None, help="CSV/TSV: comma-separated known labels (others are bad rows)")
    on_error: str = option("raise", choices=("raise", "skip"), help="bad rows: stop, or skip and count them")
    regression: bool = option(False, help="predict the rating (MSE) instead of classes")
    # splits
    valid: float = option(0.1, low=0, low_open=True, high=0.5, help="fraction for validation")
    test: float = option(0.1, low=0, high=0.5, applies={"folds": (0,)},
                         help="fraction held out for the test (without folds)")
    folds: int = option(0, low=0, help="k-fold cross-validation: k runs, each testing on one fold (0 = one split)")
    fold: int = option(0, low=0, cli=False, help="the fold this task trains (set by the k-fold loop)")
    data_seed: int = option(0, low=0, help="seed of the splits (not of training)")
    # tokens
    min_freq: int = option(1, low=1, help="words seen fewer times in the training split become <unk>")
    max_vocab: int | None = option(30000, low=5, help="vocabulary cap, special tokens included")
    max_len: int = option(100, low=1, help="tokens kept per text")
    lowercase: bool = option(True, help="lower-case the words")
    # model
    model: str = option("bigru", choices=MODELS, help="bigru, bilstm (attention pooling) or transformer")
    embed_dim: int = option(128, low=1, help="word vector size (from the vectors file when given)")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNNs: output size, both directions together")
    attn_dim: int | None = option(None, low=1, applies=_RNN, help="RNNs: size of the attention-pooling keys "
                                  "(default: hidden-dim / 2)")
    mlp_dim: int | None = option(None, low=1, applies=_RNN, help="RNNs: a hidden layer before the output")
    dim: int = option(64, low=2, applies=_TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=_TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=_TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")
    pooling: str = option("cls", choices=("cls", "attention"), applies=_TRANSFORMER,
                          help="transformer: a [CLS]-style query, or attention pooling")
    num_layers: int = option(1, low=1, help="RNN or transformer layers")
    hops: int = option(1, low=1, help="attention-pooling queries (Lin et al. 2017 when > 1)")
    penalty: float = option(0.0, low=0, help="weight of Lin et al.'s ||AA^T - I||^2 penalty (needs hops > 1)")
    dropout: float = option(0.5, low=0, high=0.99, help="dropout")
    embed_dropout: float = option(0.5, low=0, high=0.99, help="dropout on the word vectors")
    vectors: str | None = option(None, help="pretrained word vectors (GloVe/word2vec text file)")
    freeze_vectors: bool = option(False, help="keep the pretrained vectors fixed (needs vectors)")

    def __post_init__(self):
        check_options(self)
        if (self.text_col is None) != (self.label_col is None):
            raise ValueError("give both text_col and label_col (or neither, for the movie-review format)")
        if self.text_col is None and (self.delimiter is not None or not self.header or self.labels is not None):
            raise ValueError("delimiter, header and labels are for CSV/TSV files: give text_col and label_col")
        if self.folds and not (self.folds >= 2 and self.fold < self.folds):
            raise ValueError(f"folds must be >= 2 with 0 <= fold < folds, got folds={self.folds}, fold={self.fold}")
        if self.model == "transformer" and self.pooling == "cls" and self.hops != 1:
            raise ValueError("hops needs attention pooling: add pooling='attention' for the transformer")
        if self.penalty and self.hops < 2:
            raise ValueError(f"penalty={self.penalty} needs hops > 1 (the penalty is on several attention rows)")
        if self.freeze_vectors and not self.vectors:
            raise ValueError("freeze_vectors needs vectors (a word-vector file)")
        if self.model == "transformer" and self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")
        if self.model != "transformer" and self.hidden_dim % 2:
            raise ValueError(f"hidden_dim ({self.hidden_dim}) must be even: it is split between two directions")


def train_defaults(options: SentimentOptions):
    """The trainer's settings for sentiment (the ``qkv train sentiment`` defaults: the benchmark's BiGRU)."""
    from ..train import TrainConfig

    return TrainConfig(epochs=12, batch_size=50, lr=3e-3, weight_decay=0.05, schedule="cosine", patience=3,
                       monitor="accuracy")


def load_data(options: SentimentOptions):
    """The :class:`qkv.data.text_classification.TextDataset` that ``options`` describes."""
    from ..data.text_classification import read_movie_reviews, read_table

    if not options.data:
        raise ValueError("no data file: give data (--data PATH)")
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
    from ..data.text_classification import kfold_splits, stratified_split

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


def model_spec(options: SentimentOptions, *, vocab_size: int, num_classes: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create` (JSON only: pretrained vectors are loaded apart)."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "num_classes": num_classes, "embed_dim": o.embed_dim,
                              "num_layers": o.num_layers, "hops": o.hops, "dropout": o.dropout,
                              "embed_dropout": o.embed_dropout}
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim, pooling=o.pooling)
        return {"name": "transformer-classifier", "config": config}
    config.update(hidden_dim=o.hidden_dim, attn_dim=o.attn_dim, mlp_dim=o.mlp_dim)
    return {"name": f"{o.model}-classifier", "config": config}


def build_model(options: SentimentOptions, *, vocab_size: int, num_classes: int, vocab: list[str] | None = None):
    """A new classifier; with ``options.vectors``, its embedding starts from the vectors of ``vocab``'s words."""
    from ..models import create
    from ..models.classifiers import load_word_vectors

    spec = model_spec(options, vocab_size=vocab_size, num_classes=num_classes)
    extra: dict[str, Any] = {}
    if options.vectors:
        if vocab is None:
            raise ValueError("vectors need the vocabulary (vocab=)")
        pretrained, found = load_word_vectors(options.vectors, vocab)
        logger.info("word vectors for %d of %d tokens from %s", found, len(vocab), options.vectors)
        extra = {"pretrained": pretrained, "freeze_embeddings": options.freeze_vectors}
    return create(spec["name"], **spec["config"], **extra)


class SentimentTask(Task):
    """Text classification (cross-entropy) or rating regression (MSE) with attention-pooled classifiers.

    ``dataset`` (a :class:`~qkv.data.text_classification.TextDataset`) may be given to skip reading
    ``options.data`` (e.g. once for all folds).
    """

    name = "sentiment"
    unit = "items"

    def __init__(self, options: SentimentOptions, dataset=None):
        self.options = options
        self.dataset = dataset
        self.tokenizer = None
        self.encoded: dict[str, list[tuple[list[int], Any]]] = {}

    def setup(self) -> None:
        from ..data.tokenize import WordTokenizer

        o = self.options
        if self.dataset is None:
            self.dataset = load_data(o)
        data = self.dataset
        self.splits = make_splits(data.labels, o)
        if self.tokenizer is None:
            self.tokenizer = WordTokenizer.train((data.texts[i] for i in self.splits["train"]), min_freq=o.min_freq,
                                                 max_size=o.max_vocab, lowercase=o.lowercase)
        logger.info("%s: %d examples (train %d, valid %d, test %d), %d classes, vocabulary %d",
                    o.data, len(data), *(len(self.splits[s]) for s in ("train", "valid", "test")),
                    data.num_classes, self.tokenizer.vocab_size)
        for split, idx in self.splits.items():
            ids = self.tokenizer.encode_batch(data.texts[i] for i in idx)
            self.encoded[split] = [(x[: o.max_len], data.labels[i]) for x, i in zip(ids, idx, strict=True)]

    def save_assets(self, directory: Path) -> None:
        self.tokenizer.save(directory / "tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ..data.tokenize import WordTokenizer

        self.tokenizer = WordTokenizer.load(directory / "tokenizer")

    def train_examples(self):
        return self.encoded["train"]

    def lengths(self):
        return [max(len(x), 1) for x, _ in self.encoded["train"]]

    def collate(self, examples):
        return collate_texts(examples, regression=self.dataset.regression)

    def config(self) -> dict[str, Any]:
        d = self.dataset
        return {"model": model_spec(self.options, vocab_size=self.tokenizer.vocab_size, num_classes=d.num_classes),
                "label_names": d.label_names, "regression": d.regression, "options": dataclasses.asdict(self.options)}

    def build_model(self) -> nn.Module:
        vocab = self.tokenizer.tokens_of_ids(range(self.tokenizer.vocab_size)) if self.options.vectors else None
        return build_model(self.options, vocab_size=self.tokenizer.vocab_size, num_classes=self.dataset.num_classes,
                           vocab=vocab)

    def loss(self, model, batch):
        out = model(batch["ids"], batch["mask"])
        y = batch["labels"]
        if self.dataset.regression:
            pred = out.logits[:, 0]
            loss = F.mse_loss(pred, y, reduction="sum")
            stats = {"correct": ((pred > 0) == (y > 0)).sum()}
        else:
            loss = F.cross_entropy(out.logits, y, reduction="sum")
            stats = {"correct": (out.logits.argmax(-1) == y).sum()}
        if self.options.penalty:
            from ..layers.pooling import AttentionPooling

            pen = AttentionPooling.penalty(out.weights).sum()
            loss = loss + self.options.penalty * pen
            stats["penalty"] = pen.detach()
        return loss, len(y), stats

    def evaluate(self, model, split: str) -> dict[str, float]:
        from ..metrics import classification_metrics, regression_metrics

        if split not in self.encoded:
            raise ValueError(f"no split {split!r}; one of {', '.join(self.encoded)}")
        examples = self.encoded[split]
        if not examples:
            return {}
        device = next(model.parameters()).device
        preds, ys = [], []
        order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
        for s in range(0, len(order), 256):
            batch = self.to_device(self.collate([examples[i] for i in order[s:s + 256]]), device)
            preds.append(model(batch["ids"], batch["mask"]).logits.float().cpu())
            ys.append(batch["labels"].cpu())
        logits, labels = torch.cat(preds), torch.cat(ys)
        if self.dataset.regression:
            return regression_metrics(logits[:, 0], labels)
        return classification_metrics(logits, labels)


def train_folds(options: SentimentOptions, config, dataset=None) -> dict[str, Any]:
    """Train one split, or every fold when ``options.folds`` (each into ``config.out/fold-K``).

    Returns ``{"runs": [TrainResult...], "test_accuracy": [...], "mean": m, "std": s}`` (one run without folds).
    """
    from ..train import train

    if dataset is None:
        dataset = load_data(options)
    folds = range(options.folds) if options.folds else [None]
    runs, accs = [], []
    for f in folds:
        o, cfg = options, config
        if f is not None:
            o = dataclasses.replace(options, fold=f)
            cfg = config.replace(out=str(Path(config.out) / f"fold-{f}") if config.out else None)
            logger.info("fold %d of %d", f + 1, options.folds)
        result = train(SentimentTask(o, dataset), cfg)
        runs.append(result)
        accs.append(result.metrics.get("test", {}).get("accuracy", math.nan))
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else 0.0
    return {"runs": runs, "test_accuracy": accs, "mean": mean, "std": std}


# ------------------------------------------------------------------------------------------- inference

@dataclass
class Prediction:
    """One classified text: ``label`` and its ``probability`` (or the predicted ``value`` for regression), the
    display ``tokens`` and one attention weight per token (averaged over hops)."""

    text: str
    label: str
    probability: float
    probabilities: dict[str, float]
    tokens: list[str]
    weights: list[float]
    value: float | None = None

    @property
    def caption(self) -> str:
        if self.value is not None:
            return f"{self.label} {self.value:+.3f}"
        return f"{self.label} {self.probability:.3f}"


def _upgrade_v1(config: dict[str, Any], state_dict: dict) -> tuple[dict, dict]:
    """A qkv 0.1.0 sentiment run in the current format (RNN ``hidden_dim`` was per direction then)."""
    from ..models.legacy import upgrade_state_dict

    old = dict(config["options"])
    kind = config["model"]
    arch = dict(config["arch"])
    renames = {"layers": "num_layers", "heads": "num_heads"}
    if kind == "transformer":
        renames["hidden_dim"] = "dim"
    else:
        old["hidden_dim"] = 2 * old["hidden_dim"]
        arch["hidden_dim"] = 2 * arch["hidden_dim"]
        arch["attn_dim"] = arch.get("attn_dim") or config["arch"]["hidden_dim"]
    old["header"] = not old.pop("no_header", False)
    options = upgrade_options(SentimentOptions, old, renames)
    name = "transformer-classifier" if kind == "transformer" else f"{kind}-classifier"
    spec = {"name": name, "config": {"vocab_size": config["vocab_size"], "num_classes": config["num_classes"], **arch}}
    return ({"model": spec, "label_names": config["label_names"], "regression": config["regression"],
             "options": dataclasses.asdict(options)}, upgrade_state_dict(name, state_dict))


class SentimentClassifier:
    """A trained sentiment run: ``SentimentClassifier.load(run_dir).predict(["text", ...])``."""

    task = SentimentTask.name

    def __init__(self, model: nn.Module, tokenizer, config: dict[str, Any], options: SentimentOptions,
                 device: torch.device | str = "cpu"):
        from ..data.tokenize import WordTokenizer

        self.model, self.tokenizer, self.config, self.options = model.eval(), tokenizer, config, options
        self.device = torch.device(device)
        self.label_names = config.get("label_names") or []
        self.regression = bool(config.get("regression"))
        self.max_len = options.max_len
        self._display = WordTokenizer([], lowercase=False) if isinstance(tokenizer, WordTokenizer) else None

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> SentimentClassifier:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory, of any release."""
        from ..data.tokenize import load_tokenizer

        run = load_run(run_dir, cls.task, _upgrade_v1, SentimentOptions, device)
        return cls(run.model, load_tokenizer(run.checkpoint.assets / "tokenizer"), run.config, run.options,
                   next(run.model.parameters()).device)

    def display_tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` as written (original case when the tokeniser lower-cases), truncated."""
        tokens = self.tokenizer.tokens(text)
        if self._display is not None:
            shown = self._display.split(text)
            if len(shown) == len(tokens):
                tokens = shown
        return tokens[: self.max_len]

    @torch.no_grad()
    def predict(self, texts: list[str], *, batch_size: int = 128) -> list[Prediction]:
        """Label (or value), probabilities, tokens and attention weights of every text; empty texts are errors."""
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to classify")
        out: list[Prediction] = []
        for s in range(0, len(texts), batch_size):
            chunk = texts[s:s + batch_size]
            ids = [x[: self.max_len] for x in self.tokenizer.encode_batch(chunk)]
            batch = collate_texts([(x, 0) for x in ids])
            res = self.model(batch["ids"].to(self.device), batch["mask"].to(self.device))
            logits, weights = res.logits.float().cpu(), res.weights.float().cpu()
            if weights.dim() == 3:
                weights = weights.mean(1)
            for i, text in enumerate(chunk):
                n = len(ids[i])
                w = weights[i, :n].tolist()
                tokens = self.display_tokens(text)
                if len(tokens) != n:  # should not happen; fall back to the tokeniser's own tokens
                    tokens = self.tokenizer.tokens_of_ids(ids[i])
                if self.regression:
                    v = float(logits[i, 0])
                    label = "positive" if v > 0 else "negative" if v < 0 else "neutral"
                    out.append(Prediction(text, label, math.nan, {}, tokens, w, value=v))
                    continue
                probs = logits[i].softmax(-1)
                k = int(probs.argmax())
                out.append(Prediction(text, self.label_names[k], float(probs[k]),
                                      {name: float(p) for name, p in zip(self.label_names, probs, strict=True)},
                                      tokens, w))
        return out
