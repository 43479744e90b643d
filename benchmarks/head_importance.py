"""Head importance on a GPT-2-sized model: qkv's batched ablation against the brute force, one forward pass per
head with that head's slice of the output projection's input zeroed by a hook (transformers' ``sdpa`` attention).

The model is built from ``GPT2Config()`` (12 layers, 12 heads, 768 wide, 50,257 tokens) with random weights:
nothing is downloaded. The text is ``--tokens`` random token ids. Both ways give the increase of the mean
next-token negative log-likelihood (nats) per head; the table gives their wall and CPU times (the CPU time of the
process moves less than the wall time on a shared machine), the ratio of CPU times, and the largest difference
between the two results.

    python benchmarks/head_importance.py --threads 2 --tokens 512
"""

from __future__ import annotations

import argparse
import time

import torch
from record import record_flag


def build(layers: int, heads: int, width: int, positions: int):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=max(1024, positions),
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return tf.GPT2LMHeadModel(config).eval()


@torch.no_grad()
def brute_force(model, ids: torch.Tensor) -> torch.Tensor:
    """One forward pass per head on ``sdpa``, that head zeroed before ``c_proj`` by a hook."""
    model.set_attn_implementation("sdpa")
    c = model.config
    width = c.n_embd // c.n_head

    def loss() -> float:
        logits = model(input_ids=ids).logits[0].double()
        return float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]))

    base = loss()
    out = torch.zeros(c.n_layer, c.n_head, dtype=torch.float64)
    for layer, block in enumerate(model.transformer.h):
        for head in range(c.n_head):
            def zero(module, args, h=head):
                x = args[0].clone()
                x[..., h * width:(h + 1) * width] = 0
                return (x,)

            handle = block.attn.c_proj.register_forward_pre_hook(zero)
            try:
                out[layer, head] = loss() - base
            finally:
                handle.remove()
    return out.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=8, help="ablated heads per forward pass")
    ap.add_argument("--no-brute", action="store_true", help="skip the brute force")
    record_flag(ap, "inside")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from qkv.integrations.importance import head_importance

    model = build(args.layers, args.heads, args.width, args.tokens)
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    t, c = time.perf_counter(), time.process_time()
    got = head_importance(model, ids, batch=args.batch)
    ours, ours_cpu = time.perf_counter() - t, time.process_time() - c
    print(f"GPT2Config {args.layers}x{args.heads}, width {args.width}, {args.tokens} tokens, {args.threads} threads")
    print(f"| way | time | CPU time | speed vs brute force (CPU time) |\n|---|---|---|---|\n"
          f"| qkv head_importance (batch {args.batch}) | {ours:.1f} s | {ours_cpu:.1f} s | ", end="", flush=True)
    if args.no_brute:
        print("- |")
        return
    t, c = time.perf_counter(), time.process_time()
    want = brute_force(model, ids)
    brute, brute_cpu = time.perf_counter() - t, time.process_time() - c
    print(f"{brute_cpu / ours_cpu:.2f}x |\n| brute force ({args.layers * args.heads} forward passes, sdpa, hooks) | "
          f"{brute:.1f} s | {brute_cpu:.1f} s | 1.00x |")
    diff = float((got - want).abs().max())
    print(f"largest difference: {diff:.2e} nats (largest importance {float(want.abs().max()):.3f} nats)")
    if args.record:
        from record import measurement, record

        size = f"{args.layers * args.heads} heads, {args.tokens} tokens"
        record("inside", [
            measurement("head-importance", f"`head_importance` on a GPT-2-sized model ({size}): CPU time of the brute "
                        f"force ({args.layers * args.heads} ablated forward passes) / qkv's", brute_cpu / ours_cpu,
                        "less CPU time", figure=f"{brute_cpu / ours_cpu:.2f}x"),
            measurement("head-importance-time", "the same, qkv's wall time", ours, figure=f"{ours:,.1f} s"),
            measurement("head-importance-diff", "largest difference from the brute force's importances", diff,
                        figure=f"{diff:.2g}")])


if __name__ == "__main__":
    main()
