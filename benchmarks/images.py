"""Fashion-MNIST test accuracy of the small CNN without attention and with SE, ECA, CBAM, SK and Non-local blocks,
under the same training budget, with parameter counts and training images/s. Prints a markdown table.

    python benchmarks/images.py --threads 2                       # 10 minutes per variant, schedule fitted to it
    python benchmarks/images.py --epochs 6 --max-minutes 20       # the same 6 epochs for every variant
    python benchmarks/images.py --variants none,cbam --quick      # a few steps, a smoke test

Every variant trains with the project's trainer on the same data, split, seed, augmentation (the task's default for
Fashion-MNIST: horizontal flips; ``--augment``), dropout 0.1, AdamW (lr 2e-3, weight decay 0.05, batch 128) and a
cosine schedule. With ``--epochs auto`` (the default) every variant gets the same time budget, ``--max-minutes``: a
40-step run of the trainer measures its speed (the median step after 10), and its cosine schedule is set to the
number of steps that fit in the budget (less 10% for the evaluations), so that a slower block trains on fewer
images but still ends its schedule. With ``--epochs N`` every variant gets N epochs and ``--max-minutes`` only
stops one that is too slow (its schedule is then cut short, which the table shows as "(time)"). The best validation
accuracy (checked every epoch on ``--valid`` of the training images, held out) picks the weights that are tested,
as they are and with flip TTA (each test image's class probabilities averaged with its mirror's). Images/s is the
median over training steps (evaluations excluded), on ``--threads`` threads. Freed memory is kept for reuse
(:func:`qkv.memory.keep_freed_memory`, as the ``qkv`` command does) unless ``--release-memory``.

Data: Debian's ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``) or ``--data-root``.
Reference: Xiao et al. (2017) list 2-layer CNNs at 91-93% test accuracy; the target is >= 93% for the
best variant within 10 minutes of CPU training.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import cpu_name, record_flag  # noqa: E402 - benchmarks/ is the script's own folder

from qkv.apps.images import ImageOptions, ImageTask, count_parameters, load_data  # noqa: E402
from qkv.memory import keep_freed_memory  # noqa: E402
from qkv.train import TrainConfig, train  # noqa: E402

VARIANTS = ("none", "se", "eca", "cbam", "sk", "non_local")
LABELS = {"none": "no attention", "se": "SE", "eca": "ECA", "cbam": "CBAM", "sk": "SK", "non_local": "Non-local"}


def train_config(args, **overrides) -> TrainConfig:
    """The trainer's settings for every variant (and its speed probe)."""
    settings = dict(epochs=1, max_minutes=args.max_minutes, batch_size=args.batch_size, lr=args.lr,
                    weight_decay=args.weight_decay, schedule="cosine", monitor="accuracy", seed=args.seed,
                    device="cpu", progress=False)
    return TrainConfig(**{**settings, **overrides})


def probe_speed(task: ImageTask, args, steps: int = 30, warmup: int = 10) -> float:
    """Training images/s of ``task``'s model: the median step of a short run of the same trainer."""
    stamps: list[float] = []
    train(task, train_config(args, max_steps=warmup + steps), callbacks=[lambda state, logs: stamps.append(
        time.perf_counter())])
    return args.batch_size / statistics.median(b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:],
                                                                        strict=False))


