"""Hugging Face models on qkv's attention backend: forward time and peak memory against transformers' own.

    python benchmarks/hf.py --threads 1                     # BERT-base and Llama-style, T = 512 and 2048, CPU
    python benchmarks/hf.py --threads 1 --seq 128 --reps 1  # a smoke test
    python benchmarks/hf.py --device cuda                   # on a GPU

Two random 12-layer models made from configs (no download): ``bert`` (BERT-base: hidden 768, 12 heads, FFN 3072)
and ``llama`` (the same widths, grouped-query attention with 4 key/value heads, SwiGLU FFN 2048, rotary positions,
causal). Batch 1, float32, inference (``torch.no_grad``), no padding. For each model and length, one fresh process
runs the two implementations of each pair alternately (so that load from other processes hits both alike):

- with attentions (``output_attentions=True``, every layer's ``(B, H, T, T)`` weights returned): ``qkv`` vs
  ``eager``, the only implementation of ``transformers`` that returns them (target: qkv faster, at the same or a
  lower peak);
- without attentions: ``qkv`` vs ``sdpa`` (target: qkv's speed >= 0.95x sdpa's).

Time: the fastest of ``--reps`` forward passes (default 9 at T <= 512, 5 above; after one warm-up pass on 16
tokens for each implementation): on a shared machine other processes only ever add time, and a median of a few
passes still moved by 2x between runs.
Generation (``--generate N``): a random Llama-style decoder (``--gen-layers`` layers, default 4; hidden 256, 4
heads with 2 key/value heads) generates N tokens greedily from a random prompt of T tokens (``--seq``, default 256,
1024 and 4096) with the KV cache; the time is the fastest of ``--reps`` (default 2) runs of each way, the ways
alternating in one process (side by side); the peak is each way's only run in a fresh process:

- ``eager``: ``generate(output_attentions=True, return_dict_in_generate=True)``, every step's weights returned;
- ``qkv, all``: :func:`qkv.integrations.generation.record_generation`, every layer and head recorded;
- ``qkv, all, recomputed``: the same with the weights recomputed beside the fused path (a second softmax, 256 query
  rows at a time) instead of rebuilt from its log-sum-exp;
- ``qkv, 1 layer``: the same with ``layers=[0]`` (the other layers on the fused path);
- ``qkv, none``: the backend generating with nothing recorded (the floor).

Peak memory: the growth of the process's resident set (RSS, sampled every millisecond from /proc) above its level
before the pass, the largest over the reps (the returned weights included: 2.25 GiB at T = 2048; the pair without
attentions runs first, so that the freed memory of the other cannot hide its peak); on a GPU, the
growth of ``torch.cuda.max_memory_allocated``. The allocator is glibc's default (``qkv.memory.keep_freed_memory``
is not called: a user's Python process has the default).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention import RssPeak, machine, sync  # noqa: E402

MODELS = ("bert", "llama")
PAIRS = {"without attentions": ("qkv", "sdpa"), "with attentions": ("qkv", "eager")}  # run in this order


def build(name: str, impl: str, max_len: int):
    import transformers as tf

    if name == "bert":
        cfg = tf.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                            max_position_embeddings=max_len)
        return tf.AutoModel.from_config(cfg, attn_implementation=impl)
    cfg = tf.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                         intermediate_size=2048, max_position_embeddings=max_len, vocab_size=32000)
    return tf.AutoModel.from_config(cfg, attn_implementation=impl)


def measure(name: str, seq: int, reps: int, device: str) -> dict:
    """In this process: ``{pair: {impl: {"s": fastest seconds, "peak": bytes}}}`` for one model and length."""
    from qkv.integrations.transformers import register

    register()
    dev = torch.device(device)
    torch.manual_seed(0)
    model = build(name, "qkv", seq).to(dev).eval()
    ids = torch.randint(5, model.config.vocab_size, (1, seq), device=dev)
    out: dict = {}
    with torch.no_grad():
        for pair, impls in PAIRS.items():
            attentions = pair == "with attentions"
            times = {i: [] for i in impls}
            peaks = {i: 0 for i in impls}

            def run(impl, x, attentions=attentions):
                model.set_attn_implementation(impl)
                r = model(input_ids=x, output_attentions=attentions)
                assert (r.attentions is not None) == attentions
                return r

            for impl in impls:
                run(impl, ids[:, :16])
            for rep in range(reps):
                for impl in impls if rep % 2 == 0 else impls[::-1]:  # each goes first as often
                    sync(dev)
                    if dev.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    with RssPeak() as rss:
                        t0 = time.perf_counter()
                        r = run(impl, ids)
                        sync(dev)
                        times[impl].append(time.perf_counter() - t0)
                    grown = torch.cuda.max_memory_allocated() - base if dev.type == "cuda" else rss.bytes
                    peaks[impl] = max(peaks[impl], grown)
                    del r
            out[pair] = {i: {"s": min(times[i]), "peak": peaks[i]} for i in impls}
    return out


GEN_WAYS = ("eager", "qkv, all", "qkv, all, recomputed", "qkv, 1 layer", "qkv, none")


def measure_generation(ways: list[str], seq: int, new: int, layers: int, reps: int) -> dict:
    """In this process: ``{way: {"s": fastest seconds, "peak": bytes}}``: the ways run alternately, each going
    first as often (times side by side); the peak is the first full run's, meaningful when ``ways`` is one way in
    a fresh process (memory freed by glibc stays in the process after a run)."""
    import transformers as tf

    from qkv.integrations import transformers as backend
    from qkv.integrations.generation import record_generation
    from qkv.integrations.transformers import register

    register()
    fused = backend.fused_and_record
    cfg = tf.LlamaConfig(hidden_size=256, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=512, max_position_embeddings=seq + new + 8, vocab_size=8000,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv").eval()
    ids = torch.randint(5, 8000, (1, seq))

    def run(way, x):
        model.set_attn_implementation("eager" if way == "eager" else "qkv")
        if way == "eager":
            out = model.generate(input_ids=x, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 output_attentions=True, return_dict_in_generate=True, pad_token_id=0)
            assert out.attentions is not None
            return out
        if way == "qkv, none":
            return model.generate(input_ids=x, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                  pad_token_id=0)
        backend.fused_and_record = (lambda *a: None) if way == "qkv, all, recomputed" else fused
        rec = record_generation(model, x, max_new_tokens=new, layers=[0] if way == "qkv, 1 layer" else None,
                                min_new_tokens=new)
        assert rec.records
        return rec

    times = {w: [] for w in ways}
    peaks = {w: 0 for w in ways}
    with torch.no_grad():
        for way in ways:
            run(way, ids[:, :16])
        for rep in range(reps):
            for way in ways[rep % len(ways):] + ways[:rep % len(ways)]:
                with RssPeak() as rss:
                    t0 = time.perf_counter()
                    r = run(way, ids)
                    times[way].append(time.perf_counter() - t0)
                peaks[way] = peaks[way] or rss.bytes
                del r
    return {w: {"s": min(times[w]), "peak": peaks[w]} for w in ways}


def generation_table(results: dict, seqs: list[int]) -> list[str]:
    lines = ["| T (prompt) | way | time | speed vs eager | peak memory | peak vs eager |", "|---|---|---|---|---|---|"]
    for seq in seqs:
        e = results[(seq, "eager")]
        for way in GEN_WAYS:
            r = results.get((seq, way))
            if r is None:
                continue
            lines.append(f"| {seq} | {way} | {r['s']:.2f} s | {e['s'] / r['s']:.2f}x | {gib(r['peak'])} | "
                         f"{r['peak'] / max(e['peak'], 1):.2f} |")
    return lines


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def table(results: dict, seqs: list[int]) -> list[str]:
    lines = ["| model | T | pair | qkv | other | qkv speed (other / qkv time) | peak qkv / other |",
             "|---|---|---|---|---|---|---|"]
    for name in MODELS:
        for seq in seqs:
            res = results.get(f"{name}-{seq}")
            if res is None:
                continue
            for pair, (ours, other) in PAIRS.items():
                a, b = res[pair][ours], res[pair][other]
                lines.append(f"| {name} | {seq} | {pair} | {a['s']:.2f} s | {other} {b['s']:.2f} s | "
                             f"{b['s'] / a['s']:.2f}x | {gib(a['peak'])} / {gib(b['peak'])} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--seq", type=int, action="append", help="lengths (default 512 and 2048)")
    ap.add_argument("--model", choices=MODELS, action="append", help="models (default both)")
    ap.add_argument("--reps", type=int, default=None, help="passes of each (default 9 at T <= 512, else 5)")
    ap.add_argument("--generate", type=int, default=None, metavar="N",
                    help="measure generation of N tokens recording the attention (see the docstring)")
    ap.add_argument("--gen-layers", type=int, default=4, help="layers of the generating model")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.generate:
        return generation_main(args)
    if args.child:
        name, seq = args.child.rsplit("-", 1)
        print(json.dumps(measure(name, int(seq), args.reps or (9 if int(seq) <= 512 else 5), args.device)))
        return
    seqs = args.seq or [512, 2048]
    results = {}
    for name in args.model or MODELS:
        for seq in seqs:
            cmd = [sys.executable, __file__, "--child", f"{name}-{seq}", "--device", args.device]
            cmd += (["--threads", str(args.threads)] if args.threads else []) + (
                ["--reps", str(args.reps)] if args.reps else [])
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[f"{name}-{seq}"] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name} T={seq}: {results[f'{name}-{seq}']}", file=sys.stderr)
    import transformers

    reps = args.reps or "9 (T <= 512) or 5"
    print(f"{machine(torch.device(args.device))}, transformers {transformers.__version__}, batch 1, float32, "
          f"fastest of {reps} passes\n")
    print("\n".join(table(results, seqs)))


def generation_main(args) -> None:
    if args.child:
        seq, ways = args.child.split(":", 1)
        print(json.dumps(measure_generation(ways.split("|"), int(seq), args.generate, args.gen_layers,
                                            args.reps or 1)))
        return
    seqs = args.seq or [256, 1024, 4096]
    results = {}

    def child(seq, ways, reps):
        cmd = [sys.executable, __file__, "--generate", str(args.generate), "--gen-layers", str(args.gen_layers),
               "--child", f"{seq}:{'|'.join(ways)}", "--reps", str(reps)] + (
            ["--threads", str(args.threads)] if args.threads else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    for seq in seqs:
        side_by_side = child(seq, list(GEN_WAYS), args.reps or 2)  # times: the ways alternately, one process
        for way in GEN_WAYS:  # peaks: each way alone in a fresh process
            results[(seq, way)] = {"s": side_by_side[way]["s"], "peak": child(seq, [way], 1)[way]["peak"]}
            print(f"T={seq} {way}: {results[(seq, way)]}", file=sys.stderr)
    import transformers

    print(f"{machine(torch.device('cpu'))}, transformers {transformers.__version__}, Llama-style {args.gen_layers} "
          f"layers, hidden 256, 4 heads (2 key/value), {args.generate} tokens generated greedily, batch 1, float32; "
          f"time: the fastest of {args.reps or 2} runs of each way, the ways alternating in one process; peak: "
          f"each way alone in a fresh process\n")
    print("\n".join(generation_table(results, seqs)))


if __name__ == "__main__":
    main()
