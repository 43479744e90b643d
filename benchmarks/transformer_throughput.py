"""Training throughput of qkv's Transformer encoder-decoder against the same model in plain PyTorch.

    python benchmarks/transformer_throughput.py            # default sizes (d_model 256, 3+3 layers)
    python benchmarks/transformer_throughput.py --quick    # small sizes, a smoke test
    python benchmarks/transformer_throughput.py --device cuda --batch 128

Both models: pre-norm encoder and decoder (``torch.nn.Transformer(norm_first=True)`` for the reference,
:class:`qkv.models.TransformerSeq2Seq` here), the same sizes, embeddings scaled by ``sqrt(d_model)`` plus
sinusoidal positions, output projection tied to the target embedding, the same dropout. One training step
is forward + cross-entropy + backward + AdamW step on a batch of random right-padded sequences.
Throughput is real (non-padding) target tokens per second; the two models alternate in rounds and the
table gives the median over rounds, so that both see the same machine load.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qkv.layers import sinusoidal_positions  # noqa: E402
from qkv.models import TransformerConfig, TransformerSeq2Seq  # noqa: E402


class TorchSeq2Seq(nn.Module):
    """The reference: ``nn.Transformer`` with the same embeddings, positions and tied output layer."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.src_vocab, cfg.dim, padding_idx=cfg.pad_id)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, cfg.dim, padding_idx=cfg.pad_id)
        self.register_buffer("sinusoids", sinusoidal_positions(cfg.max_len, cfg.dim), persistent=False)
        self.transformer = nn.Transformer(cfg.dim, cfg.num_heads, cfg.num_layers, cfg.decoder_layers,
                                          cfg.ffn_dim, cfg.dropout, batch_first=True, norm_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.dim, cfg.tgt_vocab, bias=False)
        self.out.weight = self.tgt_embed.weight

    def embed(self, emb, tokens):
        return self.dropout(emb(tokens) * math.sqrt(self.cfg.dim) + self.sinusoids[:tokens.shape[1]])

    def forward(self, src, src_mask, tgt_in):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=tgt_in.device)
        y = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt_in), tgt_mask=causal,
                             src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask, tgt_is_causal=True)
        return self.out(y)


def make_batch(cfg, batch, src_len, tgt_len, gen, device):
    def padded(vocab, length):
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen)
        mask = torch.arange(length)[None] < lengths[:, None]
        return torch.randint(4, vocab, (batch, length), generator=gen).masked_fill(~mask, cfg.pad_id), mask

    src, src_mask = padded(cfg.src_vocab, src_len)
    tgt, _ = padded(cfg.tgt_vocab, tgt_len + 1)
    return [t.to(device) for t in (src, src_mask, tgt[:, :-1], tgt[:, 1:])]


def train_steps(model, opt, data, steps) -> float:
    """Seconds for ``steps`` training steps."""
    src, src_mask, tgt_in, tgt_out = data
    if src.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        logits = model(src, src_mask, tgt_in)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=model.cfg.pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if src.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def machine(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
            f"threads, torch {torch.__version__}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn-dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--tgt-len", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="training steps per model per round")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.d_model, args.ffn_dim, args.layers, args.vocab, args.rounds, args.steps = 64, 128, 1, 500, 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = TransformerConfig(args.vocab, args.vocab, dim=args.d_model, num_heads=args.heads, ffn_dim=args.ffn_dim,
                            num_layers=args.layers, dropout=0.1, max_len=max(args.src_len, args.tgt_len) + 1)
    torch.manual_seed(0)
    models = {"qkv TransformerSeq2Seq": TransformerSeq2Seq(cfg), "torch nn.Transformer": TorchSeq2Seq(cfg)}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    opts = {}
    for name, m in models.items():
        m.to(device).train()
        opts[name] = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
    data = make_batch(cfg, args.batch, args.src_len, args.tgt_len, torch.Generator().manual_seed(0), device)
    tokens = int((data[3] != cfg.pad_id).sum()) * args.steps
    for name, m in models.items():  # warm-up
        train_steps(m, opts[name], data, 1)
    rates = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, m in models.items():
            rates[name].append(tokens / train_steps(m, opts[name], data, args.steps))
    ref = statistics.median(rates["torch nn.Transformer"])
    cmd = " ".join(["python", "benchmarks/transformer_throughput.py", *sys.argv[1:]])
    lines = [f"Transformer training throughput (d_model {cfg.dim}, {cfg.num_heads} heads, FFN {cfg.ffn_dim}, "
             f"{cfg.num_layers}+{cfg.decoder_layers} layers, vocab {cfg.tgt_vocab}, batch {args.batch}, "
             f"source/target length <= {args.src_len}/{args.tgt_len}, {args.rounds} rounds x {args.steps} steps)",
             "", "| model | parameters | target tokens/s (median) | vs torch |", "|---|---:|---:|---:|"]
    for name in models:
        rate = statistics.median(rates[name])
        lines.append(f"| {name} | {params[name]:,} | {rate:,.0f} | {rate / ref:.2f}x |")
    lines += ["", f"Machine: {machine(device)}. Command: `{cmd}`"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
