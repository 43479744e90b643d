"""What qkv costs per call on top of PyTorch, on inputs so small that the kernels take almost no time.

    python benchmarks/overhead.py                  # one thread, the table
    python benchmarks/overhead.py --json out.json  # also the figures as JSON

Rows (float32, CPU, ``torch.no_grad``): ``qkv.attention`` against ``F.scaled_dot_product_attention`` on
``(1, 1, 4, 8)`` inputs, without a mask, causal, and with a key-padding mask; ``qkv.MultiHeadAttention`` against
``torch.nn.MultiheadAttention`` (E=8, 2 heads, ``need_weights=False``); and token-by-token decoding of a small
language model with its key/value caches (``qkv.models.lm.generate``, width 128, 4 layers, 200 new tokens).
Microseconds per call are the best of ``--repeat`` rounds, each a batch of ``--calls`` calls of every function in
turn (the machine is shared: the best round is the least disturbed). What is left between the two columns is
Python: argument checks, mask preparation, the choice of a path. On a GPU the same time is spent on the CPU per
call, and shows where a kernel takes less than it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import qkv  # noqa: E402
from qkv.models.lm import CausalLM, LMConfig, generate  # noqa: E402


def per_call(fns: dict, calls: int, repeat: int) -> dict[str, float]:
    """Microseconds per call of each function: ``repeat`` rounds of ``calls`` calls each, the functions interleaved
    round by round; the best round of each."""
    for fn in fns.values():
        for _ in range(max(10, calls // 10)):
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def attention_rows(calls: int, repeat: int) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    pad = torch.tensor([True, True, True, False])[None, None, None, :]
    mha = qkv.MultiHeadAttention(8, 2).eval()
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 4, 8)
    pairs = {
        "no mask": (lambda: qkv.attention(q, k, v), lambda: F.scaled_dot_product_attention(q, k, v)),
        "causal": (lambda: qkv.attention(q, k, v, is_causal=True),
                   lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "key-padding mask": (lambda: qkv.attention(q, k, v, mask=pad),
                             lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad)),
        "multi-head layer (E=8, 2 heads)": (lambda: mha(x), lambda: ref(x, x, x, need_weights=False)),
    }
    rows = []
    with torch.no_grad():
        for name, (ours, theirs) in pairs.items():
            t = per_call({"qkv": ours, "torch": theirs}, calls, repeat)
            rows.append((name, t["qkv"], t["torch"]))
    return rows


def decoding(tokens: int, repeat: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=100, dim=128, num_layers=4, max_len=256)).eval()
    prompt = torch.randint(1, 100, (1, 8))
    times = []
    with torch.no_grad():
        generate(model, prompt, 20, seed=0)
        for _ in range(repeat):
            start = time.perf_counter()
            generate(model, prompt, tokens, seed=0)
            times.append(time.perf_counter() - start)
    best = min(times)
    return {"tokens_per_s": tokens / best, "ms_per_token": best / tokens * 1e3, "median_s": statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    ap.add_argument("--repeat", type=int, default=7, help="timed rounds (the best is kept)")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per decoding run")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = attention_rows(args.calls, args.repeat)
    dec = decoding(args.tokens, args.repeat)
    print(f"{datetime.date.today()}, torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s)\n")
    print("| call, float32, no_grad | qkv | PyTorch | qkv's own time |")
    print("|---|---:|---:|---:|")
    for name, ours, theirs in rows:
        print(f"| {name} | {ours:.1f} us | {theirs:.1f} us | {ours - theirs:+.1f} us |")
    print(f"\ndecoding, width 128, 4 layers, {args.tokens} tokens with the caches: {dec['tokens_per_s']:.0f} tokens/s "
          f"({dec['ms_per_token']:.2f} ms a token)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "decoding": dec}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
