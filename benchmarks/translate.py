"""Translation benchmarks: the date task for every model, and a parallel corpus under a CPU budget.

    python benchmarks/translate.py dates [--minutes 2] [--threads 1]
    python benchmarks/translate.py corpus --data ../shared/data/tatoeba-eng-fra.tsv.gz --src-lang en \\
        --models fixed bahdanau transformer --minutes 10
    python benchmarks/translate.py report --json-in a.json b.json   # one table from runs made apart

Each model is trained with the project's trainer under the same wall-clock budget (``--minutes``), then
evaluated on the test split (greedy for dates, beam 5 for corpora): exact match, BLEU, chrF, training
tokens/s, parameters, and the time at which validation exact match first reached 99% (dates). ``corpus`` also
prints BLEU by source length (words), the comparison of Bahdanau et al. (2015, Fig. 2). Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import record_flag  # noqa: E402

from qkv.apps.translate import TranslateOptions, TranslateTask, translate_batch  # noqa: E402
from qkv.metrics import bleu_by_length, translation_metrics  # noqa: E402
from qkv.train import TrainConfig, train  # noqa: E402


def run(opts: TranslateOptions, minutes: float, batch_size: int, lr: float, out: Path, eval_every: int,
        beam: int, monitor: str) -> dict:
    task = TranslateTask(opts)
    cfg = TrainConfig(epochs=100, max_minutes=minutes, batch_size=batch_size, lr=lr, warmup_steps=200,
                      schedule="inverse_sqrt", out=str(out), progress=False, monitor=monitor, eval_every=eval_every,
                      final_splits=(), log_every=50)
    t0 = time.perf_counter()
    result = train(task, cfg)
    seconds = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x["event"] == "eval"]
    reach = next((x["time"] for x in evals if x["metrics"].get("exact_match", 0) >= 0.99), None)
    speeds = [x["tokens_per_s"] for x in lines if x["event"] == "train" and "tokens_per_s" in x]
    grouped = task.data.references("test")[: opts.eval_max]
    hyps = translate_batch(result.model, task.src_tokenizer, task.tgt_tokenizer, [s for s, _ in grouped], beam=beam,
                           max_len=opts.max_decode_len)
    refs = [r for _, r in grouped]
    test = translation_metrics([h.text for h in hyps], refs)
    lengths = [len(s.split()) for s, _ in grouped]
    buckets = bleu_by_length([h.text for h in hyps], refs, lengths, [(1, 4), (5, 7), (8, 10), (11, 15), (16, 60)])
    return {"model": opts.model, "score": opts.score_name, "params": sum(p.numel() for p in result.model.parameters()),
            "steps": result.state.global_step, "seconds": seconds, "reach99": reach,
            "tokens_per_s": sum(speeds) / len(speeds) if speeds else float("nan"), "test": test, "buckets": buckets}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["dates", "corpus", "report"],
                    help="report: print the tables of earlier runs' --json files (given as --json-in)")
    ap.add_argument("--json-in", nargs="+", default=[], help="report: JSON files written by --json, in order")
    ap.add_argument("--data", default="dates")
    ap.add_argument("--src-lang", default=None)
    ap.add_argument("--models", nargs="+", default=["fixed", "bahdanau", "luong", "transformer"])
    ap.add_argument("--minutes", type=float, default=2.0, help="training budget per model")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--max-pairs", type=int, default=None)
    ap.add_argument("--json", help="also write the results as JSON")
    record_flag(ap, "translate")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    if args.what == "report":
        if not args.json_in:
            ap.error("report needs --json-in FILE [FILE ...]")
        for name in args.json_in:
            rows += json.loads(Path(name).read_text())
        print_tables(rows, corpus="buckets" in rows[0])
        return
    for model in args.models:
        if args.what == "dates":
            opts = TranslateOptions(data="dates", model=model, eval_max=1000)
            batch, lr, every, beam, monitor = 128, 3e-3, 100, 1, "exact_match"
        else:
            sizes = {"dim": 256, "num_layers": 2, "num_heads": 4} if model == "transformer" else \
                {"embed_dim": 256, "hidden_dim": 256, "num_layers": 1}
            opts = TranslateOptions(data=args.data, model=model, src_lang=args.src_lang, max_pairs=args.max_pairs,
                                    eval_max=2000, dropout=0.1, **sizes)
            batch, lr, every, beam, monitor = 64, 1e-3 if model != "transformer" else 7e-4, 0, 5, "bleu"
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run(opts, args.minutes, batch, lr, Path(tmp) / model, every, beam, monitor))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "buckets"}), file=sys.stderr)
    cmd = "python benchmarks/translate.py " + " ".join(sys.argv[1:])
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}. Command: `{cmd}`. Budget: {args.minutes} min of training per model.\n")
    print_tables(rows, corpus=args.what == "corpus")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.record:
        from record import measurement, record

        prefix = "dates" if args.what == "dates" else f"{Path(args.data).name.split('.')[0]}"
        record("translate", [measurement(
            f"{prefix}-{r['model']}",
            f"{prefix}, {args.minutes:g} minutes, {r['model']}: test {'exact match' if prefix == 'dates' else 'BLEU'}"
            + (f" (99% on valid after {r['reach99']:.0f} s)" if r.get("reach99") is not None else ""),
            r["test"]["exact_match"] if prefix == "dates" else r["test"]["bleu"],
            figure=f"{r['test']['exact_match']:.4f}" if prefix == "dates" else f"{r['test']['bleu']:.1f}")
            for r in rows])


def print_tables(rows: list[dict], corpus: bool) -> None:
    print("| model | score | parameters | steps | train tokens/s | valid exact match >= 99% after | "
          "test exact match | test BLEU | test chrF |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        reach = f"{r['reach99']:.0f} s" if r["reach99"] is not None else "not reached"
        t = r["test"]
        print(f"| {r['model']} | {r['score'] if r['model'] != 'fixed' else '-'} | {r['params']:,} | {r['steps']} | "
              f"{r['tokens_per_s']:,.0f} | {reach} | {t['exact_match']:.4f} | {t['bleu']:.2f} | {t['chrf']:.2f} |")
    if corpus:
        print("\nTest BLEU by source length (words):\n")
        print("| length | " + " | ".join(r["model"] for r in rows) + " | sentences |")
        print("|---|" + "---|" * (len(rows) + 1))
        for i, b in enumerate(rows[0]["buckets"]):
            print(f"| {b['bucket']} | " + " | ".join(f"{r['buckets'][i]['bleu']:.2f}" for r in rows)
                  + f" | {int(b['sentences'])} |")


if __name__ == "__main__":
    main()
