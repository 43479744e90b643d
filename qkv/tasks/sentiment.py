"""Sentiment analysis with attention: data + word tokeniser + an attention classifier + the shared trainer, and
the commands ``qkv train sentiment`` and ``qkv classify``.

The default data format is the movie-review snippets (``id<TAB>rating<TAB>text``, binary by the rating's sign,
or the rating itself with ``--regression``); ``--text-col``/``--label-col`` read any CSV/TSV file instead. The
model's pooled attention weights are its visible output: ``qkv classify`` shades every word by its weight, in
the terminal or in an HTML page.

Example::

    qkv train sentiment --data movie-review-snippets.tsv.gz --model bigru --out runs/mr
    qkv classify runs/mr "a gorgeous, witty, seductive movie." --html mr.html
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..train.task import Task
from .common import print_result

logger = logging.getLogger(__name__)

MODELS = ("bigru", "bilstm", "transformer")


@dataclass
class SentimentOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    data: str = ""  # the data file (.gz allowed): movie-review format, or a CSV/TSV with text_col/label_col
    text_col: str | None = None  # CSV/TSV: the text column (name or 0-based index); None = movie-review format
    label_col: str | None = None  # CSV/TSV: the label column
    delimiter: str | None = None  # CSV/TSV: default tab for .tsv, comma otherwise
    no_header: bool = False  # CSV/TSV: the first row is data, columns are indices
    labels: str | None = None  # CSV/TSV: comma-separated known labels (others are errors); default: all seen
    on_error: str = "raise"  # bad rows (empty text, unknown label): "raise" or "skip" (and count)
    regression: bool = False  # predict the number in the label column (one output, MSE) instead of classes
    # splits
    valid: float = 0.1  # fraction of the data for validation (early stopping)
    test: float = 0.1  # fraction held out for the final test (ignored with folds)
    folds: int = 0  # k-fold cross-validation: k runs, each testing on one fold; 0 = one split
    fold: int = 0  # which fold this task trains (set by the k-fold loop)
    data_seed: int = 0  # seed of the splits (independent of the training seed)
    # tokens
    min_freq: int = 1  # words seen fewer times in the training split become <unk>
    max_vocab: int | None = 30000  # vocabulary cap (most frequent first, special tokens included)
    max_len: int = 100  # tokens kept per text
    lowercase: bool = True
    # model
    model: str = "bigru"  # bigru | bilstm | transformer
    embed_dim: int = 128  # word vector size (taken from the vectors file when given)
    hidden_dim: int = 64  # RNN size per direction / Transformer width
    layers: int = 1  # RNN or Transformer layers
    heads: int = 4  # Transformer heads
    pooling: str = "cls"  # Transformer: "cls" query or "attention" pooling (RNNs always use attention pooling)
    hops: int = 1  # attention-pooling queries (Lin et al. 2017 when > 1)
    penalty: float = 0.0  # weight of Lin et al.'s ||AA^T - I||^2 penalty (hops > 1)
    attn_dim: int | None = None  # size of the attention-pooling keys (default hidden_dim)
    mlp_dim: int | None = None  # hidden layer before the RNN classifier's output
    dropout: float = 0.5
    embed_dropout: float = 0.5
    vectors: str | None = None  # pretrained word vectors, GloVe/word2vec text format
    freeze_vectors: bool = False

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if (self.text_col is None) != (self.label_col is None):
            raise ValueError("give both --text-col and --label-col (or neither, for the movie-review format)")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.folds and not (self.folds >= 2 and 0 <= self.fold < self.folds):
            raise ValueError(f"folds must be >= 2 with 0 <= fold < folds, got folds={self.folds}, fold={self.fold}")
        if self.hops < 1:
            raise ValueError(f"hops must be >= 1, got {self.hops}")
        if self.penalty < 0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}")
        if self.model == "transformer" and self.pooling == "cls" and self.hops != 1:
            raise ValueError("--hops needs attention pooling: add --pooling attention for the transformer")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")

    def arch(self, vocab_size: int, num_classes: int) -> dict[str, Any]:
        """Keyword arguments of :func:`qkv.models.classifiers.create_classifier` (JSON, no pretrained tensor)."""
        if self.model == "transformer":
            return {"dim": self.hidden_dim, "num_heads": self.heads, "num_layers": self.layers,
                    "dropout": self.dropout, "embed_dim": self.embed_dim, "pooling": self.pooling,
                    "hops": self.hops, "embed_dropout": self.embed_dropout}
        return {"embed_dim": self.embed_dim, "hidden_dim": self.hidden_dim, "num_layers": self.layers,
                "hops": self.hops, "attn_dim": self.attn_dim, "mlp_dim": self.mlp_dim, "dropout": self.dropout,
                "embed_dropout": self.embed_dropout}


def build_model(config: dict[str, Any]) -> nn.Module:
    """Rebuild a classifier from a checkpoint's ``config`` (``{"model", "vocab_size", "num_classes", "arch"}``)."""
    from ..models.classifiers import create_classifier

    return create_classifier(config["model"], config["vocab_size"], config["num_classes"], **config["arch"])


