"""Segmentation on generated scenes: BiSeNet V1, its three ablations and an FCN-8s baseline at equal training time.

Each variant trains with ``qkv train segment``'s defaults (``--data scenes``, a ResNet-18-style backbone unless
``--options`` says otherwise) for at most ``--minutes`` of wall-clock time on ``--threads`` threads (the trainer
fits the cosine schedule to the budget); the best weights (valid mIoU) are scored on the test scenes. Prints mIoU,
pixel accuracy, the mIoU of test scenes holding held-out item/cell combinations, per-class IoU, the steps trained,
and the CPU latency (images/s, batch 1) at 64x64 and 512x512.

    python benchmarks/segment.py --threads 1 --minutes 5 --out runs/segment-bench
    python benchmarks/segment.py --variants bisenet,fcn --out runs/segment-bench    # some variants
    python benchmarks/segment.py --latency-only                                     # the speed table alone
    python benchmarks/segment.py --report --out runs/segment-bench                  # the tables of saved results
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

from qkv.apps.segment import SegmentOptions, SegmentTask, model_spec, train_defaults
from qkv.models import create
from qkv.options import default_of, option_fields, why_not
from qkv.train import train

VARIANTS = {"bisenet": {}, "bisenet-noarm": {"arm": False}, "bisenet-noffm": {"ffm": False},
            "bisenet-context": {"context_only": True}, "fcn": {"model": "fcn"}}


def _options(variant: str, args) -> SegmentOptions:
    """``--options`` with the variant's settings, less the options that do not apply to it (e.g. the spatial path's
    widths for the FCN)."""
    values = {**json.loads(args.options), **VARIANTS[variant]}
    specs = {f.name: (f, spec) for f, spec in option_fields(SegmentOptions)}

    def value_of(name):
        return values.get(name, default_of(specs[name][0]))

    return SegmentOptions(**{k: v for k, v in values.items() if k in VARIANTS[variant]
                             or why_not(specs[k][1], k, value_of) is None})


def latency(variant: str, args, size: int, repeats: int) -> float:
    """Images per second, batch 1, eval mode, on the CPU (after two warm-up passes)."""
    options = _options(variant, args)
    spec = model_spec(options, num_classes=7, in_channels=1 if options.data == "scenes" else 3)
    model = create(spec["name"], **spec["config"]).eval()
    x = torch.randn(1, spec["config"]["in_channels"], size, size)
    with torch.no_grad():
        for _ in range(2):
            model(x)
        start = time.perf_counter()
        for _ in range(repeats):
            model(x)
    return repeats / (time.perf_counter() - start)


def run(variant: str, args, data) -> dict:
    out = Path(args.out) / variant
    if out.exists():
        shutil.rmtree(out)
    options = _options(variant, args)
    config = train_defaults(options).replace(max_minutes=args.minutes, out=str(out), progress=False, seed=args.seed,
                                             **({"epochs": args.epochs} if args.epochs else {}))
    result = train(SegmentTask(options, data), config)
    steps, elapsed = result.state.global_step, result.state.elapsed
    record = {"variant": variant, "options": dataclasses.asdict(options), "steps": steps, "seconds": elapsed,
              "stopped": result.stopped, "train_images_per_s": steps * config.batch_size / elapsed,
              "parameters": sum(p.numel() for p in result.model.parameters()),
              "test": result.metrics["test"], "valid": result.metrics["valid"], "threads": torch.get_num_threads()}
    (Path(args.out) / f"{variant}.json").write_text(json.dumps(record, indent=2))
    return record


def report(records: list[dict]) -> None:
    print("| variant | parameters | test mIoU | pixel accuracy | mIoU held out | steps | train images/s |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        m = r["test"]
        print(f"| {r['variant']} | {r['parameters'] / 1e6:.2f}M | {m['miou']:.3f} | {m['pixel_accuracy']:.3f} | "
              f"{m.get('miou_held_out', float('nan')):.3f} | {r['steps']} | {r['train_images_per_s']:.0f} |")
    names = [k[len("iou/"):] for k in records[0]["test"] if k.startswith("iou/")] if records else []
    print("\n| variant | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for r in records:
        print(f"| {r['variant']} | " + " | ".join(f"{r['test'][f'iou/{n}']:.3f}" for n in names) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget of each variant (wall clock)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (the schedule's length; default: the preset)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", default="{}", help="SegmentOptions as JSON, e.g. '{\"n_train\": 8000}'")
    parser.add_argument("--out", default="runs/segment-bench")
    parser.add_argument("--report", action="store_true", help="print the tables of the saved results")
    parser.add_argument("--latency-only", action="store_true", help="measure the CPU latency only")
    parser.add_argument("--repeats", type=int, default=20, help="forward passes timed at 64x64 (a fifth at 512x512)")
    record_flag(parser, "segment")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; of {', '.join(VARIANTS)}")
    if args.report:
        report([json.loads((Path(args.out) / f"{v}.json").read_text()) for v in variants
                if (Path(args.out) / f"{v}.json").exists()])
        return
    if not args.latency_only:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        from qkv.apps.segment import load_data

        data = load_data(_options(variants[0], args))  # generated once, shared by every variant
        records = []
        for v in variants:
            records.append(run(v, args, data))
            print(f"{v}: test mIoU {records[-1]['test']['miou']:.4f} after {records[-1]['steps']} steps", flush=True)
        report(records)
        if args.record:
            from record import measurement, record

            keys = {"bisenet-noarm": "arm", "bisenet-noffm": "ffm", "bisenet-context": "context-only"}
            items = []
            for r in records:
                m, held = r["test"], r["test"].get("miou_held_out", float("nan"))
                items.append(measurement(keys.get(r["variant"], r["variant"]), f"{r['variant']}, seed {args.seed}, "
                                         f"{r['steps']:,} steps: test mIoU (held-out combinations {held:.3f})",
                                         m["miou"], figure=f"{m['miou']:.3f}"))
                if r["variant"] == "bisenet":
                    items.append(measurement("bisenet-heldout", None, held, figure=f"{held:.3f}"))
            record("segment", items, threads=args.threads)
    print(f"\nCPU latency, batch 1, {args.threads} thread(s), images/s:")
    print("| variant | 64x64 | 512x512 |")
    print("|---|---|---|")
    for v in variants:
        print(f"| {v} | {latency(v, args, 64, args.repeats):.1f} | "
              f"{latency(v, args, 512, max(3, args.repeats // 5)):.2f} |", flush=True)


if __name__ == "__main__":
    main()