def run_variant(attn: str, data, args) -> dict:
    opts = ImageOptions(data="fashion-mnist", data_root=args.data_root, attn=attn, augment=args.augment,
                        dropout=args.dropout, shift=args.shift, valid=args.valid)
    task = ImageTask(opts, data=data)
    epochs, schedule_steps, max_steps = args.epochs, None, args.max_steps
    if args.epochs == "auto":
        per_epoch = -(-len(data.splits["train"][1]) // args.batch_size)
        speed = probe_speed(ImageTask(opts, data=data), args)
        schedule_steps = max(1, int(0.9 * 60 * args.max_minutes * speed / args.batch_size))
        if max_steps:
            schedule_steps = min(schedule_steps, max_steps)
        epochs, max_steps = -(-schedule_steps // per_epoch), schedule_steps
    times: list[float] = []
    counts: list[float] = []

    def clock(state, logs):
        times.append(time.perf_counter())
        counts.append(logs["count"])

    cfg = train_config(args, epochs=int(epochs), max_steps=max_steps, schedule_steps=schedule_steps)
    t0 = time.perf_counter()
    result = train(task, cfg, callbacks=[clock])
    wall = time.perf_counter() - t0
    task.options.tta = "flip"  # the same weights, each test image averaged with its mirror
    with torch.no_grad():
        test_tta = task.evaluate(result.model.eval(), "test")["accuracy"]
    steps = [t1 - t0_ for t0_, t1 in zip(times, times[1:], strict=False)]
    per_s = args.batch_size / statistics.median(steps) if steps else float("nan")
    return {"attn": attn, "params": count_parameters(result.model), "images_per_s": per_s,
            "images": int(sum(counts)), "train_s": result.state.elapsed, "wall_s": wall, "stopped": result.stopped,
            "valid": result.metrics["valid"]["accuracy"], "test": result.metrics["test"]["accuracy"],
            "test_tta": test_tta}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated attn names (none = no block)")
    p.add_argument("--epochs", default="auto",
                   help="'auto': a schedule fitted to --max-minutes per variant; N: N epochs for every variant")
    p.add_argument("--max-minutes", type=float, default=10.0, help="training time budget per variant")
    p.add_argument("--augment", default="auto", help="the task's --augment: auto (flips), shift-flip, ...")
    p.add_argument("--shift", type=int, default=2, help="largest random shift in pixels, with --augment shift-flip")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--valid", type=float, default=0.1, help="fraction of the training images held out to pick the "
                   "best epoch")
    p.add_argument("--release-memory", action="store_true",
                   help="leave glibc's malloc as it is (by default freed memory is kept for reuse, as the qkv "
                        "command does)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--data-root", default=None, help="Fashion-MNIST IDX folder (default: the Debian package's)")
    p.add_argument("--quick", action="store_true", help="10 steps per variant, a smoke test")
    record_flag(p, "images")
    args = p.parse_args()
    if args.quick:
        args.max_steps, args.epochs = 10, "1"
    if args.epochs != "auto":
        if not args.epochs.isdigit() or int(args.epochs) < 1:
            p.error(f"--epochs must be 'auto' or a positive integer, got {args.epochs!r}")
        args.epochs = int(args.epochs)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = not args.release_memory and keep_freed_memory()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        data = load_data(ImageOptions(data_root=args.data_root, valid=args.valid))
    except FileNotFoundError as e:
        print(f"benchmark skipped: {e}", file=sys.stderr)
        return 1
    rows = []
    for attn in variants:
        row = run_variant(attn, data, args)
        rows.append(row)
        print(f"{attn}: test {row['test']:.4f} ({row['images']} images, {row['train_s']:.0f} s, {row['stopped']})",
              file=sys.stderr, flush=True)

    n_train = len(data.splits["train"][1])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); load average {load:.1f} at the end (shared machine); freed memory "
          f"{'kept for reuse (qkv.memory)' if kept else 'given back (glibc default)'}.")
    print(f"Command: `python benchmarks/images.py {' '.join(sys.argv[1:])}`")
    if args.epochs == "auto":
        budget = (f"{args.max_minutes:g} minutes of training, the cosine schedule fitted to each variant's speed "
                  f"(the epochs column: {n_train:,} training images each)")
    else:
        budget = (f"{args.epochs} epoch(s) of {n_train:,} training images (cosine schedule over them), stopped after "
                  f"{args.max_minutes:g} minutes of training"
                  + (f" or {args.max_steps} steps" if args.max_steps else ""))
    aug = ImageOptions(augment=args.augment).augmentation
    if "shift" in aug:
        aug += f" (shift {args.shift})"
    print(f"Budget per variant: {budget}; batch {args.batch_size}, AdamW lr {args.lr:g} weight decay "
          f"{args.weight_decay:g}, augmentation {aug}, dropout {args.dropout:g}, label smoothing 0.1; "
          f"{len(data.splits['valid'][1]):,} held-out training images pick the best epoch, which is tested as it is "
          "and with flip TTA (each test image's probabilities averaged with its mirror's).\n")
    print("| attention | parameters | train images/s | epochs | train time | valid acc | test acc "
          "| test acc, flip TTA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {LABELS.get(r['attn'], r['attn'])} | {r['params']:,} | {r['images_per_s']:.0f} | "
              f"{r['images'] / n_train:.2f}{' (time)' if r['stopped'] == 'time' else ''} | {r['train_s'] / 60:.1f} min"
              f" | {r['valid']:.2%} "
              f"| {r['test']:.2%} | {r['test_tta']:.2%} |")
    if args.record and not args.quick:
        from record import measurement, record

        plain = next((r for r in rows if r["attn"] == "none"), None)
        record("images", [measurement(
            r["attn"].replace("_", "").replace("-", ""),
            f"{LABELS.get(r['attn'], r['attn'])}, {r['images'] / n_train:.2f} epochs"
            + (f" ({1 - r['images_per_s'] / plain['images_per_s']:.0%} fewer images/s)"
               if plain is not None and r is not plain else ""),
            100 * r["test"], "test accuracy", figure=f"{r['test']:.2%}") for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