def load_data(opts: SentimentOptions):
    """The :class:`qkv.data.text_classification.TextDataset` that ``opts`` describes."""
    from ..data.text_classification import read_movie_reviews, read_table

    if not opts.data:
        raise ValueError("no data file: give --data PATH")
    if opts.text_col is None:
        return read_movie_reviews(opts.data, regression=opts.regression, on_error=opts.on_error)
    labels = [s.strip() for s in opts.labels.split(",")] if opts.labels else None
    return read_table(opts.data, text_col=opts.text_col, label_col=opts.label_col, delimiter=opts.delimiter,
                      header=not opts.no_header, labels=labels, regression=opts.regression, on_error=opts.on_error)


def make_splits(labels, opts: SentimentOptions) -> dict[str, list[int]]:
    """``{"train", "valid", "test"}`` indices: a stratified split, or fold ``opts.fold`` of ``opts.folds``
    (its test part; validation is carved, stratified, from the other folds)."""
    from ..data.text_classification import kfold_splits, stratified_split

    if not opts.folds:
        train, valid, test = stratified_split(labels, valid=opts.valid, test=opts.test, seed=opts.data_seed)
        return {"train": train, "valid": valid, "test": test}
    rest, test = kfold_splits(labels, opts.folds, seed=opts.data_seed)[opts.fold]
    tr, va, _ = stratified_split([labels[i] for i in rest], valid=opts.valid, test=0.0, seed=opts.data_seed)
    return {"train": [rest[i] for i in tr], "valid": [rest[i] for i in va], "test": test}


