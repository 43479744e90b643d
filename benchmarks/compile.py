"""The additive kernel and qkv's compilation rule on the CPU, as ratios measured side by side in one run.

    python benchmarks/compile.py                 # B=8, T=512, hidden 256 (a few minutes on 2 cores)
    python benchmarks/compile.py --quick         # small sizes: a check of the script
    python benchmarks/compile.py --first-call    # also fresh processes: the first call, cold and warm cache

Rows:

1. warm, in one process: ``qkv.attention(q, k, v, score=Additive(64, 64, 256))`` with the compiled fused kernel
   (``QKV_COMPILE=1``, compiled before timing) and with the eager tiles (``QKV_COMPILE=0``), against the textbook
   formula ``softmax(w^T tanh(W_q q + W_k k)) @ v`` that materialises ``(B, Tq, Tk, hidden)``; inference
   (``torch.no_grad``) and training (forward + backward); goal: >= 14x the textbook's speed;
2. ``--first-call``: the first call of a fresh process, ``QKV_COMPILE=auto`` (the default) and ``0`` (eager), and
   ``1`` with an empty and with a warm inductor cache; goal: ``auto`` <= 1.1x the eager first call.

Times are medians of interleaved repetitions (a fresh process for each first call).
"""

# ruff: noqa: B023 - the timed closures run within their loop iteration

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import record_flag  # noqa: E402 - benchmarks/ is the script's own folder

import qkv  # noqa: E402
from qkv import compiled  # noqa: E402
from qkv.scores import Additive  # noqa: E402


def setup(b, t, hidden, d, grad):
    torch.manual_seed(0)
    sc = Additive(d, d, hidden)
    q, k, v = (torch.randn(b, t, d).requires_grad_(grad) for _ in range(3))
    return sc, q, k, v


def textbook(sc, q, k, v):
    return torch.softmax(sc.reference(q, k), dim=-1) @ v


def warm_rows(b, t, hidden, d, reps) -> dict:
    out = {}
    for train in (False, True):
        sc, q, k, v = setup(b, t, hidden, d, train)
        params = [q, k, v, *sc.parameters()]

        def run(fn, mode):
            def call():
                compiled.set_compile(mode)
                with torch.set_grad_enabled(train):
                    o = fn(sc, q, k, v) if fn is textbook else qkv.attention(q, k, v, score=sc)
                    if train:
                        torch.autograd.grad(o.sum(), params)
            return call

        fns = {"compiled": run(None, "1"), "eager tiles": run(None, "0"), "textbook": run(textbook, "0")}
        for fn in fns.values():
            fn()  # warm-up (the compilation)
        times = {name: [] for name in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        out["training" if train else "inference"] = {n: statistics.median(ts) for n, ts in times.items()}
    compiled.set_compile(None)
    return out


CHILD = """
import sys, time, torch
sys.path.insert(0, {root!r})
import qkv
from qkv.scores import Additive
torch.manual_seed(0)
sc = Additive({d}, {d}, {hidden})
q, k, v = (torch.randn({b}, {t}, {d}) for _ in range(3))
t0 = time.perf_counter()
with torch.no_grad():
    qkv.attention(q, k, v, score=sc)
print(time.perf_counter() - t0)
"""


def first_call(mode: str, cache: str, b, t, hidden, d) -> float:
    env = {**os.environ, "QKV_COMPILE": mode, "TORCHINDUCTOR_CACHE_DIR": cache, "QKV_CACHE_DIR": cache}
    code = CHILD.format(root=str(ROOT), b=b, t=t, hidden=hidden, d=d)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--first-call", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    record_flag(parser, "compile")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    b, t, hidden, d = (2, 128, 64, 16) if args.quick else (8, 512, 256, 64)
    print(f"{datetime.date.today()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"B={b} T={t} hidden={hidden} D={d}", flush=True)
    res = {"warm": warm_rows(b, t, hidden, d, args.reps)}
    for phase, ts in res["warm"].items():
        print(f"| additive, {phase} | textbook {ts['textbook']:.3f} s | eager tiles {ts['eager tiles']:.3f} s "
              f"({ts['textbook'] / ts['eager tiles']:.1f}x) | compiled {ts['compiled']:.3f} s "
              f"({ts['textbook'] / ts['compiled']:.1f}x) |", flush=True)
    if args.first_call:
        with tempfile.TemporaryDirectory() as cold:
            first = {"0": first_call("0", cold, b, t, hidden, d), "auto": first_call("auto", cold, b, t, hidden, d),
                     "1 (empty cache)": first_call("1", cold, b, t, hidden, d),
                     "1 (warm cache)": first_call("1", cold, b, t, hidden, d)}
        res["first"] = first
        print("| first call, fresh process | " + " | ".join(
            f"QKV_COMPILE={m}: {s:.2f} s ({s / first['0']:.2f}x eager)" for m, s in first.items()) + " |")
    print(json.dumps(res))
    if args.record and not args.quick:
        record_results(res, torch.get_num_threads())
    return 0


def record_results(res: dict, threads: int) -> None:
    from record import measurement, record

    suffix = "" if threads == 2 else f"-{threads}t"
    items = []
    for phase, ts in res["warm"].items():
        key = "additive-" + phase
        what = "additive score, compiled, " + ("inference" if phase == "inference" else "training (forward + backward)")
        ratio = ts["textbook"] / ts["compiled"]
        items.append(measurement(key + suffix, f"{what} vs the textbook formula, {threads} thread(s)", ratio, "speed",
                                 figure=f"{ratio:.1f}x"))
    if "first" in res:
        first = res["first"]
        items.append(measurement("first-call", None, first["auto"] / first["0"], "time",
                                 figure=f"{first['auto'] / first['0']:.2f}x"))
        cold = first["1 (empty cache)"]
        items.append(measurement("first-call-compile", f"first call, `QKV_COMPILE=1`, empty inductor cache (warm "
                                 f"cache: {first['1 (warm cache)']:.1f} s; eager {first['0']:.2f} s)", cold,
                                 figure=f"{cold:.1f} s"))
    record("compile", items, threads=threads)


if __name__ == "__main__":
    sys.exit(main())
