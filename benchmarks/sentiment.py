"""Sentiment accuracy on the movie-review snippets: attention classifiers vs a bag-of-words floor.

    python benchmarks/sentiment.py                        # held-out split: BoW LR, BiGRU + attention, Transformer
    python benchmarks/sentiment.py --folds 10 --minutes 1 # 10-fold cross-validation (each fold its own budget)
    python benchmarks/sentiment.py --quick                # a few steps, a smoke test
    python benchmarks/sentiment.py --folds 10 --models lm --init runs/lm   # from a pretrained language model
    python benchmarks/sentiment.py --folds 10 --minutes 2 --models nbsvm   # the BiGRU with the NBSVM path (--nbsvm)

Data: ``../shared/data/movie-review-snippets.tsv.gz`` (10,605 sentences with a mean human rating; binary by
sign, zeros dropped). Split: stratified 80/10/10 from ``--data-seed`` (or stratified k folds, validation carved
from the training folds). The neural models train with the project's trainer within ``--minutes`` each, early
stopping on validation accuracy, no pretrained vectors; the floor is scikit-learn's logistic regression on
TF-IDF unigrams + bigrams fitted on the same training part. Reference: Kim (2014) reports 76.1% (CNN, random
embeddings) and 81.5% (CNN, word2vec) 10-fold accuracy on Pang & Lee's MR sentences, whose labels are the
reviews' own polarity rather than these human ratings.

``--ensemble N`` trains N models per fold (seeds ``--seed`` to ``--seed + N - 1``, each its own ``--minutes``) and
scores the mean of their class probabilities on the fold's test sentences: the time per fold is then N runs.

``--models lm --init RUN`` fine-tunes a language model trained with ``qkv train lm`` (its tokenizer and body; the
trainer's ``--model lm`` defaults: discriminative rates, gradual unfreezing); the language model's own training time
is not counted here: state it beside the figure. ``--init RUN1,RUN2`` fine-tunes one model from each run per fold
(``--ensemble`` seeds each) and scores their mean probabilities: a forward and a backward (``qkv train lm --reverse``)
language model averaged, as ULMFiT does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import record_flag  # noqa: E402

from qkv.apps.sentiment import SentimentOptions, SentimentTask, make_splits, train_defaults  # noqa: E402
from qkv.data.text_classification import read_movie_reviews  # noqa: E402
from qkv.train import TrainConfig, train  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "movie-review-snippets.tsv.gz"

# model presets: SentimentOptions fields and TrainConfig fields (an RNN's hidden_dim is both directions together)
PRESETS = {
    "bigru": ({"model": "bigru", "embed_dim": 128, "hidden_dim": 128, "dropout": 0.5, "embed_dropout": 0.5},
              {"lr": 3e-3, "batch_size": 50, "weight_decay": 0.05}),
    "bigru-3hops": ({"model": "bigru", "embed_dim": 128, "hidden_dim": 128, "hops": 3, "penalty": 0.1,
                     "dropout": 0.5, "embed_dropout": 0.5}, {"lr": 3e-3, "batch_size": 50, "weight_decay": 0.05}),
    "bigram": ({"model": "bigram"}, {}),  # the bigram model's option defaults, the trainer's sentiment defaults
    "bigru-bigrams": ({"model": "bigru", "buckets": 30_000}, {}),
    "nbsvm": ({"nbsvm": True}, {}),  # the default BiGRU with the NBSVM path (`--nbsvm`), the trainer's defaults
    "defaults": ({}, {}),  # exactly `qkv train sentiment --max-minutes M` (options and trainer defaults)
    "lm": ({"model": "lm"}, {}),  # needs --init: a language-model run's body, the trainer's `--model lm` defaults
    "transformer": ({"model": "transformer", "embed_dim": 64, "dim": 64, "num_layers": 2, "num_heads": 4,
                     "dropout": 0.3, "embed_dropout": 0.5}, {"lr": 2e-3, "batch_size": 50, "weight_decay": 0.1,
                                                             "warmup_steps": 100}),
}


def bow_floor(data, splits) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    clf = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), LogisticRegression(C=4, max_iter=2000))
    train = splits["train"] + splits["valid"]  # no early stopping: it may use the validation part too
    clf.fit([data.texts[i] for i in train], [data.labels[i] for i in train])
    test = splits["test"]
    return float(clf.score([data.texts[i] for i in test], [data.labels[i] for i in test]))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--models", default="bigru,transformer", help=f"comma-separated, from {', '.join(PRESETS)}")
    ap.add_argument("--minutes", type=float, default=5.0, help="training budget per model (per fold)")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--folds", type=int, default=0, help="k-fold cross-validation (0 = one held-out split)")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", default=None, help="keep the runs here (default: nothing written)")
    ap.add_argument("--only-folds", default=None, help="comma-separated folds to run (of --folds), e.g. 0,1,2")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override an option of every model (a SentimentOptions or TrainConfig field; repeatable)")
    ap.add_argument("--init", default=None, help="the language-model run of --models lm (qkv train lm); several, "
                    "comma-separated: one model from each per fold, their probabilities averaged")
    ap.add_argument("--scratch", action="store_true", help="--models lm: the same model and tokenizer from a random "
                    "start (the language model's weights left out), to see what pretraining gives")
    ap.add_argument("--ensemble", type=int, default=1, help="models per fold (seeds --seed, --seed + 1, ...), "
                    "scored by their mean class probabilities")
    ap.add_argument("--quick", action="store_true", help="30 steps per model: a smoke test, not a result")
    record_flag(ap, "sentiment")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_at_start = " ".join(f"{v:.2f}" for v in os.getloadavg())
    data = read_movie_reviews(args.data)
    folds = range(args.folds) if args.folds else [0]
    if args.only_folds:
        folds = [int(f) for f in args.only_folds.split(",")]
        if not args.folds or not all(0 <= f < args.folds for f in folds):
            ap.error(f"--only-folds {args.only_folds}: folds of --folds {args.folds} (0 to {args.folds - 1})")
    opt_set, cfg_set = _overrides(ap, args.set)
    floor = []
    for f in folds:
        opts = SentimentOptions(data=args.data, folds=args.folds, fold=f, data_seed=args.data_seed)
        floor.append(bow_floor(data, make_splits(data.labels, opts)))
    rows = [("bag-of-words logistic regression (TF-IDF 1-2 grams, scikit-learn)", floor, None, None, "-")]
    for name in args.models.split(","):
        if name not in PRESETS:
            ap.error(f"--models: unknown model {name!r}; one of {', '.join(PRESETS)}")
        model_kw, train_kw = PRESETS[name]
        if name == "lm":
            if not args.init:
                ap.error("--models lm needs --init RUN (a qkv train lm run)")
            inits = args.init.split(",")
            model_kw = {**model_kw, "init": inits[0]}
        opts = SentimentOptions(data=args.data, folds=args.folds, data_seed=args.data_seed, **{**model_kw, **opt_set})
        common = {"max_minutes": args.minutes, "seed": args.seed, "progress": False, "device": "cpu",
                  "out": str(Path(args.out) / name) if args.out else None, "max_steps": 30 if args.quick else None}
        if name in ("defaults", "nbsvm", "bigram", "bigru-bigrams", "lm"):  # the trainer defaults, as in the CLI
            cfg = train_defaults(opts).replace(**common, **cfg_set)
        else:
            cfg = TrainConfig(**{"epochs": args.epochs, "monitor": "accuracy", "patience": 3, "schedule": "cosine",
                                 **common, **train_kw, **cfg_set})
        t0 = time.monotonic()
        runs, accs, single = [], [], []
        for f in folds:
            o = dataclasses.replace(opts, fold=f)
            c = cfg.replace(out=str(Path(cfg.out) / f"fold-{f}")) if cfg.out and args.folds else cfg
            members = []
            for i, init in enumerate(inits if name == "lm" else [None]):
                oi = o if init is None else dataclasses.replace(o, init=init)
                for m in range(args.ensemble):
                    task = (ScratchTask if args.scratch and name == "lm" else SentimentTask)(oi, data)
                    tag = f"-init{i}" * (i > 0) + f"-seed{args.seed + m}" * (m > 0)
                    cm = c.replace(seed=args.seed + m, out=f"{c.out}{tag}" if c.out and tag else c.out)
                    members.append((task, train(task, cm)))
            runs.append(members[0][1])
            single.append(runs[-1].metrics.get("test", {}).get("accuracy", float("nan")))
            accs.append(runs[-1].metrics.get("test", {}).get("accuracy", float("nan")) if len(members) == 1 else
                        ensemble_accuracy(members))
        seconds = (time.monotonic() - t0) / len(folds)
        valid = [r.metrics.get("valid", {}).get("accuracy", float("nan")) for r in runs]
        epochs = statistics.mean(r.state.epoch + (r.state.step > 0) for r in runs)
        params = sum(p.numel() for p in runs[0].model.parameters())
        many = len(inits) if name == "lm" else 1
        per = f"{args.ensemble} seeds" if args.ensemble > 1 else "one model"
        label = name + (" from a random start" if args.scratch and name == "lm" else "") + \
            (f" [{' '.join(args.set)}]" if args.set else "") + \
            (f", {per} from each of {', '.join(Path(i).name for i in inits)}, mean probabilities" if many > 1 else
             f", {per}' mean probabilities" if args.ensemble > 1 else "")
        rows.append((f"{label} ({params / 1e6:.2f} M parameters)", accs, valid, seconds, f"{epochs:.1f}"))
        if args.ensemble * many > 1:  # the first member alone, from the same runs
            first = f"from {Path(inits[0]).name}, seed {args.seed}" if many > 1 else f"seed {args.seed}"
            rows.append((f"{name}, {first} alone", single, valid, seconds / (args.ensemble * many),
                         f"{epochs:.1f}"))
    what = f"{args.folds}-fold cross-validation, mean +- std" if args.folds else "held-out test split (10%)"
    if args.only_folds:
        what += f" (folds {args.only_folds} only)"
    print(f"### Sentiment: movie-review snippets, binary ({len(data)} sentences), {what}\n")
    print(f"Machine: {machine()}; load average at the start {load_at_start}.  ")
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    print("| model | test accuracy | valid accuracy | train time per run | epochs |\n|---|---|---|---|---|")
    for name, test, valid, seconds, epochs in rows:
        print(f"| {name} | {_fmt(test)} | {_fmt(valid) if valid else '-'} | "
              f"{f'{seconds:.0f} s' if seconds is not None else '-'} | {epochs} |")
    if len(folds) > 1:
        print(f"\nTest accuracy per fold ({', '.join(map(str, folds))}):  ")
        for name, test, *_ in rows:
            print(f"{name}: {' '.join(f'{100 * a:.2f}' for a in test)}  ")
    print("\nReference (Pang & Lee MR, 10-fold, Kim 2014): CNN-rand 76.1%, CNN-static (word2vec) 81.5%.")
    if args.record and not args.quick:
        record_results(args, rows, what)
    return 0


def record_results(args, rows, what: str) -> None:
    """The models' test accuracy against the bag-of-words floor of the same folds, into sentiment.json."""
    from record import measurement, record

    def figure(values):
        return _fmt(values).replace("+-", "±")

    floor = 100 * statistics.mean(rows[0][1])
    items = [measurement("bow", f"bag-of-words logistic regression, {what}", floor, "accuracy",
                         figure=figure(rows[0][1]))]
    for name, test, _, _seconds, epochs in rows[1:]:
        key = "-".join(part for part in (args.models if len(rows) == 2 else name.split(" (")[0],
                                         f"folds-{args.only_folds}" if args.only_folds else "") if part)
        key = "".join(c if c.isalnum() else "-" for c in key.lower()).strip("-")
        items.append(measurement(key, f"{name}, {args.minutes:g} minutes a run, {epochs} epochs, {what}",
                                 100 * statistics.mean(test), "accuracy", figure=figure(test),
                                 target=f">= {floor:.1f}%"))
    record("sentiment", items)


