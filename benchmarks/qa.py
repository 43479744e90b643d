"""Question answering on the generated fact passages: the three readers side by side.

    python benchmarks/qa.py                          # en and zh, reader / bidaf / transformer, 5 minutes each
    python benchmarks/qa.py --lang zh --models reader --minutes 2
    python benchmarks/qa.py --lang en,mixed --models reader --minutes 2   # one model for both languages vs English
    python benchmarks/qa.py --quick                  # a few steps, a smoke test
    python benchmarks/qa.py --runs runs/budget/qa-seed0 runs/budget/qa-seed1   # score trained runs, per language

Each reader trains with the project's trainer and the ``qkv train qa`` defaults (3 epochs of 20,000 questions,
batch 32; 10 epochs for the Transformer, with ``PRESETS``' changes) on one CPU thread, stopped by the trainer at
``--minutes`` if the epochs take longer; the best weights on the validation split (held-out entities) are then
scored on

* ``test``: 1,000 questions about held-out entities (names, places, things, organisations and years never seen
  in training), phrased as in training;
* ``test_phrasings``: 1,000 questions about held-out entities with phrasings never seen in training;
* hand-written questions about real single-sentence facts, in ``tests/fixtures/qa/``: ``handwritten-design.tsv`` (32
  English, 25 Chinese), written first and used while widening the generator (its verbs, names and templates now
  cover much of it), and ``handwritten-fresh.tsv`` (30 English, 24 Chinese), written after the generator was
  settled and never used to change it: verbs, names and sentence shapes the generator does not have ("founded",
  "unveiled", "Ludwig van Beethoven", "亨利·福特", "研制出").

Printed per reader: SQuAD exact match and F1 (character F1 for Chinese), the parameters, the training time and the
mean attention mass on the answer's tokens (the question's attention, summed over the gold span). A ``mixed`` reader
(``--lang both`` of the facts: English and Chinese questions half and half) is scored on each language apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import record_flag  # noqa: E402

from qkv.apps.qa import QAOptions, QATask, Reader, train_defaults  # noqa: E402
from qkv.apps.qa.squad import read_qa_tsv  # noqa: E402
from qkv.data.facts import QUESTION_KINDS  # noqa: E402
from qkv.train import train  # noqa: E402

MODELS = ("reader", "bidaf", "transformer")
HANDWRITTEN = {name: ROOT / "tests" / "fixtures" / "qa" / f"handwritten-{name}.tsv" for name in ("design", "fresh")}
# options other than the `qkv train qa` defaults (the Transformer overfits the training names without more <unk>s)
PRESETS = {"transformer": {"dim": 64, "dropout": 0.0, "word_dropout": 0.3}}


def per_kind(reader, examples, chars: bool) -> dict[str, float]:
    """Exact match of each question kind (who/when/where/what)."""
    return {k: reader.score([e for e in examples if e.kind == k], chars=chars)["exact_match"]
            for k in QUESTION_KINDS}


def language(example) -> str:
    return "zh" if any("\u4e00" <= c <= "\u9fff" for c in example.question) else "en"


def bench(lang: str, model: str, minutes: float, quick: bool, seed: int, tokenizer: str = "auto") -> list[dict]:
    """One reader trained on ``lang`` facts (``mixed``: both languages), a row per language it is scored on."""
    extra = {"n_train": 300, "n_eval": 50} if quick else {}
    options = QAOptions(data="facts", lang="both" if lang == "mixed" else lang, model=model, tokenizer=tokenizer,
                        **PRESETS.get(model, {}), **extra)
    rows = []
    with tempfile.TemporaryDirectory() as out:
        config = train_defaults(options).replace(max_minutes=minutes, out=out, progress=False, seed=seed,
                                                 max_steps=5 if quick else None)
        task = QATask(options)
        result = train(task, config)
        params = sum(p.numel() for p in task.build_model().parameters())
        rows = score_run(Reader.load(out), lang=lang, model=model, params=params, seconds=result.state.elapsed,
                         steps=result.state.global_step, stopped=result.stopped)
    return rows


def score_run(reader: Reader, **row) -> list[dict]:
    """A row per language ``reader`` was trained on, each scored on its run's test splits and the hand-written
    questions (``row``: what else the rows say)."""
    corpus = reader.dataset()
    rows = []
    for scored in (("en", "zh") if reader.options.lang == "both" else (reader.options.lang,)):
        chars = scored == "zh"
        m = {s: reader.score([e for e in corpus.split(s) if language(e) == scored], chars=chars)
             for s in ("test", "test_phrasings")}
        kinds = per_kind(reader, [e for e in corpus.split("test_phrasings") if language(e) == scored], chars)
        for name, path in HANDWRITTEN.items():
            hand = [e for e in read_qa_tsv(path).examples if language(e) == scored]
            m[f"handwritten_{name}"] = reader.score(hand, chars=chars) if hand else {}
        rows.append({**row, "scored": scored, "kinds": kinds,
                     **{f"{s}_{k}": m[s].get(k, float("nan")) for s in m
                        for k in ("exact_match", "f1", "attention_mass")}})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lang", default="en,zh", help="comma-separated: en, zh, mixed (one reader on both)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: reader,bidaf,transformer")
    p.add_argument("--minutes", type=float, default=5.0, help="training budget of each reader")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokenizer", choices=("auto", "word", "char"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", nargs="+", help="score these trained runs (e.g. benchmarks/budget.py's) instead of "
                                             "training")
    record_flag(p, "qa", "one figure per seed")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    langs = [x for x in args.lang.split(",") if x]
    if any(x not in ("en", "zh", "mixed") for x in langs):
        p.error(f"--lang takes en, zh and mixed, got {args.lang}")
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"budget {args.minutes} min per reader, tokenizer {args.tokenizer}")
    print("| trained on | scored on | model | params | train time | steps | test EM | test F1 | held-out phrasings EM"
          " | held-out phrasings F1 | hand-written EM (design / fresh) | attention mass on the answer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    if args.runs:
        trained = []
        for run in args.runs:
            steps = [json.loads(line).get("global_step", 0) for line in (Path(run) / "metrics.jsonl").open()]
            reader = Reader.load(run)
            params = sum(x.numel() for x in reader.model.parameters())
            lang = {"both": "mixed"}.get(reader.options.lang, reader.options.lang)
            trained.append(score_run(reader, lang=lang, model=reader.options.model, params=params,
                                     seconds=float("nan"), steps=max(steps), stopped=run))
    else:
        trained = (bench(lang, model, args.minutes, args.quick, args.seed, args.tokenizer)
                   for lang in langs for model in models)
    for group in trained:
        for r in group:
            rows.append(r)
            print(f"| {r['lang']} | {r['scored']} | {r['model']} | {r['params'] / 1e3:.0f}k | {r['seconds']:.0f} s "
                  f"({r['stopped']}) | {r['steps']} | {100 * r['test_exact_match']:.1f} | "
                  f"{100 * r['test_f1']:.1f} | {100 * r['test_phrasings_exact_match']:.1f} | "
                  f"{100 * r['test_phrasings_f1']:.1f} | {100 * r['handwritten_design_exact_match']:.1f} / "
                  f"{100 * r['handwritten_fresh_exact_match']:.1f} | "
                  f"{r['test_attention_mass']:.3f} |", flush=True)
    print("\nHeld-out phrasings, exact match by question kind:\n")
    print("| trained on | scored on | model | " + " | ".join(QUESTION_KINDS) + " |\n|---|---|---|"
          + "---|" * len(QUESTION_KINDS))
    for r in rows:
        print(f"| {r['lang']} | {r['scored']} | {r['model']} | "
              + " | ".join(f"{100 * r['kinds'][k]:.1f}" for k in QUESTION_KINDS) + " |")
    if args.record and not args.quick:
        record_results(rows, len(args.runs or []))


def record_results(rows: list[dict], runs: int) -> None:
    """Exact match per scored language, the runs' figures side by side ("a / b / c"), into qa.json."""
    from record import measurement, record

    def pct(x):
        return "100" if x == 1 else f"{100 * x:.1f}"

    items = []
    for lang in dict.fromkeys(r["scored"] for r in rows):
        mine = [r for r in rows if r["scored"] == lang]
        runs_text = f"{runs} runs" if runs else f"{len(mine)} readers ({', '.join(r['model'] for r in mine)})"
        for key, field, what in (("entities", "test_exact_match", "held-out entities"),
                                 ("phrasings", "test_phrasings_exact_match", "held-out phrasings"),
                                 ("handwritten", "handwritten_fresh_exact_match", "hand-written questions, fresh set")):
            values = [r[field] for r in mine]
            items.append(measurement(f"{key}-{lang}", f"{what}, {lang}, {runs_text}", 100 * min(values), "% exact",
                                     figure=" / ".join(pct(v) for v in values)))
    record("qa", items)


if __name__ == "__main__":
    main()
