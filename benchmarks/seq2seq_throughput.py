"""Training throughput of qkv's Bahdanau encoder-decoder against the same model in plain PyTorch.

    python benchmarks/seq2seq_throughput.py                # default sizes (embed/hidden 256, 1 GRU layer, vocab 8000)
    python benchmarks/seq2seq_throughput.py --quick        # small sizes, a smoke test
    python benchmarks/seq2seq_throughput.py --threads 1 --rounds 7
    python benchmarks/seq2seq_throughput.py --device cuda --batch 128

The qkv model is :class:`qkv.models.BahdanauSeq2Seq` (additive score, bidirectional GRU encoder, the sizes
of ``benchmarks/translate.py corpus`` on Tatoeba). The reference, :class:`TorchBahdanau`, is the same model
written with plain PyTorch: the same packed bidirectional encoder and bridge, a ``GRUCell`` decoder loop,
the additive score ``v^T tanh(W s_{i-1} + U h_j + b)`` as tensor ops with ``U h_j + b`` computed once per
sentence, a masked softmax, a ``bmm`` for the context and the output layer ``Linear([s_i; c_i; E y_{i-1}])``.
It has exactly qkv's parameters (same names up to :func:`weight_map`, same shapes): the script copies qkv's
initial weights into it and checks that the logits agree before timing, so both train the same network.

The reference runs in two forms: ``plain PyTorch`` embeds the targets and applies the output layer once per
batch (one ``(B*T, 2H+E) x (2H+E, V)`` product), as training code usually does, and as qkv's teacher-forced
``forward`` does too; ``plain PyTorch, per step`` applies them at every step, as step-by-step decoding must
(``decode_step``), so the gap between the two plain rows is what hoisting is worth, and the gap between qkv and
the hoisted row is what qkv's general modules (its attention call, its ``nn.GRU`` decoder step) cost.

One training step is forward (teacher forcing) + cross-entropy + backward + AdamW step on a batch of random
right-padded sentences of ``--min-len`` to ``--max-len`` tokens. Throughput is real (non-padding) target
tokens per second; the models alternate in rounds and the table gives the median over rounds, so that all
see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qkv.models.seq2seq import BahdanauSeq2Seq, RNNConfig  # noqa: E402


class TorchBahdanau(nn.Module):
    """Bahdanau's encoder-decoder in plain PyTorch, with :class:`BahdanauSeq2Seq`'s architecture.

    ``hoist``: embed the targets and apply the output layer once per batch (default), not once per step.
    """

    def __init__(self, cfg: RNNConfig, *, hoist: bool = True):
        super().__init__()
        if cfg.score != "additive":
            raise ValueError(f"the plain model has the additive score only, got {cfg.score!r}")
        self.cfg, self.hoist = cfg, hoist
        self.lstm = cfg.cell == "lstm"
        e, h, a = cfg.embed_dim, cfg.hidden_dim, cfg.attn_dim
        self.directions = 2 if cfg.bidirectional else 1
        rnn = nn.LSTM if self.lstm else nn.GRU
        self.src_embed = nn.Embedding(cfg.src_vocab, e, padding_idx=cfg.pad_id)
        self.encoder = rnn(e, h // self.directions, num_layers=cfg.num_layers, batch_first=True,
                           bidirectional=cfg.bidirectional, dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
        self.bridge = nn.Linear(h, h)  # s_0 = tanh(W_s [h_fwd; h_bwd])
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, e, padding_idx=cfg.pad_id)
        cell = nn.LSTMCell if self.lstm else nn.GRUCell
        self.cells = nn.ModuleList(cell(e + h if i == 0 else h, h) for i in range(cfg.num_layers))
        self.attn_query = nn.Linear(h, a, bias=False)  # W_a
        self.attn_key = nn.Linear(h, a)  # U_a and the bias inside the tanh
        self.attn_v = nn.Linear(a, 1, bias=False)  # v_a
        self.out = nn.Linear(2 * h + e, cfg.tgt_vocab)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, list]:
        """Encoder outputs ``(B, S, H)`` and the decoder's first state: one ``(B, H)`` (a pair for LSTMs) per layer."""
        b, layers = src.shape[0], self.cfg.num_layers
        lengths = src_mask.sum(dim=1).clamp(min=1).cpu()
        x = self.dropout(self.src_embed(src))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, final = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        h = final[0] if self.lstm else final  # (layers * directions, B, H / directions)
        h = h.view(layers, self.directions, b, -1).permute(0, 2, 1, 3).reshape(layers, b, -1)
        h0 = torch.tanh(self.bridge(h))
        hidden = [(h0[i], torch.zeros_like(h0[i])) if self.lstm else h0[i] for i in range(layers)]
        return self.dropout(memory), hidden

    def step(self, x: Tensor, hidden: list) -> list:
        """One decoder step through the stack of cells (dropout between layers, as ``nn.GRU`` does)."""
        new = []
        for i, cell in enumerate(self.cells):
            if i:
                x = nn.functional.dropout(x, self.cfg.dropout, self.training)
            state = cell(x, hidden[i])
            new.append(state)
            x = state[0] if self.lstm else state
        return new

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        memory, hidden = self.encode(src, src_mask)
        keys = self.attn_key(memory)  # U_a h_j + b: once per sentence, (B, S, A)
        pad = ~src_mask
        fill = torch.finfo(memory.dtype).min
        embedded = self.dropout(self.tgt_embed(tgt_in)) if self.hoist else None  # (B, T, E)
        states, contexts, logits = [], [], []
        for t in range(tgt_in.shape[1]):
            e = embedded[:, t] if self.hoist else self.dropout(self.tgt_embed(tgt_in[:, t]))
            s_prev = hidden[-1][0] if self.lstm else hidden[-1]  # s_{i-1}, top layer: (B, H)
            scores = self.attn_v(torch.tanh(keys + self.attn_query(s_prev)[:, None])).squeeze(-1)  # (B, S)
            weights = torch.softmax(scores.masked_fill(pad, fill), dim=-1)
            c = torch.bmm(weights[:, None], memory)[:, 0]  # (B, H)
            hidden = self.step(torch.cat([e, c], -1), hidden)
            s = hidden[-1][0] if self.lstm else hidden[-1]
            if self.hoist:
                states.append(s)
                contexts.append(c)
            else:
                logits.append(self.out(torch.cat([self.dropout(s), c, e], -1)))
        if not self.hoist:
            return torch.stack(logits, dim=1)
        states = self.dropout(torch.stack(states, dim=1))
        return self.out(torch.cat([states, torch.stack(contexts, dim=1), embedded], -1))


