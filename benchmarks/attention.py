"""Speed and memory of qkv's attention paths, measured in one run as ratios.

    python benchmarks/attention.py                      # print the table
    python benchmarks/attention.py --record              # and update benchmarks/results/attention.json
    python benchmarks/attention.py --quick               # small sizes, a smoke test
    python benchmarks/attention.py --dot-only --seq 512  # only the scaled-dot-product rows (default allocator)
    python benchmarks/attention.py --additive-only       # only the additive-score rows

Rows:
1. qkv's scaled_dot fast path vs ``F.scaled_dot_product_attention`` (target: >= 0.95x its speed);
2. qkv with weights vs without (target: <= 1.5x the time), beside ``nn.MultiheadAttention``'s own ratio;
3. the additive score, tiled (online softmax in inference; in training, checkpointed eager tiles or compiled
   fused tiles) vs the textbook formula that materialises ``(B, Tq, Tk, hidden)``: time and peak memory (target:
   <= 1/8 of the naive peak, at least as fast); the compiled fused tiles (``qkv.compiled``) vs the eager tiles
   (``QKV_COMPILE=0``) at the same tile bound (target: >= 2x in inference).

Times are medians of interleaved repetitions. Peak memory on CPU is the growth of the resident set
(sampled every millisecond) while one variant runs alone in a fresh subprocess; on CUDA, the growth of
``max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import record_flag  # noqa: E402

import qkv  # noqa: E402
from qkv.memory import can_keep_freed_memory, keep_freed_memory  # noqa: E402
from qkv.scores import Additive  # noqa: E402

BEGIN, END = "<!-- benchmarks/attention.py:begin -->", "<!-- benchmarks/attention.py:end -->"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timeit(fns: dict, device, reps: int) -> dict[str, float]:
    """Median seconds per call of each function, the calls interleaved so that load hits all alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def dot_rows(args, device):
    b, h, t, d = args.batch, args.heads, args.seq, args.head_dim
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device=device, generator=g) for _ in range(3))
    mask = torch.rand(b, 1, 1, t, device=device, generator=g) > 0.1  # key padding
    e = h * d
    mha = torch.nn.MultiheadAttention(e, h, batch_first=True).to(device).eval()
    ours = qkv.MultiHeadAttention.from_torch(mha).eval()
    x = torch.randn(b, t, e, device=device, generator=g)
    with torch.inference_mode():
        fns = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
            "qkv": lambda: qkv.attention(q, k, v),
            "qkv_weights": lambda: qkv.attention(q, k, v, return_weights=True),
            "sdpa_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "qkv_mask": lambda: qkv.attention(q, k, v, mask=mask),
            "qkv_mask_weights": lambda: qkv.attention(q, k, v, mask=mask, return_weights=True),
            "torch_mha": lambda: mha(x, x, x, need_weights=False),
            "torch_mha_weights": lambda: mha(x, x, x, need_weights=True),
            "qkv_mha": lambda: ours(x),
            "qkv_mha_weights": lambda: ours(x, return_weights=True),
        }
        return timeit(fns, device, args.reps)


def dot_rows_in_child(args, huge_pages: bool, keep_memory: bool = False) -> dict:
    """:func:`dot_rows` in a fresh process, with PyTorch's transparent-huge-page CPU allocator on or off, and
    with or without :func:`qkv.memory.keep_freed_memory`.

    ``THP_MEM_ALLOC_ENABLE=1`` (read by PyTorch's CPU allocator when the process starts) backs large tensors
    with 2 MiB pages, so a fresh 256 MiB weights tensor costs ~100 page faults instead of ~65,000; with the
    freed memory kept, the next weights tensor reuses pages that are already there.
    """
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE="1" if huge_pages else "0")
    cmd = [sys.executable, __file__, "--dot-child", "--device", args.device, "--batch", str(args.batch),
           "--heads", str(args.heads), "--seq", str(args.seq), "--head-dim", str(args.head_dim),
           "--reps", str(args.reps)] + (["--keep-memory"] if keep_memory else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- additive, memory

def _additive_inputs(cfg, device):
    torch.manual_seed(0)
    b, t, dim, hidden = cfg["batch"], cfg["seq"], cfg["dim"], cfg["hidden"]
    score = Additive(dim, dim, hidden).to(device)
    q, k, v = (torch.randn(b, t, dim, device=device) for _ in range(3))
    return score, q, k, v


def naive_additive(score, q, k, v):
    """The textbook formula: the whole (B, Tq, Tk, hidden) tensor at once."""
    h = score.query_proj(q)[:, :, None, :] + score.key_proj(k)[:, None, :, :]
    s = (torch.tanh(h) @ score.v.weight[0])
    return torch.softmax(s, dim=-1) @ v


class RssPeak:
    """Peak resident memory above the level at entry, sampled every millisecond from /proc (Linux)."""

    def __enter__(self):
        import threading

        self.page = __import__("os").sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while not self.stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self._rss())
        self.bytes = self.peak - self.base


