"""``qkv train translate``, ``qkv translate`` and ``qkv evaluate``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..tasks import translate as task
from .common import add_command, add_train_command, input_texts, numbered_paths, print_result, read_train_options, safe
from .options import options_from_args


@dataclass
class TranslateCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory")
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="sentences to translate")
    file: str | None = option(None, help="a file of sentences, one per line")
    output: str | None = option(None, help="write the translations here, one per line")
    beam: int = option(5, low=1, high=100, help="beam size (1 = greedy)")
    max_len: int = option(100, low=1, help="longest translation, in tokens")
    plot: str | None = option(None, help="alignment heatmap PNG/SVG (numbered per sentence when several)")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


# the options that decide what load_data returns
_DATA_FIELDS = ("data", "src_lang", "reverse", "max_pairs", "max_length", "n_train", "n_eval", "data_seed")


def _buckets(text: str) -> tuple[tuple[int, int], ...]:
    try:
        edges = [int(x) for x in text.split(",")]
    except ValueError:
        edges = []
    if len(edges) < 2 or edges != sorted(set(edges)) or edges[0] < 0:
        raise ValueError(f"--buckets needs increasing edges like 0,10,20,30, got {text!r}")
    return tuple((lo if i == 0 else lo + 1, hi) for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)))


@dataclass
class EvaluateCommand:
    runs: list[str] = option(positional=True, nargs="+", help="run or checkpoint directories, compared side by side")
    data: str | None = option(None, help="'dates' or a corpus file (default: each run's own data)")
    split: str = option("test", choices=("valid", "test"), help="the split to translate")
    beam: int = option(5, low=1, high=100, help="beam size")
    max_len: int = option(100, low=1, help="longest translation, in tokens")
    max_sentences: int | None = option(None, low=1, help="translate at most this many sources")
    buckets: str = option("0,10,20,30,40,60", help="edges of the source-length buckets")
    length_unit: str = option("tokens", choices=("tokens", "words"), help="unit of the source lengths")
    plot: str | None = option(None, help="BLEU-by-length plot (PNG/SVG)")
    json: str | None = option(None, help="write the figures as JSON")
    device: str = option("auto", help="auto, cpu, cuda or cuda:N")


def train(args) -> int:
    from ..train import train as run_training

    options, config = read_train_options(args, task.TranslateOptions, task.train_defaults)
    print_result(run_training(task.TranslationTask(options), config))
    return 0


def translate(args) -> int:
    from ..viz.plots import alignment

    o = options_from_args(args, TranslateCommand)
    texts = input_texts(o.text, o.file, "sentences to translate")
    translator = task.Translator.load(o.run, o.device)
    results = translator.predict(texts, beam=o.beam, max_len=o.max_len)
    if o.output:
        Path(o.output).write_text("\n".join(r.text for r in results) + "\n", encoding="utf-8")
        print(f"wrote {len(results)} translations to {o.output}")
    else:
        for r in results:
            print(f"{safe(r.source)}\t{safe(r.text)}")
    if o.plot:
        for r, path in zip(results, numbered_paths(o.plot, len(results)), strict=True):
            alignment(r.attention, r.source_tokens, r.tokens, path=path, title=f"{r.source} -> {r.text}")
            print(f"wrote {path}")
    return 0


def evaluate(args) -> int:
    from ..metrics import bleu_by_length, translation_metrics
    from ..tasks.base import upgrade_options

    o = options_from_args(args, EvaluateCommand)
    buckets = _buckets(o.buckets)
    rows, totals, corpora = {}, {}, {}
    for run in o.runs:
        translator = task.Translator.load(run, o.device)
        options = translator.options
        if o.data:  # another data file: reset what only applied to the old data
            options = upgrade_options(task.TranslateOptions, {**dataclasses.asdict(options), "data": o.data})
        key = tuple(getattr(options, f) for f in _DATA_FIELDS)
        if key not in corpora:  # runs trained on the same data share one read of it
            corpora[key] = task.load_data(options)
        grouped = corpora[key].references(o.split)[: o.max_sentences]
        sources, refs = [s for s, _ in grouped], [r for _, r in grouped]
        results = translator.predict(sources, beam=o.beam, max_len=o.max_len)
        hyps = [r.text for r in results]
        lengths = [len(r.source_tokens) if o.length_unit == "tokens" else len(r.source.split()) for r in results]
        name = Path(run).name or run
        totals[name] = translation_metrics(hyps, refs)
        rows[name] = bleu_by_length(hyps, refs, lengths, buckets)
    print(f"split {o.split}, beam {o.beam}")
    print("| run | BLEU | chrF | exact match | sentences |\n|---|---|---|---|---|")
    for name, m in totals.items():
        print(f"| {safe(name)} | {m['bleu']:.2f} | {m['chrf']:.2f} | {m['exact_match']:.4f} | {int(m['sentences'])} |")
    print(f"\nBLEU by source length ({o.length_unit}):")
    print("| bucket | " + " | ".join(map(safe, rows)) + " | sentences |\n|---|" + "---|" * (len(rows) + 1))
    first = next(iter(rows.values()))
    for i, row in enumerate(first):
        print(f"| {row['bucket']} | " + " | ".join(f"{rows[n][i]['bleu']:.2f}" for n in rows) +
              f" | {int(row['sentences'])} |")
    if o.json:
        Path(o.json).write_text(json.dumps({"totals": totals, "buckets": rows}, indent=2), encoding="utf-8")
        print(f"wrote {o.json}")
    if o.plot:
        from ..viz.plots import line_chart

        path = line_chart({n: [r["bleu"] for r in rs] for n, rs in rows.items()}, [r["bucket"] for r in first],
                          xlabel=f"source length ({o.length_unit})", ylabel="BLEU", path=o.plot)
        print(f"wrote {path}")
    return 0


def register(commands, train_commands) -> None:
    add_train_command(train_commands, "translate", "train a translator (dates or a Tatoeba/Anki corpus)",
                      task.TranslateOptions, task.train_defaults, train)
    add_command(commands, "translate", "translate text with a trained run, and plot its alignment",
                TranslateCommand, translate)
    add_command(commands, "evaluate", "BLEU, chrF, exact match and BLEU by source length of translation runs",
                EvaluateCommand, evaluate)
