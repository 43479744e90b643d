"""qkv's attention on one GPU against PyTorch's own kernels: one run of a few minutes, one markdown table.

    python benchmarks/gpu.py --out gpu.md             # on a CUDA GPU (about 3-5 minutes on an H100)
    python benchmarks/gpu.py --device cpu --quick     # small sizes on the CPU: checks the script itself

Rows (bfloat16 and float32; forward, and forward + backward), each a ratio of two callables timed side by side:

- the fast path: ``qkv.attention(q, k, v)`` vs ``F.scaled_dot_product_attention`` (flash backend where it runs:
  bfloat16 on CUDA; PyTorch's choice otherwise); goal: qkv's speed >= 0.95x;
- the key-padding path: the same with a ``(B, 1, 1, T)`` boolean mask on both; goal >= 0.95x; and with
  ``qkv.set_zero_unseen_keys(False)`` (no copies of the keys and values to keep NaN in padding out);
- weights: ``return_weights=True`` vs the same call without; goal: <= 1.3x the time;
- modifiers (ALiBi + causal): qkv vs FlexAttention compiled directly (goal: qkv's speed >= 0.9x), and vs SDPA with
  the bias materialised once per shape (``(B, H, T, T)``);
- the additive score (B=8, T=512, hidden 256: the fused compiled kernel on the CPU, the eager tiles on a GPU) vs
  the textbook ``(B, Tq, Tk, hidden)`` formula (goal >= 14x on the CPU);
- Hugging Face: a tiny random ``LlamaConfig`` model (4 layers, hidden 256, 8 heads, T=512) on
  ``attn_implementation="qkv"`` vs ``"sdpa"`` and ``"eager"``.

Times are medians of interleaved repetitions after warm-up (compilation excluded), CUDA-synchronised every 5
calls. Each section
catches its own errors (a row says what failed) and the table is written after every section, so a run cut short
still leaves what it measured.
"""

# ruff: noqa: B023 - the timed lambdas run within their loop iteration

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import qkv  # noqa: E402
from qkv import compiled, mods  # noqa: E402
from qkv.paths.common import zeroing_unseen_keys  # noqa: E402
from qkv.scores import Additive  # noqa: E402