class SentimentTask(Task):
    """Text classification (cross-entropy) or rating regression (MSE) with attention-pooled classifiers.

    ``dataset`` (a :class:`~qkv.data.text_classification.TextDataset`) may be given to skip reading
    ``opts.data`` (e.g. once for all folds).
    """

    name = "sentiment"
    unit = "items"

    def __init__(self, opts: SentimentOptions, dataset=None):
        self.opts = opts
        self.dataset = dataset
        self.tokenizer = None
        self.encoded: dict[str, list[tuple[list[int], Any]]] = {}

    # -- data -----------------------------------------------------------------------------------------
    def setup(self) -> None:
        from ..data.tokenize import WordTokenizer

        o = self.opts
        if self.dataset is None:
            self.dataset = load_data(o)
        data = self.dataset
        self.splits = make_splits(data.labels, o)
        if not self.splits["train"]:
            raise ValueError(f"{o.data}: no training examples after the split")
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

    # -- model ----------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        d = self.dataset
        return {"model": self.opts.model, "vocab_size": self.tokenizer.vocab_size, "num_classes": d.num_classes,
                "arch": self.opts.arch(self.tokenizer.vocab_size, d.num_classes), "label_names": d.label_names,
                "regression": d.regression, "max_len": self.opts.max_len, "options": dataclasses.asdict(self.opts)}

    def build_model(self) -> nn.Module:
        from ..models.classifiers import load_word_vectors

        config = self.config()
        pretrained = None
        if self.opts.vectors:
            vocab = self.tokenizer.tokens_of_ids(range(self.tokenizer.vocab_size))
            pretrained, found = load_word_vectors(self.opts.vectors, vocab)
            logger.info("word vectors for %d of %d tokens from %s", found, len(vocab), self.opts.vectors)
            config["arch"] = {**config["arch"], "pretrained": pretrained,
                              "freeze_embeddings": self.opts.freeze_vectors}
        return build_model(config)

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
        if self.opts.penalty and out.weights.dim() == 3:
            from ..layers.pooling import AttentionPooling

            pen = AttentionPooling.penalty(out.weights).sum()
            loss = loss + self.opts.penalty * pen
            stats["penalty"] = pen.detach()
        return loss, len(y), stats

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in self.encoded:
            raise ValueError(f"no split {split!r}; one of {', '.join(self.encoded)}")
        examples = self.encoded[split]
        if not examples:
            return {}
        device = next(model.parameters()).device
        preds, ys = [], []
        for chunk in _length_sorted_chunks(examples, 256):
            batch = self.to_device(self.collate(chunk), device)
            preds.append(model(batch["ids"], batch["mask"]).logits.float().cpu())
            ys.append(batch["labels"].cpu())
        return classification_metrics(torch.cat(preds), torch.cat(ys), regression=self.dataset.regression)


def collate_texts(examples, *, regression: bool = False) -> dict[str, torch.Tensor]:
    """``[(ids, label), ...]`` -> ``{"ids" (B, T), "mask" (B, T) True at tokens, "labels" (B,)}``."""
    from ..data.batching import pad_sequences

    ids, _, mask = pad_sequences([x for x, _ in examples], min_len=1)
    labels = torch.tensor([y for _, y in examples], dtype=torch.float32 if regression else torch.long)
    return {"ids": ids, "mask": mask, "labels": labels}


def _length_sorted_chunks(examples, size):
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    for s in range(0, len(order), size):
        yield [examples[i] for i in order[s:s + size]]


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor, *, regression: bool = False) -> dict[str, float]:
    """Accuracy and loss (classification), or MSE, MAE, Pearson r and sign accuracy (regression).

    For regression, ``accuracy`` is the agreement of signs over the examples whose label is not 0, so that
    early stopping on ``accuracy`` means the same thing for both.
    """
    if regression:
        pred = logits[:, 0].double()
        y = labels.double()
        nonzero = y != 0
        r = torch.corrcoef(torch.stack([pred, y]))[0, 1] if len(y) > 1 else torch.tensor(float("nan"))
        return {"mse": float(((pred - y) ** 2).mean()), "mae": float((pred - y).abs().mean()), "pearson": float(r),
                "accuracy": float(((pred[nonzero] > 0) == (y[nonzero] > 0)).double().mean()) if nonzero.any()
                else float("nan")}
    return {"accuracy": float((logits.argmax(-1) == labels).double().mean()),
            "loss": float(F.cross_entropy(logits, labels))}


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


