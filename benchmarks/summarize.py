"""Summarisation: ROUGE-1/2/L, repeated trigrams and copied words on the Debian descriptions' test split for the lead
and first-8-words baselines, seq2seq, pointer, pointer + coverage and the Transformer with copy attention, each
trained for a time budget on one thread; and exact match of generated answers on the facts' held-out entities.

    python benchmarks/summarize.py --minutes 5 --facts-minutes 3 --out runs/bench-summarize

Pointer + coverage switches coverage on after ``--coverage-at`` of the plain pointer run's steps (See et al. add it
to a converged model). Prints a Markdown table and writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from qkv.tasks.summarize import (
    SummarizeOptions,
    Summarizer,
    SummarizeTask,
    first_words,
    lead,
    load_data,
    summary_metrics,
    train_defaults,
)
from qkv.train import train

#: a CPU-sized model: what one core trains in minutes
SMALL = {"vocab_size": 8000, "embed_dim": 64, "hidden_dim": 128, "max_source": 80, "max_target": 20,
         "max_decode_len": 20, "eval_max": 200}
MODELS = {"seq2seq": {"model": "seq2seq"}, "pointer": {"model": "pointer"},
          "pointer+coverage": {"model": "pointer"},
          "transformer-copy": {"model": "transformer", "dim": 128, "num_heads": 4, "num_layers": 2}}


def _options(base: dict, extra: dict) -> SummarizeOptions:
    o = {**base, **extra}
    if o.get("model") == "transformer":
        o = {k: v for k, v in o.items() if k not in ("embed_dim", "hidden_dim")}
    return SummarizeOptions(**o)


def run(name: str, options: SummarizeOptions, data, minutes: float, out: Path, args) -> dict:
    cfg = train_defaults(options).replace(max_minutes=minutes, out=str(out / name), progress=False,
                                          final_splits=("test",))
    t0 = time.time()
    result = train(SummarizeTask(options, data=data), cfg)
    summarizer = Summarizer.load(out / name / "checkpoint")
    figures = summarizer.evaluate(split="test", limit=args.test, beam=args.beam, baselines=False)
    return {"name": name, "steps": int(result.state.global_step),
            "minutes": minutes, "train_s": round(time.time() - t0, 1), **figures}


def _percent(row: dict, key: str, digits: int = 1) -> str:
    return "" if key not in row else f"{100 * row[key]:.{digits}f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training budget of each Debian model")
    p.add_argument("--facts-minutes", type=float, default=3.0, help="training budget of each facts model (0: none)")
    p.add_argument("--models", default=",".join(MODELS), help="which Debian models")
    p.add_argument("--coverage-at", type=float, default=0.75, help="pointer + coverage: coverage from this share "
                                                                   "of the plain pointer's steps")
    p.add_argument("--test", type=int, default=1000, help="test examples decoded")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--debian-file", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/bench-summarize")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    base = dict(SMALL, **({"debian_file": args.debian_file} if args.debian_file else {}))
    data = load_data(SummarizeOptions(**base))
    test = data.split("test")[:args.test]
    for name, make in (("lead", lead), ("first-8-words", first_words)):
        rows.append({"name": name, **summary_metrics([make(e.source) for e in test], [e.target for e in test])})
    pointer_steps = None
    for name in args.models.split(","):
        extra = dict(MODELS[name])
        if name == "pointer+coverage":
            steps = pointer_steps or 1000
            extra["coverage_from"] = int(args.coverage_at * steps)
        rows.append(run(name, _options(base, extra), data, args.minutes, out, args))
        if name == "pointer":
            log = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
            pointer_steps = max(x.get("global_step", 0) for x in log)
        print(json.dumps(rows[-1]), flush=True)
    if args.facts_minutes:
        for lang in ("en", "zh"):
            o = SummarizeOptions(data="facts", lang=lang, n_train=5000, n_eval=300, embed_dim=64, hidden_dim=128,
                                 max_source=80, max_decode_len=12, eval_max=300, min_freq=1)
            name = f"facts-{lang}"
            cfg = train_defaults(o).replace(max_minutes=args.facts_minutes, out=str(out / name), progress=False,
                                            final_splits=("test",))
            train(SummarizeTask(o), cfg)
            s = Summarizer.load(out / name / "checkpoint")
            rows.append({"name": name, **s.evaluate(split="test", beam=1, baselines=False),
                         "phrasings_exact_match": s.evaluate(split="test_phrasings", beam=1,
                                                             baselines=False)["exact_match"]})
            print(json.dumps(rows[-1]), flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| model | steps | ROUGE-1 | ROUGE-2 | ROUGE-L | repeated trigrams | copied | copied (OOV) | exact match |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pct = functools.partial(_percent, r)
        print(f"| {r['name']} | {r.get('steps') or ''} | {r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeL']:.2f} | "
              f"{pct('repeated_trigrams', 2)} | {pct('copied')} | {pct('copied_oov')} | {pct('exact_match')} |")

if __name__ == "__main__":
    main()
