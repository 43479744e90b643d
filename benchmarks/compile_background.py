"""Back-to-back calls in a fresh process with ``QKV_COMPILE=auto``: no call waits for a compilation, and the loop
reaches the compiled speed. Each run is a child process with 2 threads and its own inductor cache folder (empty for
the first run, warm for the second).

    python benchmarks/compile_background.py --what mods --seconds 90      # ALiBi + causal, B=4 H=8 T=1024 D=64
    python benchmarks/compile_background.py --what additive --seconds 90  # Additive, B=8 T=512 D=64 hidden 256
    python benchmarks/compile_background.py --what additive-eager        # QKV_COMPILE=0: the eager tiles only

Printed per run: the eager call's time (the median of three calls made after the loop in the same process with
compilation off, so under the same load; and the median of the first calls, which may already share the CPU with a
compilation), the slowest call against it (goal <= 3x), the median of the last ten calls against the baseline (SDPA
with the bias materialised, goal >= 2.5x its speed; the textbook additive formula, goal >= 14x), the first call that
ran compiled, the paths taken and the load average before and after. ``additive-eager`` times five calls with
compilation off against the textbook formula (goal >= 8x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, logging, os, statistics, sys, time, torch
sys.path.insert(0, {root!r})
load0 = os.getloadavg()[0]
torch.set_num_threads({threads})
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
import qkv
from qkv import mods
torch.manual_seed(0)
if {what!r} == "mods":
    q, k, v = (torch.randn(4, 8, 1024, 64) for _ in range(3))
    kw = dict(score_mod=mods.alibi(8), mask_mod=mods.causal)
    i = torch.arange(1024)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 8) for h in range(8)])[:, None, None]
    bias = (-(i[None, :] - i[:, None]).abs().float())[None] * slopes
    bias = bias.masked_fill(i[None, :] > i[:, None], float("-inf"))
    base = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
else:
    from qkv.scores import Additive
    sc = Additive(64, 64, 256)
    q, k, v = (torch.randn(8, 512, 64) for _ in range(3))
    kw = dict(score=sc)
    base = lambda: torch.softmax(sc.reference(q, k), dim=-1) @ v
times, paths, first = [], [], None
start = time.perf_counter()
with torch.no_grad():
    while time.perf_counter() - start < {seconds}:
        with qkv.trace_paths() as taken:
            t0 = time.perf_counter(); qkv.attention(q, k, v, **kw); times.append(time.perf_counter() - t0)
        paths.append(taken[0])
        if first is None and qkv.plan(q, k, v, **kw).compiled:
            first = len(times)  # the next call runs compiled
    qkv.compiled.set_compile("0")
    eager = []
    for _ in range(3):
        t0 = time.perf_counter(); qkv.attention(q, k, v, **kw); eager.append(time.perf_counter() - t0)
    b = []
    for _ in range(3 if {what!r} == "mods" else 2):
        t0 = time.perf_counter(); base(); b.append(time.perf_counter() - t0)
print(json.dumps(dict(times=times, paths=paths, baseline=statistics.median(b), eager=statistics.median(eager),
                      first=first, load=[load0, os.getloadavg()[0]])))
"""


def child(what: str, seconds: float, cache: str, threads: int = 2) -> dict:
    env = {**os.environ, "QKV_COMPILE": "0" if what == "additive-eager" else "auto", "TORCHINDUCTOR_CACHE_DIR": cache,
           "QKV_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads)}
    code = CHILD.format(root=str(ROOT), what="additive" if what == "additive-eager" else what, seconds=seconds,
                        threads=threads)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    log = [line for line in res.stderr.splitlines() if "qkv:" in line]
    return {**json.loads(res.stdout.strip().splitlines()[-1]), "log": log}


def summary(r: dict) -> str:
    import statistics

    t = r["times"]
    early = statistics.median(t[1:min(len(t), 4)] or t)  # the first calls run eager (the very first warms up)
    eager = r["eager"]
    last = statistics.median(t[-10:])
    return (f"calls {len(t)}, eager call {eager:.3f} s (first calls {early:.3f} s), slowest {max(t):.3f} s "
            f"({max(t) / eager:.2f}x eager) at call {t.index(max(t))}, median of the last ten {last:.4f} s = "
            f"{r['baseline'] / last:.2f}x the baseline ({r['baseline']:.3f} s), eager {r['baseline'] / eager:.2f}x "
            f"the baseline, first compiled call {r['first']}, paths {sorted(set(r['paths']))}, load average "
            f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=["mods", "additive", "additive-eager"], default="mods")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.what == "additive-eager":
        with tempfile.TemporaryDirectory() as cache:
            r = child(args.what, 1e-3, cache, args.threads)  # (the loop makes one call, a warm-up; three follow)
        print(f"additive, QKV_COMPILE=0, {args.threads} threads: eager call {r['eager']:.3f} s, textbook "
              f"{r['baseline']:.3f} s = {r['baseline'] / r['eager']:.2f}x, load average {r['load'][0]:.1f} -> "
              f"{r['load'][1]:.1f}")
        return 0
    with tempfile.TemporaryDirectory() as cache:
        for run in ("empty cache", "warm cache"):
            r = child(args.what, args.seconds, cache, args.threads)
            print(f"{args.what}, {run}: {summary(r)}", flush=True)
            for line in r["log"]:
                print("   ", line)
            print(json.dumps({"run": run, "times": [round(x, 4) for x in r["times"]]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
