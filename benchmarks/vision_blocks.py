"""Parameter count and forward time of each qkv.vision block against a plain implementation of its paper's formula.

The plain versions use the block's own weights and write the formula out directly (materialising every
intermediate, e.g. the non-local ``(B, HW, HW')`` weights and, for the concatenation score, the
``(B, HW, HW', 2C')`` pairs); the table also gives their largest difference from the block.

    python benchmarks/vision_blocks.py [--batch 8 --channels 64 --size 32 --repeats 20 --out FILE]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from qkv import vision


def fc(z, conv):
    out = z @ conv.weight.flatten(1).T
    return out if conv.bias is None else out + conv.bias


def bn(x, m):
    s = (1, -1, 1, 1)
    return (x - m.running_mean.view(s)) / torch.sqrt(m.running_var.view(s) + m.eps) * m.weight.view(s) + m.bias.view(s)


def plain_se(m, x):
    s = torch.sigmoid(fc(torch.relu(fc(x.mean(dim=(2, 3)), m.fc1)), m.fc2))
    return x * s[:, :, None, None]


def plain_eca(m, x):
    y = x.mean(dim=(2, 3))[:, None, :]
    return x * torch.sigmoid(F.conv1d(y, m.conv.weight, padding=m.kernel_size // 2))[:, 0, :, None, None]


def plain_cbam(m, x):
    gate = m.channel
    avg, mx = x.mean(dim=(2, 3)), x.amax(dim=(2, 3))
    mc = torch.sigmoid(fc(torch.relu(fc(avg, gate.fc1)), gate.fc2) + fc(torch.relu(fc(mx, gate.fc1)), gate.fc2))
    x = x * mc[:, :, None, None]
    pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)
    return x * torch.sigmoid(F.conv2d(pooled, m.spatial.conv.weight, padding=m.spatial.conv.padding))


def plain_sk(m, x):
    us = []
    for branch in m.branches:
        conv = branch[0]
        us.append(torch.relu(bn(F.conv2d(x, conv.weight, stride=conv.stride, padding=conv.padding,
                                         dilation=conv.dilation, groups=conv.groups), branch[1])))
    s = sum(us).mean(dim=(2, 3))
    z = torch.relu(bn(fc(s, m.reduce[0])[..., None, None], m.reduce[1])).flatten(1)
    a = torch.softmax(fc(z, m.select).view(x.shape[0], len(us), -1), dim=1)
    return sum(a[:, i, :, None, None] * u for i, u in enumerate(us))


def plain_non_local(m, x):
    b, c, h, w = x.shape

    def embed(conv, t):
        return (torch.einsum("oc,bchw->bohw", conv.weight.flatten(1), t) + conv.bias.view(1, -1, 1, 1)).flatten(2)

    theta, phi, g = embed(m.theta, x).transpose(1, 2), embed(m.phi, x), embed(m.g, x).transpose(1, 2)
    n = phi.shape[-1]
    if m.mode == "embedded_gaussian":
        f = torch.exp(theta @ phi)
        weights = f / f.sum(-1, keepdim=True)
    elif m.mode == "dot":
        weights = theta @ phi / n
    else:
        wf = torch.cat([m.score.query_proj.weight, m.score.key_proj.weight], dim=1).view(-1)
        phi = phi.transpose(1, 2)
        pairs = torch.cat([theta[:, :, None, :].expand(-1, -1, n, -1), phi[:, None].expand(-1, h * w, -1, -1)], -1)
        weights = torch.relu(pairs @ wf) / n
    y = (weights @ g).transpose(1, 2).reshape(b, -1, h, w)
    return bn(torch.einsum("oc,bchw->bohw", m.out.weight.flatten(1), y) + m.out.bias.view(1, -1, 1, 1), m.norm) + x


def plain_arm(m, x):
    return x * torch.sigmoid(bn(fc(x.mean(dim=(2, 3)), m.conv)[..., None, None], m.norm))


def plain_ffm(m, x):
    u = torch.relu(bn(F.conv2d(x, m.fuse[0].weight, padding=m.fuse[0].padding), m.fuse[1]))
    a = torch.sigmoid(fc(torch.relu(fc(u.mean(dim=(2, 3)), m.attn[0])), m.attn[2]))[:, :, None, None]
    return u + u * a


CASES = [
    ("se", {}, plain_se, "x * sigmoid(W2 relu(W1 avgpool(x)))"),
    ("eca", {}, plain_eca, "x * sigmoid(conv1d_k(avgpool(x)))"),
    ("cbam", {}, plain_cbam, "channel MLP on avg+max, then 7x7 conv on [mean;max]"),
    ("sk", {}, plain_sk, "2 branches (3x3, dilated 3x3), softmax over branches"),
    ("non_local", {"mode": "embedded_gaussian"}, plain_non_local, "softmax(theta phi^T) g, explicit weights"),
    ("non_local", {"mode": "dot"}, plain_non_local, "(theta phi^T / N) g"),
    ("non_local", {"mode": "concat"}, plain_non_local, "relu(w^T [theta_i; phi_j]) / N, explicit pairs"),
    ("arm", {}, plain_arm, "x * sigmoid(BN(conv(avgpool(x))))"),
    ("ffm", {}, plain_ffm, "u + u * sigmoid(conv relu conv avgpool(u))"),
]


def timed(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs of ``fn()`` in milliseconds, after two warm-up runs (the minimum is the
    estimate least disturbed by other processes on a shared machine)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def run(batch: int, channels: int, size: int, repeats: int) -> str:
    torch.manual_seed(0)
    x = torch.randn(batch, channels, size, size)
    rows = [f"Vision blocks, forward only, `torch.no_grad()`, eval mode, input ({batch}, {channels}, {size}, {size}) "
            f"float32; fastest of {repeats} runs; torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{platform.processor() or platform.machine()}.",
            "",
            "| block | parameters | qkv (ms) | plain formula (ms) | plain / qkv | max abs diff | plain formula |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for name, kwargs, plain, formula in CASES:
        block = vision.create(name, channels, **kwargs).eval()
        with torch.no_grad():
            for p in block.parameters():  # non-zero weights everywhere (the non-local block starts at identity)
                p.normal_(0, 0.1)
            ours = timed(lambda b=block: b(x), repeats)
            theirs = timed(lambda b=block, f=plain: f(b, x), repeats)
            diff = (block(x) - plain(block, x)).abs().max().item()
        params = sum(p.numel() for p in block.parameters())
        label = name + (f" ({kwargs['mode']})" if "mode" in kwargs else "")
        rows.append(f"| {label} | {params:,} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}x | {diff:.1e} | "
                    f"{formula} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", help="write the markdown table to this file instead of stdout")
    args = parser.parse_args(argv)
    table = run(args.batch, args.channels, args.size, args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    else:
        print(table, end="")


if __name__ == "__main__":
    main()
