"""Captioning on generated scenes: soft, hard, fixed and Transformer side by side (Show, Attend and Tell).

Each model trains with ``qkv train caption``'s defaults (``--data scenes``) for at most ``--minutes`` of wall-clock
time on ``--threads`` threads; the best weights (valid exact match) are evaluated on the test scenes, greedy.
Prints BLEU-4, exact match, grounding, training images/s and captioning images/s, then exact match by number of
items, on held-out item/cell combinations and on the layout alone (positions and relations, items masked).

    python benchmarks/caption.py --threads 1 --minutes 10 --out runs/caption-bench
    python benchmarks/caption.py --models soft,fixed --out runs/caption-bench     # some models (e.g. in parallel)
    python benchmarks/caption.py --report --out runs/caption-bench               # the tables of the saved results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch
from record import record_flag

from qkv.apps.caption import Captioner, CaptionOptions, CaptionTask, train_defaults
from qkv.train import train


def run(model: str, args) -> dict:
    out = Path(args.out) / model
    if out.exists():
        shutil.rmtree(out)
    options = CaptionOptions(model=model, **json.loads(args.options))
    config = train_defaults(options).replace(max_minutes=args.minutes, out=str(out), progress=False,
                                             seed=args.seed, **({"epochs": args.epochs} if args.epochs else {}))
    result = train(CaptionTask(options), config)
    steps, elapsed = result.state.global_step, result.state.elapsed
    captioner = Captioner.load(out)
    images, _ = captioner.test_images(list(range(min(500, options.n_test))))
    start = time.perf_counter()
    captioner.predict(images, beam=1)
    decode = len(images) / (time.perf_counter() - start)
    record = {"model": model, "options": dataclasses.asdict(options), "steps": steps, "seconds": elapsed,
              "stopped": result.stopped, "train_images_per_s": steps * config.batch_size / elapsed,
              "caption_images_per_s": decode, "test": result.metrics["test"], "valid": result.metrics["valid"],
              "threads": torch.get_num_threads()}
    (Path(args.out) / f"{model}.json").write_text(json.dumps(record, indent=2))
    return record


def report(records: list[dict]) -> None:
    print("| model | BLEU-4 | exact match | grounding | grounding > 0.5 | train images/s | caption images/s | steps |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        m = r["test"]
        print(f"| {r['model']} | {m['bleu4']:.1f} | {m['exact_match']:.3f} | {m['grounding']:.3f} | "
              f"{m['grounding_above']:.3f} | {r['train_images_per_s']:.0f} | {r['caption_images_per_s']:.0f} | "
              f"{r['steps']} |")
    print("\n| model | 1 item | 2 items | 3 items | 4 items | held-out combinations | layout (items masked) |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        m = r["test"]
        print(f"| {r['model']} | " + " | ".join(f"{m[f'exact_match_items{n}']:.3f}" for n in range(1, 5)) +
              f" | {m['exact_match_unseen']:.3f} | {m['layout_match']:.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="soft,hard,fixed,transformer")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--epochs", type=int, default=None, help="default: the task's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--options", default="{}", help="CaptionOptions as JSON, e.g. '{\"doubly_stochastic\": 1.0}'")
    p.add_argument("--out", default="runs/caption-bench")
    p.add_argument("--report", action="store_true", help="print the tables of the results saved in --out")
    record_flag(p, "caption")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    names = args.models.split(",")
    if args.report:
        records = [json.loads((Path(args.out) / f"{m}.json").read_text()) for m in names
                   if (Path(args.out) / f"{m}.json").is_file()]
    else:
        records = [run(m, args) for m in names]
    report(records)
    if args.record:
        from record import measurement
        from record import record as write

        write("caption", [measurement(
            r["model"], f"{r['model']}, {args.minutes:g} minutes, seed {args.seed}: exact match (grounding "
            f"{r['test']['grounding']:.3f}, 4-item scenes {r['test']['exact_match_items4']:.3f}, held-out "
            f"combinations {r['test']['exact_match_unseen']:.3f})", r["test"]["exact_match"],
            figure=f"{r['test']['exact_match']:.3f}") for r in records], threads=args.threads)


if __name__ == "__main__":
    main()