@torch.no_grad()
def ensemble_accuracy(members) -> float:
    """Test accuracy of the mean class probabilities of ``members``, ``(task, TrainResult)`` pairs of one fold (the
    same test sentences in the same order)."""
    from qkv.data.text_classification import collate_texts

    labels = [y for _, y in members[0][0].encoded["test"]]
    probs = []
    for task, run in members:  # each with its own tokenizer's ids (members from different language models)
        assert [y for _, y in task.encoded["test"]] == labels
        batch = collate_texts(task.encoded["test"])
        run.model.eval()
        probs.append(torch.softmax(run.model(batch["ids"], batch["mask"]).logits.float(), -1))
    return float((torch.stack(probs).mean(0).argmax(-1) == torch.tensor(labels)).float().mean())


class ScratchTask(SentimentTask):
    """``--scratch``: model lm with the language model's architecture and tokenizer, its weights left out."""

    def build_model(self):
        self._lm_weights = None
        return super().build_model()


def _overrides(ap, pairs) -> tuple[dict, dict]:
    """``--set KEY=VALUE`` pairs split into SentimentOptions and TrainConfig fields (values read as JSON, else text)."""
    opt_fields = {f.name for f in dataclasses.fields(SentimentOptions)}
    cfg_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    opt_set, cfg_set = {}, {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in opt_fields | cfg_fields:
            ap.error(f"--set {pair}: give KEY=VALUE with KEY a SentimentOptions or TrainConfig field")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        (opt_set if key in opt_fields else cfg_set)[key] = value
    return opt_set, cfg_set


def _fmt(values) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f}%"
    return f"{100 * statistics.mean(values):.1f}% +- {100 * statistics.stdev(values):.1f}"


if __name__ == "__main__":
    sys.exit(main())