def weight_map(cfg: RNNConfig) -> dict[str, str]:
    """qkv's parameter names (:class:`BahdanauSeq2Seq`) -> :class:`TorchBahdanau`'s."""
    names = {"encoder.embed.weight": "src_embed.weight", "encoder.bridge.weight": "bridge.weight",
             "encoder.bridge.bias": "bridge.bias", "embed.weight": "tgt_embed.weight",
             "score.query_proj.weight": "attn_query.weight", "score.key_proj.weight": "attn_key.weight",
             "score.key_proj.bias": "attn_key.bias", "score.v.weight": "attn_v.weight",
             "out.weight": "out.weight", "out.bias": "out.bias"}
    suffixes = [""] + (["_reverse"] if cfg.bidirectional else [])
    for i in range(cfg.num_layers):
        for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            for suffix in suffixes:
                names[f"encoder.rnn.{w}_l{i}{suffix}"] = f"encoder.{w}_l{i}{suffix}"
            names[f"rnn.{w}_l{i}"] = f"cells.{i}.{w}"
    return names


@torch.no_grad()
def copy_qkv_weights(qkv_model: BahdanauSeq2Seq, plain: TorchBahdanau) -> None:
    """Give ``plain`` the weights of ``qkv_model``; every parameter of both must be named in the map."""
    names = weight_map(qkv_model.cfg)
    theirs, ours = dict(qkv_model.named_parameters()), dict(plain.named_parameters())
    if set(names) != set(theirs) or set(names.values()) != set(ours):
        raise ValueError(f"weight map out of date: qkv has {sorted(set(theirs) ^ set(names))} unmapped, plain has "
                         f"{sorted(set(ours) ^ set(names.values()))} unmapped")
    for a, b in names.items():
        if theirs[a].shape != ours[b].shape:
            raise ValueError(f"{a} {tuple(theirs[a].shape)} vs {b} {tuple(ours[b].shape)}")
        ours[b].copy_(theirs[a])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def max_logit_diff(qkv_model: nn.Module, plain: nn.Module, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> float:
    """Largest ``|logit difference|`` between the two models in eval mode (no dropout)."""
    modes = qkv_model.training, plain.training
    qkv_model.eval()
    plain.eval()
    with torch.no_grad():
        diff = (qkv_model(src, src_mask, tgt_in) - plain(src, src_mask, tgt_in)).abs().max().item()
    qkv_model.train(modes[0])
    plain.train(modes[1])
    return diff


def make_batch(cfg: RNNConfig, batch: int, min_len: int, max_len: int, gen: torch.Generator, device=None):
    """Random sentences of ``min_len``..``max_len`` tokens, right-padded to the batch's longest:
    ``src, src_mask, tgt_in, tgt_out`` (the target carries one more token, BOS/EOS, split into in and out)."""
    def padded(vocab, extra):
        lengths = torch.randint(min_len, max_len + 1, (batch,), generator=gen) + extra
        mask = torch.arange(int(lengths.max()))[None] < lengths[:, None]
        return torch.randint(4, vocab, mask.shape, generator=gen).masked_fill(~mask, cfg.pad_id), mask

    src, src_mask = padded(cfg.src_vocab, 0)
    tgt, _ = padded(cfg.tgt_vocab, 1)
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


QKV, PLAIN, PER_STEP = "qkv BahdanauSeq2Seq", "plain PyTorch", "plain PyTorch, per step"


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print the table; returns the median tokens/s per model."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--embed-dim", type=int, default=256)
    ap.add_argument("--hidden-dim", type=int, default=256)
    ap.add_argument("--attn-dim", type=int, default=None, help="additive score size (default: hidden dim)")
    ap.add_argument("--layers", type=int, default=1, help="encoder and decoder layers each")
    ap.add_argument("--cell", choices=["gru", "lstm"], default="gru")
    ap.add_argument("--vocab", type=int, default=8000, help="source and target vocabulary each")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=5, help="shortest sentence, tokens")
    ap.add_argument("--max-len", type=int, default=20, help="longest sentence, tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="training steps per model per round")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.embed_dim, args.hidden_dim, args.vocab, args.rounds, args.steps = 32, 32, 500, 2, 2
    if not 1 <= args.min_len <= args.max_len:
        ap.error(f"need 1 <= --min-len <= --max-len, got {args.min_len} and {args.max_len}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = RNNConfig(args.vocab, args.vocab, embed_dim=args.embed_dim, hidden_dim=args.hidden_dim,
                    num_layers=args.layers, cell=args.cell, dropout=0.1, score="additive",
                    attn_dim=args.attn_dim or args.hidden_dim)
    torch.manual_seed(0)
    models = {QKV: BahdanauSeq2Seq(cfg), PLAIN: TorchBahdanau(cfg), PER_STEP: TorchBahdanau(cfg, hoist=False)}
    data = make_batch(cfg, args.batch, args.min_len, args.max_len, torch.Generator().manual_seed(0))
    # the same network: same parameter count, qkv's initial weights, the same logits (checked on CPU, float32)
    params = {name: n_params(m) for name, m in models.items()}
    diff = 0.0
    for name in (PLAIN, PER_STEP):
        if params[name] != params[QKV]:
            raise AssertionError(f"{name} has {params[name]:,} parameters, qkv {params[QKV]:,}")
        copy_qkv_weights(models[QKV], models[name])
        diff = max(diff, max_logit_diff(models[QKV], models[name], *(t[:16] for t in data[:3])))
    if diff > 1e-4:
        raise AssertionError(f"the plain model's logits differ from qkv's by {diff:.2e}")
    data = [t.to(device) for t in data]
    opts = {}
    for name, m in models.items():
        m.to(device).train()
        opts[name] = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    tokens = int((data[3] != cfg.pad_id).sum()) * args.steps
    for name, m in models.items():  # warm-up
        train_steps(m, opts[name], data, 1)
    rates = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, m in models.items():
            rates[name].append(tokens / train_steps(m, opts[name], data, args.steps))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    cmd = " ".join(["python", "benchmarks/seq2seq_throughput.py", *(sys.argv[1:] if argv is None else argv)])
    src_len, tgt_len = data[0].shape[1], data[2].shape[1]
    lines = [f"Bahdanau seq2seq training throughput (embed {cfg.embed_dim}, hidden {cfg.hidden_dim}, additive score "
             f"{cfg.attn_dim}, {cfg.num_layers}-layer {cfg.cell.upper()}, bidirectional encoder, "
             f"vocab {cfg.tgt_vocab}, "
             f"batch {args.batch}, sentences of {args.min_len}-{args.max_len} tokens (padded to {src_len}/{tgt_len}), "
             f"{args.rounds} rounds x {args.steps} steps)",
             "", "| model | parameters | target tokens/s (median) | vs plain |", "|---|---:|---:|---:|"]
    for name in models:
        lines.append(f"| {name} | {params[name]:,} | {medians[name]:,.0f} | {medians[name] / medians[PLAIN]:.2f}x |")
    lines += ["", f"Logits of qkv and plain agree to {diff:.1e} (same initial weights). "
              f"Machine: {machine(device)}. Command: `{cmd}`"]
    print("\n".join(lines))
    return medians


if __name__ == "__main__":
    main()