class SentimentClassifier:
    """A trained checkpoint ready to classify text: ``SentimentClassifier.load(path).predict(["text", ...])``."""

    def __init__(self, model: nn.Module, tokenizer, config: dict[str, Any], device: torch.device | str = "cpu"):
        self.model, self.tokenizer, self.config = model.eval(), tokenizer, config
        self.device = torch.device(device)
        self.label_names = config.get("label_names") or []
        self.regression = bool(config.get("regression"))
        self.max_len = int(config.get("max_len", 100))
        from ..data.tokenize import WordTokenizer

        self._display = WordTokenizer([], lowercase=False) if isinstance(tokenizer, WordTokenizer) else None

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, device: str = "cpu") -> SentimentClassifier:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory."""
        from ..data.tokenize import load_tokenizer
        from ..train import load_model, resolve_device

        dev = resolve_device(device)
        model, ckpt = load_model(checkpoint, build_model, device=dev, task=SentimentTask.name)
        return cls(model, load_tokenizer(ckpt.assets / "tokenizer"), ckpt.config, dev)

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
                    out.append(Prediction(text, label, float("nan"), {}, tokens, w, value=v))
                    continue
                probs = logits[i].softmax(-1)
                k = int(probs.argmax())
                out.append(Prediction(text, self.label_names[k], float(probs[k]),
                                      {name: float(p) for name, p in zip(self.label_names, probs, strict=True)},
                                      tokens, w))
        return out


# ----------------------------------------------------------------------------------------------- commands

def _train_defaults():
    from ..train import TrainConfig

    # the benchmark's BiGRU settings (benchmarks/sentiment.py)
    return TrainConfig(epochs=12, batch_size=50, lr=3e-3, weight_decay=0.05, schedule="cosine", patience=3,
                       monitor="accuracy")


def _options_from_args(args) -> SentimentOptions:
    names = {f.name for f in dataclasses.fields(SentimentOptions)}
    return SentimentOptions(**{k: v for k, v in vars(args).items() if k in names and v is not None})


def train_sentiment(opts: SentimentOptions, config, dataset=None) -> dict[str, Any]:
    """Train one split, or every fold when ``opts.folds`` (each into ``config.out/fold-K``).

    Returns ``{"runs": [TrainResult...], "test_accuracy": [...], "mean": m, "std": s}`` (one run without folds).
    """
    from ..train import train

    if dataset is None:
        dataset = load_data(opts)
    folds = range(opts.folds) if opts.folds else [None]
    runs, accs = [], []
    for f in folds:
        o, cfg = opts, config
        if f is not None:
            o = dataclasses.replace(opts, fold=f)
            cfg = config.replace(out=str(Path(config.out) / f"fold-{f}") if config.out else None)
            logger.info("fold %d of %d", f + 1, opts.folds)
        result = train(SentimentTask(o, dataset), cfg)
        runs.append(result)
        accs.append(result.metrics.get("test", {}).get("accuracy", float("nan")))
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / max(len(accs) - 1, 1)) if len(accs) > 1 else 0.0
    return {"runs": runs, "test_accuracy": accs, "mean": mean, "std": std}


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import config_from_args

    opts = _options_from_args(args)
    cfg = config_from_args(args, _train_defaults(), monitor="accuracy", extra={"command": " ".join(sys.argv)})
    summary = train_sentiment(opts, cfg)
    for k, result in enumerate(summary["runs"]):
        print_result(result, head=f"fold {k + 1}: " if opts.folds else "")
    if opts.folds:
        print(f"{opts.folds}-fold test accuracy: {summary['mean']:.4f} +- {summary['std']:.4f}")
        if cfg.out:
            path = Path(cfg.out) / "kfold.json"
            path.write_text(json.dumps({k: summary[k] for k in ("test_accuracy", "mean", "std")}, indent=1) + "\n",
                            encoding="utf-8")
            print(f"wrote {path}")
    if cfg.out and opts.folds:
        print(f"run directory: {cfg.out}")
    return 0


def _use_color(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never":
        return False
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


def cmd_classify(args: argparse.Namespace) -> int:
    from ..viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    texts = list(args.text)
    if args.file:
        texts += [line.strip() for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError("give texts to classify, or --file")
    clf = SentimentClassifier.load(args.checkpoint, args.device)
    preds = clf.predict(texts)
    color = _use_color(args.color)
    for p in preds:
        line = f"{p.caption}\t{highlight_ansi(p.tokens, p.weights, color=color)}"
        if not color and args.top:
            line += "\t[" + ", ".join(f"{t} {w:.2f}" for t, w in top_tokens(p.tokens, p.weights, args.top)) + "]"
        print(line)
    if args.html:
        items = [HighlightedText(p.tokens, p.weights, caption=p.caption,
                                 details=[(k, f"{v:.3f}") for k, v in p.probabilities.items()]) for p in preds]
        path = save_html(args.html, items, title=args.title)
        print(f"wrote {path}")
    return 0


def register_cli(commands, train_commands) -> None:
    from ..train import add_arguments

    d = SentimentOptions()
    p = train_commands.add_parser("sentiment", help="train a text classifier with attention (sentiment by default)",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", required=True, help="movie-review file (id<TAB>rating<TAB>text) or a CSV/TSV file")
    g.add_argument("--text-col", default=None, help="CSV/TSV text column (name or 0-based index)")
    g.add_argument("--label-col", default=None, help="CSV/TSV label column (name or 0-based index)")
    g.add_argument("--delimiter", default=None, help="CSV/TSV delimiter (default: tab for .tsv, else comma)")
    g.add_argument("--no-header", action="store_true", help="CSV/TSV without a header row")
    g.add_argument("--labels", default=None, help="comma-separated known labels (others are bad rows)")
    g.add_argument("--on-error", default=d.on_error, choices=["raise", "skip"], help="bad rows: stop, or skip")
    g.add_argument("--regression", action="store_true", help="predict the rating/number (MSE) instead of classes")
    g.add_argument("--valid", type=float, default=d.valid, help="validation fraction")
    g.add_argument("--test", type=float, default=d.test, help="test fraction (without --folds)")
    g.add_argument("--folds", type=int, default=d.folds, help="k-fold cross-validation (0 = one split)")
    g.add_argument("--data-seed", type=int, default=d.data_seed, help="seed of the splits")
    g.add_argument("--min-freq", type=int, default=d.min_freq, help="min count of a vocabulary word")
    g.add_argument("--max-vocab", type=int, default=d.max_vocab, help="vocabulary cap")
    g.add_argument("--max-len", type=int, default=d.max_len, help="tokens kept per text")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=d.model, choices=MODELS)
    g.add_argument("--embed-dim", type=int, default=d.embed_dim)
    g.add_argument("--hidden-dim", type=int, default=d.hidden_dim, help="RNN size per direction / Transformer width")
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--heads", type=int, default=d.heads, help="Transformer heads")
    g.add_argument("--pooling", default=d.pooling, choices=["cls", "attention"], help="Transformer pooling")
    g.add_argument("--hops", type=int, default=d.hops, help="attention-pooling queries (Lin et al. 2017 when > 1)")
    g.add_argument("--penalty", type=float, default=d.penalty, help="weight of the ||AA^T - I||^2 penalty")
    g.add_argument("--attn-dim", type=int, default=None, help="attention-pooling key size (default hidden-dim)")
    g.add_argument("--mlp-dim", type=int, default=None, help="hidden layer before the RNN classifier's output")
    g.add_argument("--dropout", type=float, default=d.dropout)
    g.add_argument("--embed-dropout", type=float, default=d.embed_dropout)
    g.add_argument("--vectors", default=None, help="pretrained word vectors (GloVe/word2vec text file)")
    g.add_argument("--freeze-vectors", action="store_true", help="keep the pretrained vectors fixed")
    add_arguments(p, _train_defaults())
    p.set_defaults(func=cmd_train)

    p = commands.add_parser("classify", help="classify text with a trained sentiment checkpoint, showing attention")
    p.add_argument("checkpoint", help="run directory or checkpoint directory")
    p.add_argument("text", nargs="*", help="texts to classify")
    p.add_argument("--file", help="a file of texts, one per line")
    p.add_argument("--html", metavar="HTML", help="write a page with every text's words shaded by attention")
    p.add_argument("--title", default="Attention over words", help="title of the HTML page")
    p.add_argument("--color", default="auto", choices=["auto", "always", "never"],
                   help="ANSI colours (auto: when stdout is a terminal)")
    p.add_argument("--top", type=int, default=3, help="without colours, list this many most attended words")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    p.set_defaults(func=cmd_classify)


__all__ = ["SentimentOptions", "SentimentTask", "SentimentClassifier", "Prediction", "build_model", "load_data",
           "make_splits", "collate_texts", "classification_metrics", "train_sentiment", "register_cli"]
