"""One benchmark, every application: train each with its defaults for its time budget, 3 seeds, and print the mean
and spread of its metrics beside the goal set for it.

Every row is the command a user would type (`qkv --threads 1 train NAME ... --max-minutes M --seed S`), then the
final evaluation the trainer wrote to the run's ``metrics.jsonl`` (sentiment: ``kfold.json`` of its 10 folds). The
trainer lays its learning-rate schedule over the budget (``qkv/train/budget.py``), so a budget is a real setting,
not a cut-off.

    python benchmarks/budget.py                       # every goal, 3 seeds: about 5 hours on one core
    python benchmarks/budget.py --only translate-5 qa --seeds 0
    python benchmarks/budget.py --only caption --jobs 2  # two runs at once, one core each
    python benchmarks/budget.py --scale 0.2           # a fifth of every budget (a smoke run; not the goals)

Applications added to the registry after this file was written get a row with their defaults and a 10-minute budget
(``--only NAME``), so nothing is left out silently.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))


@dataclasses.dataclass
class Goal:
    key: str  #: the row's name (``--only``)
    app: str  #: ``qkv train APP``
    minutes: float  #: the budget
    args: list[str]  #: besides the defaults
    targets: dict[str, tuple[str, float]]  #: label -> (split/metric, lowest acceptable value)
    note: str = ""


GOALS = [
    Goal("translate-5", "translate", 5, ["--data", str(DATA / "tatoeba-eng-fra.tsv.gz"), "--src-lang", "en",
                                         "--model", "transformer"],
         {"BLEU en->fr": ("test/bleu", 20.0)}, "Tatoeba, Transformer, 5 minutes"),
    Goal("translate-30", "translate", 30, ["--data", str(DATA / "tatoeba-eng-fra.tsv.gz"), "--src-lang", "en",
                                           "--model", "transformer"],
         {"BLEU en->fr": ("test/bleu", 40.0)}, "Tatoeba, Transformer, 30 minutes"),
    Goal("caption", "caption", 10, [],
         {"exact match": ("test/exact_match", 0.90), "grounding": ("test/grounding", 0.7)}, "scenes"),
    Goal("qa", "qa", 10, [], {"EM held-out entities": ("test/exact_match", 0.95),
                              "EM held-out phrasings": ("test_phrasings/exact_match", 0.95)},
         "facts, English and Chinese"),
    Goal("sentiment", "sentiment", 2, ["--data", str(DATA / "movie-review-snippets.tsv.gz"), "--folds", "10"],
         {"10-fold accuracy": ("kfold/mean", math.nan)}, "10 folds, the budget each; the goal: the bag-of-words floor"),
    Goal("images", "images", 10, [], {"accuracy": ("test/accuracy", math.nan)}, "Fashion-MNIST"),
]


def final_metrics(run: Path) -> dict[str, float]:
    """``{"split/metric": value}`` of the trainer's final evaluation (or of a k-fold run's ``kfold.json``)."""
    out: dict[str, float] = {}
    kfold = run / "kfold.json"
    if kfold.exists():
        figures = json.loads(kfold.read_text())
        return {"kfold/mean": float(figures["mean"]), "kfold/std": float(figures["std"])}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "final":
            out.update({f"{event['split']}/{k}": float(v) for k, v in event["metrics"].items()})
    return out


def bow_floor() -> float:
    """The sentiment goal: the bag-of-words logistic regression's 10-fold accuracy on the same folds."""
    from benchmarks.sentiment import bow_floor as floor
    from qkv.apps.sentiment import SentimentOptions, load_data, make_splits

    options = SentimentOptions(data=str(DATA / "movie-review-snippets.tsv.gz"), folds=10)
    data = load_data(options)  # the same reviews for every fold: read once
    accs = [floor(data, make_splits(data.labels, dataclasses.replace(options, fold=fold))) for fold in range(10)]
    return sum(accs) / len(accs)


def train_run(label: str, qkv_args: list[str], out: Path) -> dict[str, float]:
    """Run ``qkv --threads 1 train QKV_ARGS --out OUT``; its final figures, the wall minutes and the steps made."""
    cmd = [sys.executable, "-m", "qkv", "--threads", "1", "train", *qkv_args, "--out", str(out), "--no-progress"]
    print("$", " ".join(cmd[2:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    figures = final_metrics(out)
    figures["minutes"] = (time.perf_counter() - start) / 60
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        figures["steps"] = max(int(json.loads(line).get("global_step", 0)) for line in metrics.open())
    return figures


def run_goal(goal: Goal, seed: int, root: Path, scale: float) -> dict[str, float]:
    return train_run(f"{goal.key} seed {seed}", [goal.app, *goal.args, "--max-minutes", f"{goal.minutes * scale:g}",
                                                 "--seed", str(seed)], root / f"{goal.key}-seed{seed}")


def mean_spread(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean = sum(values) / len(values)
    spread = (max(values) - min(values)) / 2
    return f"{mean:.3g} ± {spread:.2g}" if len(values) > 1 else f"{mean:.3g}"


def main() -> None:
    from qkv.apps import catalogue

    goals = list(GOALS)
    known = {g.app for g in goals}
    goals += [Goal(name, name, 10, [], {}, "defaults") for name in catalogue() if name not in known]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=[g.key for g in goals], help="these rows only")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget (a smoke run when < 1)")
    ap.add_argument("--root", default=str(ROOT / "runs" / "budget"), help="where the runs go")
    ap.add_argument("--json", help="also write every figure as JSON")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one core each (2 on a 2-core machine: "
                    "side by side, as the recorded tables were taken)")
    args = ap.parse_args()
    if args.only:
        goals = [g for g in goals if g.key in args.only]
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, one torch thread per run, {args.jobs} at once; budgets "
          f"x{args.scale:g}; seeds {args.seeds}; load average {os.getloadavg()[0]:.1f} at the start", flush=True)

    jobs = [(goal, seed) for goal in goals for seed in args.seeds]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # each run is its own process, one thread
        done = list(pool.map(lambda job: run_goal(job[0], job[1], root, args.scale), jobs))
    results: dict[str, list[dict[str, float]]] = {}
    for (goal, _), figures in zip(jobs, done, strict=True):
        results.setdefault(goal.key, []).append(figures)
    rows = []
    for goal in goals:
        runs = results[goal.key]
        targets = dict(goal.targets)
        if goal.app == "sentiment":
            targets = {"10-fold accuracy": ("kfold/mean", bow_floor())}
        if not targets:  # an application without a recorded goal: its monitored figures
            targets = {k: (k, math.nan) for k in runs[0] if k.startswith("test/")}
        for label, (key, low) in targets.items():
            values = [r.get(key, math.nan) for r in runs]
            got = mean_spread(values)
            mean = sum(values) / len(values)
            verdict = "-" if math.isnan(low) else ("met" if mean >= low else "not met")
            rows.append((goal.key, goal.note, f"{goal.minutes * args.scale:g}", label, got,
                         "-" if math.isnan(low) else f">= {low:.3g}", verdict,
                         mean_spread([r["minutes"] for r in runs])))
    print()
    print("| row | data | budget (min) | metric | mean ± half-range | goal | | wall (min) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
