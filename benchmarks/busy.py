"""A busy laptop: train through the command line with and without a CPU-bound process of the user's beside it.

The busy process is a loop of matrix products on one core (one torch thread, pinned to the last core where the
system allows); the training is ``qkv train NAME ... --max-minutes M --seed S`` with the defaults, so its torch
threads follow the machine (``qkv/train/threads.py``) unless ``--threads N`` is given here, which passes
``qkv --threads N`` (``--threads 2`` on 2 cores is how qkv trained before its threads followed the machine). Each
row prints the final figures, the steps made and the thread changes the run logged, and the busy/quiet ratio of the
main metric when both were run.

    python benchmarks/busy.py --only translate --seeds 0                 # quiet, then busy
    python benchmarks/busy.py --only caption --busy-only --seeds 0 1 2
    python benchmarks/busy.py --only translate --busy-only --threads 2   # the fixed count, for comparison
    python benchmarks/busy.py --busy                                     # only the busy process, until Ctrl-C
    python benchmarks/busy.py --seeds 0 1 2 --json rows.json --record    # both, three seeds; into BENCHMARKS.md
    python benchmarks/busy.py --rows a.json b.json --record              # record rows written before (--json)

A "quiet" figure is only quiet if nothing else runs on the machine: the load average at the start and end of each
run is printed with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from record import record_flag  # benchmarks/ is the script's own folder

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"

#: name -> (qkv train arguments besides the defaults, minutes, the main metric "split/metric")
RUNS = {
    "translate": (["translate", "--data", str(DATA / "tatoeba-eng-fra.tsv.gz"), "--src-lang", "en",
                   "--model", "transformer"], 4.0, "test/bleu"),
    "caption": (["caption"], 5.0, "test/exact_match"),
    "segment": (["segment"], 5.0, "test/miou"),
}


def busy_loop(size: int = 384) -> None:
    """Matrix products forever on one core (the user's CPU-bound work)."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    while True:
        a = torch.tanh(a @ b)


@contextlib.contextmanager
def busy_process(on: bool):
    if not on:
        yield None
        return
    proc = multiprocessing.get_context("spawn").Process(target=busy_loop, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.join(10)


def figures(out: Path) -> dict:
    """The final evaluation's metrics, the steps made and the thread changes of a run's ``metrics.jsonl``."""
    result: dict = {"threads": []}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        result["steps"] = max(result.get("steps", 0), int(event.get("global_step", 0)))
        if event.get("event") == "final":
            result.update({f"{event['split']}/{k}": float(v) for k, v in event["metrics"].items()})
        elif event.get("event") == "threads":
            result["threads"].append(f"step {event['global_step']}: {event['was']}->{event['threads']}")
    return result


def train(name: str, seed: int, busy: bool, root: Path, minutes: float | None, threads: int | None) -> dict:
    args, default_minutes, metric = RUNS[name]
    out = root / f"{name}-s{seed}-{'busy' if busy else 'quiet'}{f'-t{threads}' if threads else ''}"
    cmd = [sys.executable, "-m", "qkv", *(["--threads", str(threads)] if threads else []), "train", *args,
           "--max-minutes", f"{minutes or default_minutes:g}", "--seed", str(seed), "--out", str(out),
           "--no-progress"]
    print("$", " ".join(cmd[2:]), "(with the busy process)" if busy else "", flush=True)
    load0 = os.getloadavg()[0]
    with busy_process(busy):
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result = figures(out)
    result.update(minutes=round((time.perf_counter() - start) / 60, 2), load=(round(load0, 1),
                  round(os.getloadavg()[0], 1)), main=result.get(metric))
    print(json.dumps({"run": out.name, **result}), flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(RUNS), default=["translate", "caption"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--minutes", type=float, help="the budget of every run (default: each application's)")
    p.add_argument("--threads", type=int, help="pass qkv --threads N (default: the threads follow the machine)")
    p.add_argument("--busy-only", action="store_true", help="only the runs with the busy process")
    p.add_argument("--quiet-only", action="store_true", help="only the runs without it")
    p.add_argument("--busy", action="store_true", help="run only the busy process, until interrupted")
    p.add_argument("--root", type=Path, default=Path("runs/busy"))
    p.add_argument("--json", type=Path, help="write every row here")
    p.add_argument("--rows", type=Path, nargs="+", help="train nothing: the rows of earlier runs (their --json); "
                   "a later file's row of the same application and seed replaces an earlier one's")
    record_flag(p, "training", "the busy/quiet ratios")
    a = p.parse_args()
    if a.busy:
        busy_loop()
    if a.rows:
        rows = list({(r["name"], r["seed"]): r for f in a.rows for r in json.loads(f.read_text())}.values())
        if a.record:
            record_rows(rows)
        return
    rows = []
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    for name in a.only:
        for seed in a.seeds:
            row = {"name": name, "seed": seed}
            for busy in ([False] if a.quiet_only else []) + ([True] if a.busy_only else []) or [False, True]:
                row["busy" if busy else "quiet"] = train(name, seed, busy, a.root, a.minutes, a.threads)
            if "busy" in row and "quiet" in row and row["quiet"]["main"]:
                row["ratio"] = row["busy"]["main"] / row["quiet"]["main"]
                print(f"{name} seed {seed}: busy/quiet {row['ratio']:.2f}", flush=True)
            rows.append(row)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    if a.record:
        record_rows(rows)


def record_rows(rows: list[dict]) -> None:
    """Each application's busy/quiet ratio of its main metric, over the seeds with both runs, into
    ``benchmarks/results/training.json`` (target: at least 0.8 for every seed)."""
    from record import measurement, record

    found = []
    for name in RUNS:
        pairs = sorted((r["seed"], r) for r in rows if r["name"] == name and "ratio" in r)
        if not pairs:
            continue
        args, minutes, metric = RUNS[name]
        ratios = [r["ratio"] for _, r in pairs]
        seeds = " / ".join(str(seed) for seed, _ in pairs)

        def fig(kind, pairs=pairs, metric=metric):
            return " / ".join(f"{r[kind]['main']:.3g}" for _, r in pairs)

        found.append(measurement(
            f"busy-{name}", f"{name}, {minutes:g} minutes, the defaults, seeds {seeds}: {metric} beside one busy "
            f"core / on the quiet machine ({fig('busy')} against {fig('quiet')}; steps "
            + " / ".join(f"{r['busy']['steps']} against {r['quiet']['steps']}" for _, r in pairs) + ")",
            min(ratios), "ratio", figure=" / ".join(f"{x:.2f}" for x in ratios), target=">= 0.8"))
    if found:
        record("training", found, command="python benchmarks/busy.py --only " + " ".join(
            n for n in RUNS if any(r["name"] == n for r in rows)) + " --seeds 0 1 2 --record")


if __name__ == "__main__":
    main()