def run_one(variant: str, cfg: dict, device_name: str) -> dict:
    """Run one variant once (after a warm-up on tiny inputs) and report its time and peak memory."""
    device = torch.device(device_name)
    train = cfg["train"]

    def step(score, q, k, v):
        with torch.set_grad_enabled(train):
            out = naive_additive(score, q, k, v) if variant == "naive" else qkv.attention(q, k, v, score=score)
            if train:
                out.square().sum().backward()
        return out

    # the tiles without the compiled kernel, or the compiled kernel from its first call (not after it pays)
    os.environ["QKV_COMPILE"] = "0" if variant == "eager" else "1"
    # warm-up: first-call costs are not what is measured; the compiled kernel compiles at the full size
    warm = cfg if variant == "tiled" else dict(cfg, batch=1, seq=16)
    score, q, k, v = _additive_inputs(warm, device)
    t0 = time.perf_counter()
    step(score, *(t.requires_grad_(train) for t in (q, k, v)))
    first = time.perf_counter() - t0
    score, q, k, v = _additive_inputs(cfg, device)
    q, k, v = (t.requires_grad_(train) for t in (q, k, v))
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with RssPeak() as rss:
        step(score, q, k, v)
        sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else rss.bytes
    return {"seconds": seconds, "peak_bytes": max(peak, 0), "compile": max(first - seconds, 0.0)}


def additive_rows(cfg: dict, device: str, reps: int) -> dict:
    """Each variant in its own subprocess (so peaks don't mix), repeated, interleaved."""
    results = {"naive": [], "eager": [], "tiled": []}
    for _ in range(reps):
        for variant in results:
            out = subprocess.run([sys.executable, __file__, "--child", variant, json.dumps(cfg), device],
                                 capture_output=True, text=True, check=True)
            results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {v: {"seconds": statistics.median(r["seconds"] for r in rs),
                "peak_bytes": statistics.median(r["peak_bytes"] for r in rs),
                "compile": statistics.median(r["compile"] for r in rs)} for v, rs in results.items()}


def allocator_table(r: dict) -> list[str]:
    """The dot-product rows of one allocator setting, as markdown lines."""
    return [
        "| what | time | ratio | target |",
        "|---|---|---|---|",
        f"| `F.scaled_dot_product_attention` | {r['sdpa'] * 1e3:.1f} ms | 1.00 | |",
        f"| `qkv.attention` (fast path) | {r['qkv'] * 1e3:.1f} ms | speed {r['sdpa'] / r['qkv']:.2f}x of SDPA | "
        ">= 0.95x |",
        f"| `qkv.attention(return_weights=True)` | {r['qkv_weights'] * 1e3:.1f} ms | "
        f"{r['qkv_weights'] / r['qkv']:.2f}x the time without weights | <= 1.5x |",
        f"| same, with the mask | {r['qkv_mask_weights'] * 1e3:.1f} ms | "
        f"{r['qkv_mask_weights'] / r['qkv_mask']:.2f}x the time without weights | <= 1.5x |",
        f"| `nn.MultiheadAttention` need_weights=True vs False | "
        f"{r['torch_mha_weights'] * 1e3:.1f} vs {r['torch_mha'] * 1e3:.1f} ms | "
        f"{r['torch_mha_weights'] / r['torch_mha']:.2f}x | (for comparison) |",
        f"| `qkv.MultiHeadAttention` with vs without weights | "
        f"{r['qkv_mha_weights'] * 1e3:.1f} vs {r['qkv_mha'] * 1e3:.1f} ms | "
        f"{r['qkv_mha_weights'] / r['qkv_mha']:.2f}x | <= 1.5x |",
        "",
    ]


def additive_table(title: str, cfg: dict, res: dict) -> list[str]:
    """The additive-score rows: textbook formula, eager tiles, compiled fused tiles."""
    n, e, t = res["naive"], res["eager"], res["tiled"]
    return [
        f"Additive score, {title}: B={cfg['batch']}, Tq=Tk={cfg['seq']}, D={cfg['dim']}, "
        f"hidden={cfg['hidden']}, float32:",
        "",
        "| what | time | peak memory |",
        "|---|---|---|",
        f"| textbook formula, `(B, Tq, Tk, hidden)` materialised | {n['seconds']:.2f} s | {gib(n['peak_bytes'])} |",
        f"| `qkv.attention(score=Additive(...))`, eager tiles (`QKV_COMPILE=0`) | {e['seconds']:.2f} s | "
        f"{gib(e['peak_bytes'])} |",
        f"| `qkv.attention(score=Additive(...))`, compiled fused tiles (compiled once: {t['compile']:.0f} s) | "
        f"{t['seconds']:.2f} s | {gib(t['peak_bytes'])} |",
        f"| compiled / eager tiles | speed {e['seconds'] / t['seconds']:.2f}x (target >= 2x in inference) | "
        f"{t['peak_bytes'] / max(e['peak_bytes'], 1):.2f}x the memory |",
        f"| compiled tiles / textbook | speed {n['seconds'] / t['seconds']:.2f}x (target >= 1x) | "
        f"{t['peak_bytes'] / max(n['peak_bytes'], 1):.3f}x the memory (target <= 0.125x) |",
        "",
    ]


