"""Score and mask modifiers: qkv's fused FlexAttention path vs SDPA with the bias or mask materialised.

    python benchmarks/mods.py --threads 2                  # B=4, H=8, D=64, T=1024 and 4096
    python benchmarks/mods.py --seq 512 --quick            # a smoke test
    python benchmarks/mods.py --device cuda                # on a GPU
    python benchmarks/mods.py --keep-memory                # freed memory kept for reuse, as the qkv command does

Rows (inference, float32): ALiBi + causal, and a causal sliding window of 256 keys:
``qkv.attention(q, k, v, score_mod=..., mask_mod=...)`` (fused, compiled once per signature) against
``F.scaled_dot_product_attention`` given the same bias/mask as a ``(H, T, T)`` tensor (building that tensor not
timed); the ratio is SDPA's time over qkv's (target >= 3x). Then the weights with modifiers (the reference path)
against the fused call without weights, beside the plain path's own weights / no-weights ratio, and qkv with no
modifier against SDPA (target >= 0.9x). Peak memory: the growth of the resident set (CPU) or of
``max_memory_allocated`` (CUDA) while one call runs in a fresh process, after a warm-up call. Compilation: the first
call's time minus a later call's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention import RssPeak, machine, sync, timeit  # noqa: E402
from record import record_flag  # noqa: E402

import qkv  # noqa: E402
from qkv import compiled, mods  # noqa: E402
from qkv.memory import keep_freed_memory  # noqa: E402

WINDOW = 256


def inputs(b, h, t, d, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    return tuple(torch.randn(b, h, t, d, generator=g).to(device) for _ in range(3))


def variants(b, h, t, d, device):
    """name -> zero-argument function, for one size."""
    q, k, v = inputs(b, h, t, d, device)
    i = torch.arange(t, device=device)
    dist = i[:, None] - i[None]
    slopes = mods.alibi_slopes(h).to(device)[:, None, None]
    alibi_bias = (-slopes * dist).masked_fill(dist < 0, float("-inf"))  # (H, T, T): what SDPA needs
    window_mask = (dist >= 0) & (dist < WINDOW)
    alibi, window = mods.alibi(h), mods.sliding_window(WINDOW)
    t5 = mods.relative_position_bias(num_heads=h).to(device)
    with torch.no_grad():
        t5.bias.normal_(generator=torch.Generator(device="cpu").manual_seed(1))
        t5_bias = t5.bias[t5.bucket(-dist)].permute(2, 0, 1)  # (H, T, T)
    docs = (i * 4 // t)  # four packed sequences
    doc_mask = (docs[:, None] == docs[None]) & (dist >= 0)
    prefix_mask = (i[None] < t // 4) | (dist >= 0)
    document, prefix, cap = mods.document(docs), mods.prefix_lm(t // 4), mods.softcap(20.0)
    more = {
        "t5_qkv": lambda: qkv.attention(q, k, v, score_mod=t5),
        "t5_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=t5_bias),
        "softcap_qkv": lambda: qkv.attention(q, k, v, score_mod=cap, mask_mod=mods.causal),
        "softcap_ref": lambda: qkv.attention(q, k, v, score_mod=cap, mask_mod=mods.causal, impl="reference"),
        "document_qkv": lambda: qkv.attention(q, k, v, mask_mod=mods.and_masks(mods.causal, document)),
        "document_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=doc_mask),
        "prefix_qkv": lambda: qkv.attention(q, k, v, mask_mod=prefix),
        "prefix_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_mask),
    }
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def train(fn):
        def run():
            with torch.enable_grad():
                torch.autograd.grad(fn().sum(), (qg, kg, vg))
        return run

    training = {
        "train_qkv": train(lambda: qkv.attention(qg, kg, vg, score_mod=alibi, mask_mod=mods.causal)),
        "train_sdpa": train(lambda: F.scaled_dot_product_attention(qg, kg, vg, attn_mask=alibi_bias)),
    }
    return {**more, **training, **{
        "alibi_qkv": lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal),
        "alibi_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=alibi_bias),
        "alibi_weights": lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal, return_weights=True),
        "alibi_reference": lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal, impl="reference"),
        "window_qkv": lambda: qkv.attention(q, k, v, mask_mod=window),
        "window_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask),
        "plain_qkv": lambda: qkv.attention(q, k, v),
        "plain_sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "plain_weights": lambda: qkv.attention(q, k, v, return_weights=True),
    }}


def child(name: str, b, h, t, d, device_name: str) -> dict:
    device = torch.device(device_name)
    fn = variants(b, h, t, d, device)[name]
    t0 = time.perf_counter()
    with torch.no_grad():
        fn()
        sync(device)
        first = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with RssPeak() as rss:
            fn()
            sync(device)
        again = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else rss.bytes
    return {"first": first, "again": again, "peak": max(peak, 0)}


def row(t: int, times: dict, mem: dict, what: str, a: str, ref: str, cost: bool = False) -> float:
    """One table row: ``a`` against ``ref`` (speed-up = ref / a; with ``cost``, a / ref); returns the ratio."""
    ratio = times[a] / times[ref] if cost else times[ref] / times[a]

    def peak(n):
        return f"{mem[n]['peak'] / 2**20:.0f} MiB" if n in mem else "-"

    compile_s = f"{mem[a]['first'] - mem[a]['again']:.1f} s" if a in mem and a.endswith("_qkv") else "-"
    print(f"| {t} | {what} | {1e3 * times[a]:.1f} ms | {1e3 * times[ref]:.1f} ms | {ratio:.2f}x | {peak(a)} | "
          f"{peak(ref)} | {compile_s} |")
    if a in mem and ref in mem:
        what += f" (peak {peak(a)} against {peak(ref)})"
    FOUND.append((t, a, what, ratio, "time" if cost else "speed"))
    return ratio


FOUND: list[tuple] = []  # (T, variant, what, ratio, unit) of every row printed, for --record
KEYS = {"alibi_qkv": "alibi-{t}", "window_qkv": "window-{t}", "plain_qkv": "plain-{t}", "alibi_weights": "weights",
        "alibi_reference": "reference", "plain_weights": "plain-weights", "train_qkv": "training", "t5_qkv": "t5",
        "softcap_qkv": "softcap", "document_qkv": "documents", "prefix_qkv": "prefix"}


def record_results(args) -> None:
    """The rows into benchmarks/results/mods.json: the keys of the file, T=1024 unless the key names T."""
    from record import measurement, record

    threads = f"-{args.threads}t" if args.threads and args.threads != 1 else ""
    items = []
    for t, a, what, ratio, unit in FOUND:
        key = KEYS[a].format(t=t)
        key += "" if "{t}" in KEYS[a] or t == 1024 else f"-{t}"
        key += "-kept" if args.keep_memory else ""
        items.append(measurement(key + threads, f"{what}, T={t}", ratio, unit, figure=f"{ratio:.2f}x"))
    record("mods", items)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="2 repetitions and no memory rows: a smoke test")
    ap.add_argument("--more", action="store_true", help="only the rows of the other modifiers (T5 bias, soft-capping,"
                    " documents, prefix LM), times only")
    ap.add_argument("--training", action="store_true", help="only forward + backward with ALiBi + causal: qkv (on the "
                    "CPU, blocks of query rows, checkpointed) vs SDPA + (H, T, T) bias, times and peaks")
    ap.add_argument("--keep-memory", action="store_true", help="keep freed CPU memory for reuse "
                    "(qkv.memory.keep_freed_memory, as the qkv command does): no fresh pages for the weights per call")
    record_flag(ap, "mods")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.keep_memory and not keep_freed_memory():
        raise SystemExit("--keep-memory: keep_freed_memory is not available here (not glibc)")
    compiled.set_compile(True)  # the fused kernels measured warm (compiled during the warm-up call)
    if args.threads:
        torch.set_num_threads(args.threads)
    b, h, d = args.batch, args.heads, args.head_dim
    if args.child:
        name, t = args.child
        print(json.dumps(child(name, b, h, int(t), d, args.device)))
        return 0
    device = torch.device(args.device)
    print("### Score and mask modifiers: fused (FlexAttention) vs SDPA with the bias/mask materialised\n")
    print(f"Machine: {machine(device)}.  ")
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    kept = ", freed memory kept for reuse (`--keep-memory`)" if args.keep_memory else ""
    print(f"B={b}, H={h}, D={d}, float32, inference; sliding window of {WINDOW} keys{kept}.\n")
    print("| T | what | qkv | reference | ratio | qkv peak | reference peak | qkv compile |")
    print("|---|---|---|---|---|---|---|---|")
    for t in args.seq:
        fns = variants(b, h, t, d, device)
        if args.training:
            fns = {n: f for n, f in fns.items() if n.startswith("train_")}
            times = timeit(fns, device, 2 if args.quick else args.reps)
            mem = {}
            if not args.quick:
                for name in fns:
                    cmd = [sys.executable, __file__, "--child", name, str(t), "--batch", str(b), "--heads", str(h),
                           "--head-dim", str(d), "--device", args.device] + (["--threads", str(args.threads)]
                                                                            if args.threads else []) + (
                        ["--keep-memory"] if args.keep_memory else [])
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    mem[name] = json.loads(out.stdout.strip().splitlines()[-1])
            row(t, times, mem, "training (fwd+bwd), ALiBi + causal: qkv vs SDPA + (H, T, T) bias (speed-up)",
                "train_qkv", "train_sdpa")
            continue
        if args.more:
            fns = {n: f for n, f in fns.items() if n.split("_")[0] in ("t5", "softcap", "document", "prefix")}
            with torch.no_grad():
                times = timeit(fns, device, args.reps)
            row(t, times, {}, "T5 bias (bidirectional) vs SDPA + (H, T, T) bias", "t5_qkv", "t5_sdpa")
            row(t, times, {}, "soft-capping + causal vs qkv's reference path (SDPA cannot)", "softcap_qkv",
                "softcap_ref")
            row(t, times, {}, "4 packed documents, causal, vs SDPA + (T, T) mask", "document_qkv", "document_sdpa")
            row(t, times, {}, "prefix LM (prefix T/4) vs SDPA + (T, T) mask", "prefix_qkv", "prefix_sdpa")
            continue
        with torch.no_grad():
            times = timeit(fns, device, 2 if args.quick else args.reps)
        mem = {}
        if not args.quick:
            for name in ("alibi_qkv", "alibi_sdpa", "window_qkv", "window_sdpa", "alibi_weights"):
                cmd = [sys.executable, __file__, "--child", name, str(t), "--batch", str(b), "--heads", str(h),
                       "--head-dim", str(d), "--device", args.device] + (["--threads", str(args.threads)]
                                                                        if args.threads else []) + (
                    ["--keep-memory"] if args.keep_memory else [])
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                mem[name] = json.loads(out.stdout.strip().splitlines()[-1])

        row(t, times, mem, "ALiBi + causal: qkv fused vs SDPA + (H, T, T) bias (speed-up)", "alibi_qkv", "alibi_sdpa")
        row(t, times, mem, "sliding window: qkv fused vs SDPA + (T, T) mask (speed-up)", "window_qkv", "window_sdpa")
        row(t, times, mem, "ALiBi + causal with weights vs fused without (cost)", "alibi_weights", "alibi_qkv",
            cost=True)
        row(t, times, mem, "ALiBi + causal, impl=reference (blocks of rows) vs fused (cost)", "alibi_reference",
            "alibi_qkv", cost=True)
        row(t, times, mem, "no modifier, with weights vs without (cost; plain path)", "plain_weights", "plain_qkv",
            cost=True)
        row(t, times, mem, "no modifier: qkv vs SDPA (speed)", "plain_qkv", "plain_sdpa")
    if args.record and not args.quick:
        record_results(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
