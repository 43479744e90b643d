"""Does a sentiment model's attention explain its decisions? ERASER's comprehensiveness (DeYoung et al. 2020).

    python benchmarks/faithfulness.py --threads 1 --minutes 3            # train BiGRU and Transformer, then measure
    python benchmarks/faithfulness.py --runs runs/bigru runs/transformer  # measure runs trained before

For every test sentence of the movie-review snippets (the split of ``qkv train sentiment``), remove the k tokens
the model attends to most, or k random tokens (mean of ``--draws``), and measure how much the probability of the
predicted class drops. An attention that explains drops it much more than random removals do.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sentiment import DATA, PRESETS, machine  # noqa: E402

from qkv.apps.sentiment import (  # noqa: E402
    SentimentClassifier,
    SentimentOptions,
    comprehensiveness,  # noqa: E402
    load_data,
    make_splits,
    train_folds,
)
from qkv.train import TrainConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="*", default=None, help="trained sentiment runs (default: train --models)")
    ap.add_argument("--models", default="bigru,transformer", help=f"to train, from {', '.join(PRESETS)}")
    ap.add_argument("--minutes", type=float, default=3.0, help="training budget per model")
    ap.add_argument("--out", default="runs/faithfulness", help="where the trained runs go")
    ap.add_argument("--k", default="1,2,3", help="tokens removed, comma-separated")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    runs = [Path(r) for r in args.runs] if args.runs else []
    if not runs:
        for name in args.models.split(","):
            model_kw, train_kw = PRESETS[name]
            opts = SentimentOptions(data=str(DATA), **model_kw)
            cfg = TrainConfig(epochs=12, max_minutes=args.minutes, monitor="accuracy", patience=3, schedule="cosine",
                              progress=False, device="cpu", out=str(Path(args.out) / name), **train_kw)
            train_folds(opts, cfg)
            runs.append(Path(args.out) / name)
    print("### Faithfulness of sentiment attention: comprehensiveness (ERASER)\n")
    print(f"Machine: {machine()}.  ")
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    print("| run | model | k | drop, most attended removed | drop, random removed | attention wins | test texts |"
          " seconds |\n|---|---|---|---|---|---|---|---|")
    for run in runs:
        clf = SentimentClassifier.load(run)
        data = load_data(clf.options)
        texts = [data.texts[i] for i in make_splits(data.labels, clf.options)["test"]]
        for k in (int(x) for x in args.k.split(",")):
            t0 = time.monotonic()
            r = comprehensiveness(clf, texts, k=k, draws=args.draws)
            print(f"| {run.name} | {clf.options.model} | {k} | {r['attention']:.3f} | {r['random']:.3f} | "
                  f"{100 * r['wins']:.0f}% | {r['texts']} | {time.monotonic() - t0:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
