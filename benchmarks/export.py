"""Export to ONNX: ONNX Runtime against PyTorch eager on the CPU, at batch 1 and 32, and the graphs' file sizes.

    python benchmarks/export.py --threads 2            # the figures in BENCHMARKS.md
    python benchmarks/export.py --quick                # a smoke test

Models at the applications' default sizes, freshly initialised (latency does not depend on training), in eval
mode, exported by :func:`qkv.export.to_onnx` with the graphs ``qkv export`` writes (:mod:`qkv.export.classify`):

- sentiment: ``transformer-classifier`` (vocabulary 8,000, dim 128, 4 heads, 2 layers), 64 tokens;
- images: ``small-cnn`` with a non-local block, 28x28 grey images;
- segmentation: ``bisenet`` (the segmentation application's default), 64x64 colour images;
- attention alone: ``qkv.MultiHeadAttention(256, 8, kv_heads=2)``, causal, 128 positions, with its weights.

Each row: the median of ``--repeat`` calls after warm-up calls, PyTorch under ``torch.no_grad()`` with
``torch.set_num_threads(threads)``, ONNX Runtime with ``intra_op_num_threads = threads`` and its default graph
optimisations; the ratio is PyTorch's time over ONNX Runtime's (above 1: ONNX Runtime is faster). The outputs of
both are compared (max abs difference) on the timed inputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import qkv  # noqa: E402
from qkv.export import to_onnx  # noqa: E402
from qkv.export.classify import ImageGraph, SegmentGraph, SentimentGraph  # noqa: E402
from qkv.models import create  # noqa: E402


class Causal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = qkv.MultiHeadAttention(256, 8, kv_heads=2)

    inputs, outputs, dynamic = ("x",), ("y", "weights"), ({0: "batch", 1: "time"},)

    def forward(self, x):
        return self.mha(x, is_causal=True, return_weights=True)


def models(gen):
    vocab = 8000

    def tokens(b):
        ids = torch.randint(4, vocab, (b, 64), generator=gen)
        return ids, torch.ones(b, 64, dtype=torch.bool)

    return {
        "sentiment (Transformer, 64 tokens)": (
            SentimentGraph(create("transformer-classifier", vocab_size=vocab, num_classes=2)), tokens),
        "images (small CNN + non-local, 28x28)": (
            ImageGraph(create("small-cnn", num_classes=10, attn="non_local"), [0.5], [0.25]),
            lambda b: (torch.rand(b, 1, 28, 28, generator=gen),)),
        "segmentation (BiSeNet, 64x64)": (
            SegmentGraph(create("bisenet", num_classes=7), [0.5] * 3, [0.25] * 3),
            lambda b: (torch.rand(b, 3, 64, 64, generator=gen),)),
        "MultiHeadAttention (GQA, causal, 128 positions, weights)": (
            Causal(), lambda b: (torch.randn(b, 128, 256, generator=gen),)),
    }


def median_time(fn, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="batch 1 and 4, 3 repeats")
    args = p.parse_args()
    import onnxruntime as ort

    torch.set_num_threads(args.threads)
    batches = (1, 4) if args.quick else (1, 32)
    repeat = 3 if args.quick else args.repeat
    gen = torch.Generator().manual_seed(0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, {args.threads} threads, median of {repeat}")
    print("| model | batch | PyTorch eager ms | ONNX Runtime ms | ratio | max abs diff | ONNX file |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (module, make) in models(gen).items():
            module.eval()
            path = Path(tmp) / "model.onnx"
            to_onnx(module, make(2), path, input_names=module.inputs, output_names=module.outputs,
                    dynamic=module.dynamic)
            size = path.stat().st_size / 2 ** 20
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            fed = [i.name for i in session.get_inputs()]
            for b in batches:
                inputs = make(b)
                feed = {n: t.numpy() for n, t in zip(module.inputs, inputs, strict=True) if n in fed}
                with torch.no_grad():
                    t_torch = median_time(lambda m=module, inputs=inputs: m(*inputs), repeat)
                    want = module(*inputs)
                t_ort = median_time(lambda s=session, feed=feed: s.run(None, feed), repeat)
                got = session.run(None, feed)
                want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
                diff = max(float((torch.from_numpy(g) - w).abs().max()) for g, w in zip(got, want, strict=True))
                print(f"| {name} | {b} | {t_torch * 1e3:.2f} | {t_ort * 1e3:.2f} | {t_torch / t_ort:.2f}x | "
                      f"{diff:.1e} | {size:.2f} MiB |", flush=True)


if __name__ == "__main__":
    main()
