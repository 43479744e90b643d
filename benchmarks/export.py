"""Export to ONNX: ONNX Runtime against PyTorch eager on the CPU, at batch 1 and 32, and the graphs' file sizes.

    python benchmarks/export.py --threads 2            # the figures in BENCHMARKS.md
    python benchmarks/export.py --quick                # a smoke test

Models at the applications' default sizes, freshly initialised (latency does not depend on training), in eval
mode, exported by :func:`qkv.export.to_onnx` with the graphs ``qkv export`` writes (:mod:`qkv.export.classify`):

- sentiment: ``transformer-classifier`` (vocabulary 8,000, dim 128, 4 heads, 2 layers), 64 tokens;
- images: ``small-cnn`` with a non-local block, 28x28 grey images;
- segmentation: ``bisenet`` (the segmentation application's default), 64x64 colour images;
- attention alone: ``qkv.MultiHeadAttention(256, 8, kv_heads=2)``, causal, 128 positions, with its weights;
- the decoders, each as its two graphs (``encoder`` and one ``decoder_step``, as ``qkv export`` writes them):
  translation (``bahdanau``, vocabularies of 8,000, 64 source tokens), summarisation (the pointer-generator,
  vocabulary 20,000, 200 source words), speech (Listen, Attend and Spell, 40 log-mels, 4 s = 400 frames);
- question answering's reader (the Attentive Reader, vocabulary 20,000, 200 context and 12 question tokens).

A decoder step is timed on the state the encoder made of the timed sources (its first step: a Transformer's
empty caches would grow, the recurrent models' state does not); a decoded output takes one encoder call and one
step per token (the numpy search around them is the same for both).

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
from qkv.export.classify import ImageGraph, ReaderGraph, SegmentGraph, SentimentGraph  # noqa: E402
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


def _rows(t: torch.Tensor, b: int) -> torch.Tensor:
    return t[torch.arange(b) % t.shape[0]]


def _graphs(name: str, graphs: dict, source) -> dict:
    """The encoder and decoder step of a decoder: the encoder on ``source(b)``, the step on the state the encoder
    makes of it (as a served decoder's first step sees it)."""
    encoder, _, info = graphs["encoder"]
    step = graphs["decoder_step"][0]

    def state(b):
        inputs = source(b)
        with torch.no_grad():
            made = dict(zip(encoder.outputs, encoder(*inputs), strict=True))
        made.update({n: inputs[encoder.inputs.index(given)] for n, given in info["state_inputs"].items()})
        extra = (torch.zeros(b, 1, dtype=torch.bool),) if step.ext_slots else ()
        return (torch.full((b,), 6), *(made[n] for n in step.names), *extra)

    return {f"{name}: encoder": (encoder, source), f"{name}: decoder_step": (step, state)}


def decoders(gen) -> dict:
    from types import SimpleNamespace

    from qkv.apps.speech.export import graphs as speech_graphs
    from qkv.apps.speech.options import SpeechOptions
    from qkv.apps.speech.task import model_spec as speech_spec
    from qkv.apps.summarize.export import graphs as summarize_graphs
    from qkv.apps.summarize.options import SummarizeOptions
    from qkv.apps.summarize.task import model_spec as summary_spec
    from qkv.apps.translate.export import graphs as translate_graphs
    from qkv.apps.translate.options import TranslateOptions
    from qkv.apps.translate.task import model_spec as translate_spec

    def built(spec):
        return create(spec["name"], **spec["config"]).eval()

    o = TranslateOptions()
    translator = SimpleNamespace(model=built(translate_spec(o, src_vocab=8000, tgt_vocab=8000)),
                                 src_tokenizer=SimpleNamespace(vocab_size=8000))
    out = _graphs("translation (bahdanau, 64 source tokens)", translate_graphs(translator),
                  lambda b: (torch.randint(4, 8000, (b, 64), generator=gen), torch.ones(b, 64, dtype=torch.bool)))
    o = SummarizeOptions()
    summarizer = SimpleNamespace(model=built(summary_spec(o, vocab=20000)), options=o)
    out.update(_graphs("summarisation (pointer-generator, 200 source words)", summarize_graphs(summarizer),
                       lambda b: (torch.randint(4, 20000, (b, 200), generator=gen),
                                  torch.ones(b, 200, dtype=torch.bool),
                                  torch.randint(4, 20000, (b, 200), generator=gen))))
    o = SpeechOptions()
    recogniser = SimpleNamespace(model=built(speech_spec(o, vocab_size=32, n_mels=o.n_mels)), options=o)
    out.update(_graphs("speech (LAS, 4 s = 400 frames)", speech_graphs(recogniser),
                       lambda b: (torch.randn(b, 400, o.n_mels, generator=gen),
                                  torch.full((b,), 400, dtype=torch.long))))
    return out


def reader(gen) -> dict:
    from qkv.apps.qa.options import QAOptions
    from qkv.apps.qa.task import model_spec

    spec = model_spec(QAOptions(), vocab_size=20000)
    graph = ReaderGraph(create(spec["name"], **spec["config"]).eval(), 20)

    def make(b):
        return (torch.randint(4, 20000, (b, 200), generator=gen), torch.ones(b, 200, dtype=torch.bool),
                torch.randint(4, 20000, (b, 12), generator=gen), torch.ones(b, 12, dtype=torch.bool),
                (torch.rand(b, 200, generator=gen) > 0.9).float())

    return {"question answering (Attentive Reader, 200 + 12 tokens)": (graph, make)}


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
    p.add_argument("--only", nargs="*", help="the rows whose names hold one of these words")
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
    chosen = {**models(gen), **reader(gen), **decoders(gen)}
    if args.only:
        chosen = {k: v for k, v in chosen.items() if any(w in k for w in args.only)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (module, make) in chosen.items():
            module.eval()
            path = Path(tmp) / "model.onnx"
            to_onnx(module, make(2), path, input_names=module.inputs, output_names=module.outputs,
                    dynamic=module.dynamic, torchscript=getattr(module, "torchscript", None))
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
                diff = max(float((torch.from_numpy(g) - w).double().abs().max()) for g, w in zip(got, want, strict=True)
                           if w.is_floating_point())
                print(f"| {name} | {b} | {t_torch * 1e3:.2f} | {t_ort * 1e3:.2f} | {t_torch / t_ort:.2f}x | "
                      f"{diff:.1e} | {size:.2f} MiB |", flush=True)


if __name__ == "__main__":
    main()