ROWS: list[tuple] = []  # (section, case, dtype, pass, qkv ms, baseline name, baseline ms, ratio text, goal, met)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fns: dict, device: torch.device, reps: int, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds per call of each function, interleaved. On a GPU each sample is 5 calls in a row between
    synchronisations, as in a model (the Python work of a call overlaps the GPU work of the previous one)."""
    inner = 5 if device.type == "cuda" else 1
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            sync(device)
            times[name].append((time.perf_counter() - t0) / inner)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def step(fn, params, backward: bool):
    """A callable running ``fn()`` (and a backward through it when ``backward``)."""
    def run():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        if backward:
            torch.autograd.grad(out.float().sum(), params)
    return run


def record(section: str, case: str, dtype, backward: bool, ms: dict, ours: str, base: str, *, speed: bool,
           goal: float | None) -> None:
    """A row: ``speed`` (baseline time / ours, goal a minimum) or time ratio (ours / baseline, goal a maximum)."""
    ratio = ms[base] / ms[ours] if speed else ms[ours] / ms[base]
    met = None if goal is None else (ratio >= goal if speed else ratio <= goal)
    text = f"{ratio:.2f}x {'speed' if speed else 'time'}"
    goal_text = "" if goal is None else f"{'>=' if speed else '<='} {goal}x"
    ROWS.append((section, case, str(dtype).replace("torch.", ""), "fwd+bwd" if backward else "fwd", ms[ours], base,
                 ms[base], text, goal_text, met))


def failed(section: str, error: BaseException) -> None:
    line = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:160]
    ROWS.append((section, f"failed: {line}", "", "", float("nan"), "", float("nan"), "", "", None))
    traceback.print_exc()


def randn(*shape, dtype, device, gen, grad=False):
    return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(grad)


def inputs(b, h, t, d, dtype, device, grad, gen):
    return [randn(b, h, t, d, dtype=dtype, device=device, gen=gen, grad=grad) for _ in range(3)]


@contextlib.contextmanager
def flash(device, dtype):
    """SDPA's flash backend where it runs (CUDA, half precision); PyTorch's choice elsewhere."""
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            yield "SDPA flash"
    else:
        yield "SDPA"


def dot_rows(cfg, device, dtype, reps, gen):
    b, h, t, d = cfg["b"], cfg["h"], cfg["t"], cfg["d"]
    for backward in (False, True):
        q, k, v = inputs(b, h, t, d, dtype, device, backward, gen)
        params = [q, k, v]
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx, flash(device, dtype) as base:
            ms = timeit({"qkv": step(lambda: qkv.attention(q, k, v), params, backward),
                         base: step(lambda: F.scaled_dot_product_attention(q, k, v), params, backward)}, device, reps)
        record("fast path", f"B={b} H={h} T={t} D={d}", dtype, backward, ms, "qkv", base, speed=True, goal=0.95)
        lengths = torch.randint(t // 2, t + 1, (b,), generator=gen).to(device)
        pad = (torch.arange(t, device=device)[None] < lengths[:, None])[:, None, None]
        with ctx:
            ms = timeit({"qkv": step(lambda: qkv.attention(q, k, v, mask=pad), params, backward),
                         "SDPA": step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad), params,
                                      backward)}, device, reps)
        record("key padding", f"B={b} H={h} T={t}, lengths T/2..T", dtype, backward, ms, "qkv", "SDPA",
               speed=True, goal=0.95)
        before = zeroing_unseen_keys()
        qkv.set_zero_unseen_keys(False)  # the copies that keep NaN in padding out, skipped (as SDPA does)
        try:
            with ctx:
                ms = timeit({"qkv": step(lambda: qkv.attention(q, k, v, mask=pad), params, backward),
                             "SDPA": step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad), params,
                                          backward)}, device, reps)
        finally:
            qkv.set_zero_unseen_keys(before)
        record("key padding", f"B={b} H={h} T={t}, set_zero_unseen_keys(False)", dtype, backward, ms, "qkv", "SDPA",
               speed=True, goal=None)
        with ctx:
            ms = timeit({"weights": step(lambda: qkv.attention(q, k, v, return_weights=True), params, backward),
                         "no weights": step(lambda: qkv.attention(q, k, v), params, backward)}, device, reps)
        record("weights", f"B={b} H={h} T={t}", dtype, backward, ms, "weights", "no weights", speed=False, goal=1.3)


def mod_rows(cfg, device, dtype, reps, gen):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, t, d = cfg["b"], cfg["h"], cfg["t"], cfg["d"]
    alibi = mods.alibi(h)
    flex = torch.compile(flex_attention, dynamic=False)
    block = create_block_mask(mods.causal, 1, 1, t, t, device=device)
    rows = torch.arange(t, device=device)
    slopes = mods.alibi_slopes(h).to(device)
    bias = (-(slopes[:, None, None] * (rows[:, None] - rows[None, :]))).masked_fill(rows[None, :] > rows[:, None],
                                                                                   float("-inf"))
    bias = bias[None].expand(b, h, t, t).to(dtype).contiguous()  # materialised once per shape
    for backward in (False, True):
        # FlexAttention on the CPU: float32 inference only
        flex_ok = compiled.mode() != "0" and (device.type == "cuda" or (dtype == torch.float32 and not backward))
        q, k, v = inputs(b, h, t, d, dtype, device, backward, gen)
        params = [q, k, v]
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx:
            fns = {"qkv": step(lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal), params,
                               backward),
                   "SDPA+bias": step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), params,
                                     backward)}
            if flex_ok:
                fns["FlexAttention"] = step(lambda: flex(q, k, v, score_mod=alibi, block_mask=block), params,
                                            backward)
            ms = timeit(fns, device, reps)
        case = f"ALiBi + causal, B={b} H={h} T={t}"
        if flex_ok:
            record("modifiers", case, dtype, backward, ms, "qkv", "FlexAttention", speed=True, goal=0.9)
        record("modifiers", case, dtype, backward, ms, "qkv", "SDPA+bias", speed=True, goal=None)
        if not backward:
            with ctx:
                ms = timeit({"weights": step(lambda: qkv.attention(q, k, v, score_mod=alibi, mask_mod=mods.causal,
                                                                     return_weights=True), params, False),
                             "no weights": fns["qkv"]}, device, reps)
            record("modifiers", f"ALiBi + causal, weights, B={b} H={h} T={t}", dtype, False, ms, "weights",
                   "no weights", speed=False, goal=1.3)


def additive_rows(cfg, device, dtype, reps, gen):
    b, t, hidden, d = cfg["ab"], cfg["at"], cfg["hidden"], cfg["d"]
    torch.manual_seed(0)
    sc = Additive(d, d, hidden, device=device, dtype=dtype)

    def textbook(q, k, v):
        return torch.softmax(sc.reference(q, k), dim=-1) @ v

    for backward in (False, True):
        q, k, v = (randn(b, t, d, dtype=dtype, device=device, gen=gen, grad=backward) for _ in range(3))
        params = [q, k, v, *sc.parameters()]
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx:
            ms = timeit({"qkv": step(lambda: qkv.attention(q, k, v, score=sc), params, backward),
                         "textbook": step(lambda: textbook(q, k, v), params, backward)}, device, reps)
        record("additive", f"B={b} T={t} hidden={hidden}", dtype, backward, ms, "qkv", "textbook",
               speed=True, goal=14.0)


def hf_rows(cfg, device, dtype, reps, gen):
    import transformers as tf

    from qkv.integrations.transformers import register

    register()
    config = tf.LlamaConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=8, intermediate_size=512, max_position_embeddings=cfg["hf_t"])
    models = {}
    for impl in ("qkv", "sdpa", "eager"):
        torch.manual_seed(0)
        models[impl] = tf.AutoModelForCausalLM.from_config(config, attn_implementation=impl).to(device, dtype)
    ids = torch.randint(0, 1000, (cfg["hf_b"], cfg["hf_t"]), generator=gen).to(device)
    for backward in (False, True):
        for m in models.values():
            m.train(backward)
        ctx = torch.enable_grad() if backward else torch.no_grad()

        def call(m):
            def run():
                out = m(input_ids=ids).logits
                if backward:
                    out.float().mean().backward()
            return run

        with ctx:
            ms = timeit({impl: call(m) for impl, m in models.items()}, device, reps)
        case = f"Llama 4 layers, hidden 256, B={cfg['hf_b']} T={cfg['hf_t']}"
        record("Hugging Face", case, dtype, backward, ms, "qkv", "sdpa", speed=True, goal=0.95)
        record("Hugging Face", case, dtype, backward, ms, "qkv", "eager", speed=True, goal=None)


SECTIONS = {"dot": dot_rows, "mods": mod_rows, "additive": additive_rows, "hf": hf_rows}


def table(device: torch.device, args, started: float) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    lines = [f"Machine: {name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads; "
             f"{datetime.date.today().isoformat()}; `python benchmarks/gpu.py {' '.join(sys.argv[1:])}` "
             f"({time.time() - started:.0f} s).", "",
             "| section | case | dtype | pass | qkv ms | baseline | baseline ms | ratio | goal | met |",
             "|---|---|---|---|---:|---|---:|---|---|---|"]
    for sec, case, dt, ps, ours, base, bms, ratio, goal, met in ROWS:
        mark = "" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {sec} | {case} | {dt} | {ps} | {ours:.3f} | {base} | {bms:.3f} | {ratio} | {goal} | {mark} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions (a check of the script)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {list(SECTIONS)}")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--compile", default="1", choices=["0", "1", "auto"],
                        help="qkv's compiled kernels (default 1: compiled before the timed calls); 0 also leaves out "
                             "FlexAttention's own compiled baseline")
    parser.add_argument("--size", default=None, metavar="B,H,T",
                        help="batch, heads and length of the dot and modifier rows (default 8,8,1024): a larger size "
                             "shows the kernels where the host's time per call no longer counts")
    parser.add_argument("--out", default=None, help="write the markdown table there (and print it)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; expected some of {list(SECTIONS)}")
    if args.quick:
        cfg = dict(b=2, h=2, t=128, d=16, ab=2, at=64, hidden=32, hf_b=2, hf_t=64)
    else:
        cfg = dict(b=8, h=8, t=1024, d=64, ab=8, at=512, hidden=256, hf_b=8, hf_t=512)
    if args.size:
        try:
            cfg["b"], cfg["h"], cfg["t"] = (int(x) for x in args.size.split(","))
        except ValueError:
            parser.error(f"--size: expected three integers B,H,T, got {args.size!r}")
    reps = args.reps or (2 if args.quick else 10)
    compiled.set_compile(args.compile)  # "1": compiled kernels measured warm (compiled during the warm-up calls)
    ROWS.clear()
    started = time.time()
    gen = torch.Generator().manual_seed(0)
    for dtype in (getattr(torch, n) for n in args.dtypes.split(",")):
        for name in args.sections.split(","):
            try:
                SECTIONS[name](cfg, device, dtype, reps, gen)
            except Exception as e:  # noqa: BLE001 - one section's failure is a row; the others still run
                failed(f"{name} {dtype}", e)
            text = table(device, args, started)
            if args.out:
                Path(args.out).write_text(text)
            print(f"[{time.time() - started:.0f} s] {name} {dtype} done", file=sys.stderr, flush=True)
    print(table(device, args, started))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
