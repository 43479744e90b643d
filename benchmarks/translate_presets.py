"""The recorded search behind translation's presets: which model, vocabulary and learning rate give the
most BLEU on a Tatoeba file in a learner's budget.

Each candidate is the command a user would type, ``qkv --threads 1 train translate --data FILE --model transformer
...`` with its settings, run for the same budget; the table gives the trainer's final test BLEU (greedy, 1,000 test
sources) and the steps it made. Budgets are wall-clock, so candidates compared in one table must run under the same
load: run them side by side (``--jobs 2`` on two cores), or give ``--steps N`` to compare them at the same number of
steps (the schedule laid over N steps), which a busy machine does not change.

    python benchmarks/translate_presets.py --minutes 5 --jobs 2     # every candidate, two at a time
    python benchmarks/translate_presets.py --steps 3300 --only small-v4000-lr2 small-v4000-lr3   # same steps
    python benchmarks/translate_presets.py --minutes 30 --only small-v4000-lr3 base-v4000-lr2 --jobs 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.budget import train_run  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "tatoeba-eng-fra.tsv.gz"

# name -> every setting that the search varied, spelled out (so that a row means the same when the defaults move);
# the rest are `qkv train translate`'s defaults (batch 64, cosine, dropout 0.1, label smoothing 0.1)
SMALL = ["--dim", "128", "--num-layers", "1"]
CANDIDATES: dict[str, list[str]] = {
    "small-v8000-lr2": [*SMALL, "--vocab-size", "8000", "--lr", "2e-3", "--warmup-steps", "200"],  # the old defaults
    "small-v8000-lr3": [*SMALL, "--vocab-size", "8000", "--lr", "3e-3", "--warmup-steps", "100"],
    "small-v4000-lr2": [*SMALL, "--vocab-size", "4000", "--lr", "2e-3", "--warmup-steps", "200"],  # the defaults
    "small-v4000-lr3": [*SMALL, "--vocab-size", "4000", "--lr", "3e-3", "--warmup-steps", "100"],
    "small-v2000-lr3": [*SMALL, "--vocab-size", "2000", "--lr", "3e-3", "--warmup-steps", "100"],
    "base-v4000-bs128": ["--dim", "256", "--num-layers", "2", "--vocab-size", "4000", "--batch-size", "128",
                         "--lr", "1.5e-3", "--warmup-steps", "200", "--dropout", "0"],
    "base-v4000-lr2": ["--dim", "256", "--num-layers", "2", "--vocab-size", "4000", "--lr", "2e-3",
                       "--warmup-steps", "200"],
}


def run(name: str, args: argparse.Namespace) -> dict[str, float]:
    out = Path(args.root) / (f"{name}-{args.minutes:g}min" if args.steps is None else f"{name}-{args.steps}steps")
    limit = (["--max-steps", str(args.steps), "--schedule-steps", str(args.steps)] if args.steps is not None
             else ["--max-minutes", f"{args.minutes:g}"])  # --max-steps alone would not end the schedule there
    return train_run(name, ["translate", "--data", args.data, "--src-lang", "en", "--model", "transformer",
                            *CANDIDATES[name], *limit, "--seed", str(args.seed)], out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--only", nargs="+", choices=list(CANDIDATES), default=None)
    ap.add_argument("--minutes", type=float, default=5.0, help="each candidate's budget")
    ap.add_argument("--steps", type=int, default=None, help="instead of minutes: the same number of steps each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="candidates run at once (one core each)")
    ap.add_argument("--root", default=str(ROOT / "runs" / "translate-presets"))
    args = ap.parse_args()
    names = args.only or list(CANDIDATES)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, one torch thread per run, {args.jobs} at once; "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(names, pool.map(lambda n: run(n, args), names), strict=True))
    print("\n| candidate | settings | steps | test BLEU | test chrF | valid BLEU | wall (min) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | `{' '.join(CANDIDATES[name]) or '(the defaults)'}` | {r['steps']} | "
              f"{r.get('test/bleu', float('nan')):.1f} | {r.get('test/chrf', float('nan')):.1f} | "
              f"{r.get('valid/bleu', float('nan')):.1f} | {r['minutes']:.1f} |")


if __name__ == "__main__":
    main()
