"""Summarisation: ROUGE-1/2/L, repeated trigrams and copied words on the Debian descriptions' test split for the lead
and first-8-words baselines, seq2seq, pointer, pointer + coverage and the Transformer with copy attention, each
trained for a time budget on one thread; and exact match of generated answers on the facts' held-out entities.

    python benchmarks/summarize.py --minutes 5 --facts-minutes 3 --out runs/bench-summarize

Pointer + coverage switches coverage on for the last part of its own budget (``--coverage-at``: the fraction of the
training done before, ``coverage_from`` as a fraction; See et al. add it to a converged model). Every model is also
decoded with ``--no-repeat-ngram`` blocking when it is given (rows ``... + blocking``). Prints a Markdown table and
writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from pathlib import Path

import torch
from record import record_flag

from qkv.apps.summarize import (
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


def run(name: str, options: SummarizeOptions, data, minutes: float, out: Path, args) -> list[dict]:
    cfg = train_defaults(options).replace(max_minutes=minutes, out=str(out / name), progress=False,
                                          final_splits=("test",))
    t0 = time.time()
    result = train(SummarizeTask(options, data), cfg)
    train_s = time.time() - t0
    summarizer = Summarizer.load(out / name / "checkpoint")
    settings = [("", {"no_repeat_ngram_size": 0})]
    if args.no_repeat_ngram or args.coverage_penalty:
        settings.append((" + blocking", {"no_repeat_ngram_size": args.no_repeat_ngram,
                                         "coverage_penalty": args.coverage_penalty}))
    rows = []
    for suffix, extra in settings:
        t1 = time.time()
        figures = summarizer.evaluate(split="test", limit=args.test, beam=args.beam, baselines=False, **extra)
        rows.append({"name": name + suffix, "steps": int(result.state.global_step), "minutes": minutes,
                     "train_s": round(train_s, 1), "decode_s": round(time.time() - t1, 1), **extra, **figures})
    return rows


def _percent(row: dict, key: str, digits: int = 1) -> str:
    return "" if key not in row else f"{100 * row[key]:.{digits}f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training budget of each Debian model")
    p.add_argument("--facts-minutes", type=float, default=3.0, help="training budget of each facts model (0: none)")
    p.add_argument("--models", default=",".join(MODELS), help="which Debian models ('' for none)")
    p.add_argument("--facts-model", default="pointer", choices=("pointer", "transformer"))
    p.add_argument("--facts-train", type=int, default=5000, help="training questions of the facts")
    p.add_argument("--facts-langs", default="en,zh")
    p.add_argument("--coverage-at", type=float, default=0.75, help="pointer + coverage: coverage on once this "
                                                                   "fraction of its training is done")
    p.add_argument("--no-repeat-ngram", type=int, default=0, help="also decode with this n-gram blocking")
    p.add_argument("--coverage-penalty", type=float, default=0.0, help="and this coverage penalty (Wu et al.)")
    p.add_argument("--test", type=int, default=1000, help="test examples decoded")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--debian-file", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/bench-summarize")
    record_flag(p, "summarize")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("qkv.apps.summarize").setLevel(logging.INFO)  # when coverage is switched on
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    base = dict(SMALL, **({"debian_file": args.debian_file} if args.debian_file else {}))
    if args.models:
        data = load_data(SummarizeOptions(**base))
        test = data.split("test")[:args.test]
        for name, make in (("lead", lead), ("first-8-words", first_words)):
            rows.append({"name": name, **summary_metrics([make(e.source) for e in test], [e.target for e in test])})
    for name in filter(None, args.models.split(",")):
        extra = dict(MODELS[name])
        if name == "pointer+coverage":
            extra["coverage_from"] = args.coverage_at
        for row in run(name, _options(base, extra), data, args.minutes, out, args):
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.facts_minutes:
        for lang in args.facts_langs.split(","):
            sizes = ({"dim": 128, "num_heads": 4, "num_layers": 2} if args.facts_model == "transformer"
                     else {"embed_dim": 64, "hidden_dim": 128})
            o = SummarizeOptions(data="facts", lang=lang, n_train=args.facts_train, n_eval=300, max_source=80,
                                 max_decode_len=12, eval_max=300, min_freq=1, model=args.facts_model, **sizes)
            name = f"facts-{lang}-{args.facts_model}"
            cfg = train_defaults(o).replace(max_minutes=args.facts_minutes, out=str(out / name), progress=False,
                                            final_splits=("test",))
            result = train(SummarizeTask(o), cfg)
            s = Summarizer.load(out / name / "checkpoint")
            rows.append({"name": name, "steps": int(result.state.global_step),
                         **s.evaluate(split="test", beam=1, baselines=False, no_repeat_ngram_size=0),
                         "phrasings_exact_match": s.evaluate(split="test_phrasings", beam=1, baselines=False,
                                                             no_repeat_ngram_size=0)["exact_match"]})
            print(json.dumps(rows[-1]), flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| model | steps | ROUGE-1 | ROUGE-2 | ROUGE-L | repeated trigrams | copied | copied (OOV) | exact match |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pct = functools.partial(_percent, r)
        print(f"| {r['name']} | {r.get('steps') or ''} | {r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeL']:.2f} | "
              f"{pct('repeated_trigrams', 2)} | {pct('copied')} | {pct('copied_oov')} | {pct('exact_match')} |")
    if args.record:
        record_results(rows, args)


def record_results(rows: list[dict], args) -> None:
    """ROUGE-L of every row (and repeated trigrams, exact match where a row has them) into summarize.json; keys
    ``rougeL-NAME``, ``repeats-NAME``, ``exact-NAME``."""
    from record import measurement, record

    items = []
    for r in rows:
        name, steps = r["name"], f", {r['steps']:,} steps" if r.get("steps") else ""
        if "rougeL" in r and not name.startswith("facts"):
            items.append(measurement(f"rougeL-{name}", f"{name}, {args.minutes:g} minutes{steps}, beam {args.beam}: "
                                     "ROUGE-L", r["rougeL"], figure=f"{r['rougeL']:.2f}"))
        if r.get("repeated_trigrams") is not None:
            items.append(measurement(f"repeats-{name}", f"{name}: repeated trigrams", 100 * r["repeated_trigrams"],
                                     figure=f"{100 * r['repeated_trigrams']:.2f}%"))
        if name.startswith("facts") and r.get("exact_match") is not None:
            items.append(measurement(f"exact-{name}", f"answers written out, {name}, {args.facts_minutes:g} "
                                     f"minutes{steps}: exact match", 100 * r["exact_match"],
                                     figure=f"{100 * r['exact_match']:.1f}%"))
    record("summarize", items, threads=args.threads)


if __name__ == "__main__":
    main()
