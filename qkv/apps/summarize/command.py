"""``qkv summarize``: texts summarised by a summarisation run (with an HTML page of what was copied), or its ROUGE
on a file (``--evaluate``: :func:`qkv.cli.evaluate.evaluation`, as ``qkv evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...options import option
from ...viz.files import page_path
from ..command import (
    LimitOption,
    LMFusionOption,
    RunInputs,
    evaluation,
    finish,
    read_inputs,
    settings_of,
    write_outputs,
)
from ..console import safe
from .options import SummarizeSettings
from .predictor import Summarizer


@dataclass
class SummarizeCommand(SummarizeSettings, LMFusionOption, LimitOption, RunInputs):
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="texts to summarise")
    output: str | None = option(None, help="write the summaries here, one per line")
    html: str | None = option(None, metavar="HTML", help="write a page: each output word coloured by p_gen with "
                                                         "its attention over the source, and the final coverage")
    evaluate: str | None = option(None, metavar="DATA", help="instead: ROUGE, repeated trigrams and copied words "
                                                             "on a file ('debian'/'facts': the run's test split)")
    split: str = option("test", requires=("evaluate",), help="with --evaluate on the run's own data: the split")
    on_error: str | None = option(None, choices=("raise", "skip"), requires=("evaluate",),
                                  help="with --evaluate FILE: bad rows: stop, or skip and count them")

    FLAG_HELP = {"limit": "with --evaluate: at most this many examples",
                 "min_len": "shortest summary, in words",
                 "baselines": "with --evaluate: the ROUGE of the lead sentence and of the first 8 words too",
                 "json": "write the summaries as JSON rows, or with --evaluate the figures (NaN written null)",
                 "file": "a file of texts to summarise, one per line (a blank line is an error)",
                 "lm": "a language-model run (qkv train lm) of the summaries' tokens, fused into the beam (shallow "
                       "fusion; a copied word it does not know is scored as its <unk>)"}
    FLAG_ALIASES = {"limit": ("--limit",)}


def _settings(o: SummarizeCommand, summarizer, method: str = "predict") -> dict:
    return settings_of(o, summarizer, method, **o.fusion(summarizer))


def _evaluate(o: SummarizeCommand) -> int:
    if o.text or o.file or o.html or o.output or o.min_len:
        raise ValueError("--evaluate reads its texts from DATA: leave out the texts, --file, --output, --html and "
                         "--min-len")
    summarizer = Summarizer.load(o.run, o.device)
    own = o.evaluate in ("debian", "facts") and o.evaluate == summarizer.options.data

    def table(m: dict[str, float]) -> None:
        print(f"{int(m['examples'])} examples of {safe(o.evaluate)}, beam {o.beam}")
        print("| | ROUGE-1 | ROUGE-2 | ROUGE-L | repeated trigrams | copied words | outside-vocabulary copies |")
        print("|---|---|---|---|---|---|---|")
        print(f"| {summarizer.options.model} | {m['rouge1']:.2f} | {m['rouge2']:.2f} | {m['rougeL']:.2f} | "
              f"{100 * m['repeated_trigrams']:.2f}% | {100 * m['copied']:.1f}% | {100 * m['copied_oov']:.1f}% |")
        for name, label in (("lead", "lead sentence"), ("first8", "first 8 words")) if o.baselines else ():
            print(f"| {label} | {m[f'{name}_rouge1']:.2f} | {m[f'{name}_rouge2']:.2f} | {m[f'{name}_rougeL']:.2f} "
                  "| | | |")
        if "exact_match" in m:
            print(f"exact match {100 * m['exact_match']:.2f}%, F1 {100 * m['f1']:.2f}%")

    evaluation(summarizer, None if own else o.evaluate, split=o.split, limit=o.limit, json_path=o.json,
               report=table, **_settings(o, summarizer, "evaluate"))
    return 0


def summarize(o: SummarizeCommand) -> int:
    if o.evaluate:
        return _evaluate(o)
    html_path = page_path(o.html, option="--html") if o.html else None  # settled first: printed == written
    texts = read_inputs(o.text, o.file, "texts to summarise")
    summarizer = Summarizer.load(o.run, o.device)
    settings = _settings(o, summarizer)
    results = summarizer.predict(texts, **settings)
    if o.output:
        write_outputs(o.output, [r.text for r in results], "summaries")
    else:
        for r in results:
            print(safe(r.text))
    if html_path:
        from .page import CopyView, save_copy_page

        items = [CopyView(r.source_tokens, r.tokens, r.attention, r.p_gen, r.coverage,
                          caption=r.text + (f" [{note}]" if (note := summarizer.note(r, {})) else ""))
                 for r in results]
        print(f"wrote {save_copy_page(html_path, items, title=f'Summaries by {Path(o.run).name}')}")
    finish(summarizer, texts, results, o.json, **settings)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"summarize": (SummarizeCommand, summarize)}
