"""The attention page's size and the cost of capturing, on a 6-layer, 8-head Transformer and a 100-token input.

    python benchmarks/page.py --threads 1

Capturing computes the weights beside each attention call that did not ask for them (the output is the one the
model computes anyway), so a captured forward pass costs more than a plain one; outside a capture the library
checks one global variable per call.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sentiment import machine  # noqa: E402

import qkv  # noqa: E402
from qkv.models import create  # noqa: E402
from qkv.viz.page import save_attention_page  # noqa: E402


def best_of(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create("transformer", src_vocab=1000, tgt_vocab=1000, dim=args.dim, num_heads=args.heads,
                   num_layers=args.layers).eval()
    t = args.tokens
    src, tgt = torch.randint(4, 1000, (1, t)), torch.randint(4, 1000, (1, t))
    mask = torch.ones(1, t, dtype=torch.bool)

    def plain():
        with torch.no_grad():
            model(src, mask, tgt)

    def captured():
        with torch.no_grad(), qkv.capture_attention(model):
            model(src, mask, tgt)

    plain()
    captured()
    t_plain, t_capture = best_of(plain, args.rounds), best_of(captured, args.rounds)
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(src, mask, tgt)
    tokens = {"source": [f"s{i}" for i in range(t)], "target": [f"t{i}" for i in range(t)]}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = save_attention_page(Path(tmp) / "page.html", records, tokens=tokens)
        t_page = time.perf_counter() - t0
        size = path.stat().st_size
    print(f"### The attention page: {args.layers} layers x {args.heads} heads, {t} source and {t} target tokens\n")
    print(f"Machine: {machine()}.  ")
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    print("| what | figure |\n|---|---|")
    print(f"| attention modules recorded | {len(records)} ({sum(r.num_heads for r in records)} head matrices) |")
    print(f"| page size (weights 1 byte each, rollout included) | {size / 1e6:.2f} MB |")
    print(f"| forward pass, plain | {1e3 * t_plain:.1f} ms |")
    print(f"| forward pass, captured | {1e3 * t_capture:.1f} ms ({t_capture / t_plain:.2f}x) |")
    print(f"| writing the page | {1e3 * t_page:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
