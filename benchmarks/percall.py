"""Where the time of one call goes: qkv against its PyTorch baseline, op by op, on any device.

    python benchmarks/percall.py                       # CUDA if present, else the CPU; every case
    python benchmarks/percall.py --cases padding,mods  # some of them
    python benchmarks/percall.py --device cpu --quick  # small sizes: checks the script itself

For each case (the rows of ``benchmarks/gpu.py`` at B=8, H=8, T=1024, D=64: the fast path, the key-padding path,
the weights, ALiBi + causal modifiers) this prints

- the host time per call when the calls are issued back to back without waiting for the device (what a model
  running one layer after another pays on the CPU), and the time per call with the device waited for;
- the same for a training step (``fast-train``, ``padding-train``: forward and backward);
- the profiler's table of the ops that took the most host time over ``--calls`` calls, qkv's and the baseline's,
  and every host-device copy and synchronisation found in them (each one stalls the queue a GPU needs full).

It measures no goal: it says why a row of ``benchmarks/gpu.py`` is what it is.
"""

# ruff: noqa: B023 - the profiled lambdas run within their loop iteration

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import qkv  # noqa: E402
from qkv import compiled, mods  # noqa: E402

STALLS = ("synchronize", "memcpy", "item", "_local_scalar_dense", "nonzero", "copy_")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_and_device(fn, device: torch.device, calls: int) -> tuple[float, float]:
    """Microseconds per call: issuing ``calls`` calls without waiting (host), and with the wait at the end."""
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    sync(device)
    done = time.perf_counter()
    return (issued - start) / calls * 1e6, (done - start) / calls * 1e6


def profile(name: str, fn, device: torch.device, calls: int, rows: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with prof(activities=activities) as p:
        for _ in range(calls):
            fn()
        sync(device)
    events = p.key_averages()
    print(f"\n#### {name}: the ops with the most host time over {calls} calls\n")
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    stalls = [e for e in events if any(s in e.key.lower() for s in STALLS)]
    if stalls:
        print(f"{name}: copies and synchronisations: " + "; ".join(f"{e.key} x{e.count}" for e in stalls))


def cases(b: int, h: int, t: int, d: int, dtype: torch.dtype, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=gen).to(device, dtype) for _ in range(3))
    lengths = torch.randint(t // 2, t + 1, (b,), generator=gen).to(device)
    pad = (torch.arange(t, device=device)[None] < lengths[:, None])[:, None, None]
    alibi = mods.alibi(h)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def train(fn):  # forward and backward
        def run():
            with torch.enable_grad():
                torch.autograd.grad(fn().float().sum(), (qg, kg, vg))
        return run

    out = {
        "fast": (lambda: qkv.attention(q, k, v), lambda: F.scaled_dot_product_attention(q, k, v)),
        "padding": (lambda: qkv.attention(q, k, v, mask=pad),
                    lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad)),
        "weights": (lambda: qkv.attention(q, k, v, return_weights=True), lambda: qkv.attention(q, k, v)),
        "fast-train": (train(lambda: qkv.attention(qg, kg, vg)),
                       train(lambda: F.scaled_dot_product_attention(qg, kg, vg))),
        "padding-train": (train(lambda: qkv.attention(qg, kg, vg, mask=pad)),
                          train(lambda: F.scaled_dot_product_attention(qg, kg, vg, attn_mask=pad))),
    }
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        block = create_block_mask(mods.causal, 1, 1, t, t, device=device)
        out["mods"] = (lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal),
                       lambda: flex(q, k, v, score_mod=alibi, block_mask=block))
    except ImportError:
        pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--cases", default="fast,padding,weights,mods")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rows", type=int, default=12, help="ops listed per profile")
    ap.add_argument("--quick", action="store_true", help="B=2, H=2, T=128, D=16")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    compiled.set_compile("1")  # compiled before the profiled calls, as in benchmarks/gpu.py
    size = (2, 2, 128, 16) if args.quick else (8, 8, 1024, 64)
    every = cases(*size, dtype, device)
    wanted = [c for c in args.cases.split(",") if c]
    unknown = [c for c in wanted if c not in every]
    if unknown:
        ap.error(f"--cases: unknown {unknown}; expected some of {list(every)}")
    print(f"{device} {torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}, {dtype}, "
          f"B, H, T, D = {size}, torch {torch.__version__}")
    with torch.no_grad():
        for name in wanted:
            ours, base = every[name]
            for fn in (ours, base):  # warm: compiled, cached masks, allocator
                for _ in range(5):
                    fn()
            timing = {who: min(host_and_device(fn, device, args.calls) for _ in range(3))
                      for who, fn in (("qkv", ours), ("baseline", base))}
            print(f"\n### {name}: host us/call (issued, not waited for) and with the device: " + ", ".join(
                f"{who} {h:.1f} / {w:.1f}" for who, (h, w) in timing.items()))
            profile(f"{name}, qkv", ours, device, args.calls, args.rows)
            profile(f"{name}, baseline", base, device, args.calls, args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