def machine(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
            f"threads, torch {torch.__version__}")


def gib(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the script, not the targets")
    ap.add_argument("--dot-only", action="store_true",
                    help="only the scaled dot product rows, default allocator: a quick check of the fast path's ratio")
    ap.add_argument("--additive-only", action="store_true", help="only the additive-score rows")
    record_flag(ap, "attention")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--dot-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--keep-memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dot_child:
        if args.keep_memory and not keep_freed_memory():
            raise SystemExit("keep_freed_memory is not available here (not glibc)")
        print(json.dumps(dot_rows(args, torch.device(args.device))))
        return
    if args.child:
        variant, cfg, device = args.child
        print(json.dumps(run_one(variant, json.loads(cfg), device)))
        return
    if args.quick:
        args.batch, args.heads, args.seq, args.reps = 2, 2, 128, 3
    device = torch.device(args.device)
    add_infer = {"batch": 8, "seq": 1024, "dim": 64, "hidden": 256, "train": False}
    add_train = {"batch": 2, "seq": 512, "dim": 64, "hidden": 128, "train": True}
    if args.quick:
        add_infer = {"batch": 2, "seq": 128, "dim": 16, "hidden": 32, "train": False}
        add_train = {"batch": 2, "seq": 64, "dim": 16, "hidden": 32, "train": True}

    if args.additive_only:
        reps = 1 if args.quick else 3
        print(f"{machine(device)}. Command: `python benchmarks/attention.py {' '.join(sys.argv[1:])}`\n")
        for title, cfg in (("inference", add_infer), ("training", add_train)):
            print("\n".join(additive_table(title, cfg, additive_rows(cfg, args.device, reps))))
        return
    dot = dot_rows_in_child(args, huge_pages=False)
    if args.dot_only:
        print(f"B={args.batch}, H={args.heads}, T={args.seq}, D={args.head_dim}, float32, {machine(device)}")
        print("\n".join(allocator_table(dot)))
        print(f"qkv.attention with a key padding mask: speed {dot['sdpa_mask'] / dot['qkv_mask']:.2f}x of SDPA "
              f"with the same mask ({dot['qkv_mask'] * 1e3:.1f} vs {dot['sdpa_mask'] * 1e3:.1f} ms)")
        return
    thp = dot_rows_in_child(args, huge_pages=True) if device.type == "cpu" else None
    kept = (dot_rows_in_child(args, huge_pages=False, keep_memory=True)
            if device.type == "cpu" and can_keep_freed_memory() else None)
    reps = 1 if args.quick else 3
    infer = additive_rows(add_infer, args.device, reps)
    train = additive_rows(add_train, args.device, reps)

    shape = f"B={args.batch}, H={args.heads}, T={args.seq}, D={args.head_dim}, float32"
    lines = [
        BEGIN,
        "### Attention core (`benchmarks/attention.py`)",
        "",
        f"Machine: {machine(device)}. Command: `python benchmarks/attention.py{' --quick' if args.quick else ''}"
        f"{' --device ' + args.device if args.device != 'cpu' else ''}`. "
        "Times are medians of interleaved repetitions in one run; ratios are what the targets are about.",
        "",
        f"Scaled dot product, {shape}, inference:",
        "",
        "| what | time | ratio | target |",
        "|---|---|---|---|",
        f"| `F.scaled_dot_product_attention` | {dot['sdpa'] * 1e3:.1f} ms | 1.00 | |",
        f"| `qkv.attention` (fast path) | {dot['qkv'] * 1e3:.1f} ms | speed {dot['sdpa'] / dot['qkv']:.2f}x of SDPA | "
        ">= 0.95x |",
        f"| `qkv.attention`, key padding mask | {dot['qkv_mask'] * 1e3:.1f} ms | speed "
        f"{dot['sdpa_mask'] / dot['qkv_mask']:.2f}x of SDPA with the same mask | >= 0.95x |",
        f"| `qkv.attention(return_weights=True)` | {dot['qkv_weights'] * 1e3:.1f} ms | "
        f"{dot['qkv_weights'] / dot['qkv']:.2f}x the time without weights | <= 1.5x |",
        f"| same, with the mask | {dot['qkv_mask_weights'] * 1e3:.1f} ms | "
        f"{dot['qkv_mask_weights'] / dot['qkv_mask']:.2f}x the time without weights | <= 1.5x |",
        f"| `nn.MultiheadAttention` need_weights=True vs False (E={args.heads * args.head_dim}) | "
        f"{dot['torch_mha_weights'] * 1e3:.1f} vs {dot['torch_mha'] * 1e3:.1f} ms | "
        f"{dot['torch_mha_weights'] / dot['torch_mha']:.2f}x | (for comparison) |",
        f"| `qkv.MultiHeadAttention` with vs without weights (same weights) | "
        f"{dot['qkv_mha_weights'] * 1e3:.1f} vs {dot['qkv_mha'] * 1e3:.1f} ms | "
        f"{dot['qkv_mha_weights'] / dot['qkv_mha']:.2f}x | <= 1.5x |",
        "",
    ]
    for res, intro in (
        (thp, "The same, in a process started with `THP_MEM_ALLOC_ENABLE=1` (PyTorch's CPU allocator backs large "
              "tensors with transparent huge pages, so the fresh weights tensor is not page-faulted in 4 KiB at a "
              "time):"),
        (kept, "The same, in a process that called `qkv.memory.keep_freed_memory()` (as the `qkv` command does: "
               "glibc keeps freed memory for the next allocation, so the weights tensor of the next call reuses "
               "pages that are already mapped):"),
    ):
        if res is not None:
            lines += [intro, ""] + allocator_table(res)
    for title, cfg, res in (("inference (online softmax over key tiles)", add_infer, infer),
                            ("training, forward + backward", add_train, train)):
        lines += additive_table(title, cfg, res)
    lines.append(END)
    print("\n".join(lines))
    if args.record and not args.quick:
        record_results(args, dot, thp, kept, infer, train)


def record_results(args, dot, thp, kept, infer, train):
    """The figures of a full run into benchmarks/results/attention.json (and the compiled tiles' memory in
    training into compile.json)."""
    from record import measurement, record

    m = measurement
    rows = [
        m("fast", "`qkv.attention` (fast path) vs `F.scaled_dot_product_attention`", dot["sdpa"] / dot["qkv"],
          "speed", figure=f"{dot['sdpa'] / dot['qkv']:.2f}x"),
        m("padding", "the same, key padding mask, vs SDPA with the same mask", dot["sdpa_mask"] / dot["qkv_mask"],
          "speed", figure=f"{dot['sdpa_mask'] / dot['qkv_mask']:.2f}x"),
    ]

    def weights(suffix, res):
        return [m(f"weights{suffix}", None, res["qkv_weights"] / res["qkv"], "time",
                  figure=f"{res['qkv_weights'] / res['qkv']:.2f}x"),
                m(f"mha-weights{suffix}", None, res["qkv_mha_weights"] / res["qkv_mha"], "time",
                  figure=f"{res['qkv_mha_weights'] / res['qkv_mha']:.2f}x")]

    rows += weights("", dot)
    rows.append(m("weights-mask", None, dot["qkv_mask_weights"] / dot["qkv_mask"], "time",
                  figure=f"{dot['qkv_mask_weights'] / dot['qkv_mask']:.2f}x"))
    rows.append(m("torch-mha-weights", None, dot["torch_mha_weights"] / dot["torch_mha"], "time",
                  figure=f"{dot['torch_mha_weights'] / dot['torch_mha']:.2f}x"))
    if thp is not None:
        rows.append(weights("-thp", thp)[0])
    if kept is not None:
        rows += weights("-kept", kept)
        rows.append(m("weights-kept-mask", None, kept["qkv_mask_weights"] / kept["qkv_mask"], "time",
                      figure=f"{kept['qkv_mask_weights'] / kept['qkv_mask']:.2f}x"))
    for key, res in (("additive", infer), ("additive-train", train)):
        n, e = res["naive"], res["eager"]
        rows.append(m(f"{key}-memory", None, e["peak_bytes"] / max(n["peak_bytes"], 1),
                      f"memory ({gib(e['peak_bytes'])} against {gib(n['peak_bytes'])})",
                      figure=f"{e['peak_bytes'] / max(n['peak_bytes'], 1):.3f}x"))
        rows.append(m(f"{key}-time", None, e["seconds"] / n["seconds"], "time",
                      figure=f"{e['seconds'] / n['seconds']:.2f}x"))
    record("attention", rows, device=args.device)
    n, t = train["naive"], train["tiled"]
    record("compile", [m("additive-training-memory", None, t["peak_bytes"] / max(n["peak_bytes"], 1),
                         "memory", figure=f"{t['peak_bytes'] / max(n['peak_bytes'], 1):.3f}x")], device=args.device)


if __name__ == "__main__":
    main()
