"""The language model under a CPU budget: bits per character on held-out text, and samples.

    python benchmarks/lm.py --data tatoeba --minutes 5 [--threads 1] [--seed 0] [--out runs/lm-5]
    python benchmarks/lm.py --data debian --minutes 30 --dim 256 --num-layers 6

Trains ``qkv train lm`` with its defaults (characters, width 128, 4 layers, context 128) for ``--minutes`` of wall
clock on ``--threads`` threads, then scores the test split (every document, up to ``--eval-tokens`` tokens) and
writes three samples (seeds 0, 1, 2; temperature 0.8, top-p 0.95) after fixed prompts. Prints a markdown row and
the samples; ``--json`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import record_flag  # noqa: E402

from qkv.apps.lm import LanguageModel, LMOptions, LMTask, budget_defaults, train_defaults  # noqa: E402
from qkv.train import train  # noqa: E402

PROMPTS = ("The ", "I think that ", "Where is ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="tatoeba")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=None, help="model width (default: what qkv train lm gives the budget)")
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--context", type=int, default=None)
    ap.add_argument("--options", default="{}", help="JSON: further LMOptions fields")
    ap.add_argument("--train", default="{}", help="JSON: TrainConfig fields over the defaults")
    ap.add_argument("--eval-tokens", type=int, default=200_000)
    ap.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    ap.add_argument("--json", default=None)
    record_flag(ap, "lm")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = Path(a.out or tempfile.mkdtemp(prefix="qkv-lm-"))
    given = {k: v for k, v in {"dim": a.dim, "num_layers": a.num_layers, "context": a.context}.items()
             if v is not None}
    given.update(json.loads(a.options))
    config = train_defaults(LMOptions()).replace(max_minutes=a.minutes, out=str(out), progress=False, seed=a.seed,
                                                 final_splits=(), **json.loads(a.train))
    # the model's size for the budget, as qkv train lm gives it, under what was given
    options = LMOptions(data=a.data, eval_tokens=a.eval_tokens,
                        **{**budget_defaults(LMOptions(data=a.data), config), **given})
    t0 = time.perf_counter()
    result = train(LMTask(options), config)
    seconds = time.perf_counter() - t0
    lm = LanguageModel.load(out, "cpu")
    test = lm.evaluate(split="test", max_tokens=a.eval_tokens)
    samples = {p: [lm.predict([p], max_new_tokens=80, temperature=0.8, top_p=0.95, seed=s)[0].text for s in range(3)]
               for p in PROMPTS}
    params = sum(p.numel() for p in lm.model.parameters())
    machine = f"{platform.machine()}, {a.threads} thread(s), torch {torch.__version__}"
    print("| data | minutes | steps | parameters | test bpc | test perplexity (per char) | machine |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {a.data} | {a.minutes:g} | {result.state.global_step} | {params / 1e6:.2f} M | {test['bpc']:.3f} | "
          f"{test['perplexity']:.2f} | {machine} |")
    for prompt, texts in samples.items():
        for t in texts:
            print(f"- `{prompt}{t}`")
    if a.json:
        Path(a.json).write_text(json.dumps({"data": a.data, "minutes": a.minutes, "seconds": seconds,
                                            "steps": result.state.global_step, "params": params, "test": test,
                                            "samples": samples, "machine": machine}, indent=2) + "\n")
    if a.record:
        from record import measurement, record

        record("lm", [measurement(
            f"bpc-{a.minutes:g}-w{options.dim}-l{options.num_layers}-c{options.context}",
            f"{a.minutes:g} minutes, width {options.dim}, {options.num_layers} layers, context {options.context}, "
            f"{result.state.global_step:,} steps", test["bpc"], "bits per character", figure=f"{test['bpc']:.3f}")],
            threads=a.threads)


if __name__ == "__main__":
    main()
