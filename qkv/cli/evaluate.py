"""``qkv evaluate RUN...``: the metrics of runs of any application side by side, through the one evaluation every
command runs (:func:`qkv.apps.command.evaluation`: the predictor's ``evaluate``, what it skipped said on stderr)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..apps.command import DeviceOption, JsonOption, LimitOption, PlotOption, evaluation, load, plot_file
from ..apps.console import safe, write_json
from ..options import option
from .options import given, options_from_args
from .runs import settings_given

__all__ = ["COMMAND", "EvaluateCommand"]


@dataclass
class EvaluateCommand(JsonOption, PlotOption, LimitOption, DeviceOption):
    runs: list[str] = option(default_factory=list, positional=True, nargs="+", help="run or checkpoint directories "
                             "of any application, compared side by side")
    data: str | None = option(None, help="another data set in the run's format (default: each run's own data)")
    split: str = option("test", help="the split to evaluate (valid, test; question answering on facts also "
                        "test_phrasings)")
    beam: int | None = option(None, low=1, high=100, help="generators (translate, caption, summarize, speech): "
                              "beam size")
    max_len: int | None = option(None, low=1, help="generators: longest output (default: the application's)")
    buckets: str | None = option(None, help="translate: edges of the source-length buckets, e.g. 0,10,20,30,40,60")
    length_unit: str | None = option(None, choices=("tokens", "words"), help="translate: unit of the source lengths")
    on_error: str | None = option(None, choices=("raise", "skip"), requires=("data",),
                                  help="another data file (--data): bad rows stop with file:line, or are skipped "
                                       "and counted")

    FLAG_HELP = {"plot": "a chart (PNG/SVG) of the by-bucket figures (metrics named METRIC@BUCKET)",
                 "json": "write the figures as JSON ({run: {metric: value}}; NaN written null)"}


#: the settings ``qkv evaluate`` has flags for whatever the runs (each run's application says which it takes)
_SETTINGS = ("beam", "max_len", "buckets", "length_unit", "on_error")


def _fmt(v: float) -> str:
    return f"{int(v)}" if float(v).is_integer() and abs(v) >= 1 else f"{v:.4f}"


def evaluate(args) -> int:
    o = options_from_args(args, EvaluateCommand)
    plot = plot_file(o.plot) if o.plot else None  # settled first: printed == written
    settings = {k: v for k, v in given(args, EvaluateCommand).items() if k in _SETTINGS}
    settings.update(settings_given(args, getattr(args, "settings", ())))
    checkpoints = getattr(args, "checkpoints", {})
    figures: dict[str, dict[str, float]] = {}
    for run in o.runs:
        name = Path(run).name or run
        while name in figures:
            name += "'"
        figures[name] = evaluation(load(checkpoints.get(run, run), o.device), o.data, split=o.split, limit=o.limit,
                                   name=name, **settings)
    names = list(dict.fromkeys(m for f in figures.values() for m in f))
    print(f"split {o.split}")
    print("| metric | " + " | ".join(map(safe, figures)) + " |\n|---|" + "---|" * len(figures))
    for m in names:
        print(f"| {m} | " + " | ".join(_fmt(f[m]) if m in f else "" for f in figures.values()) + " |")
    if o.json:
        write_json(o.json, figures)
    if plot:
        from ..viz.plots import line_chart

        buckets = [m.partition("@") for m in names if "@" in m]
        metric = buckets[0][0] if buckets else None
        labels = [b for m, _, b in buckets if m == metric]
        if not labels:
            raise ValueError("--plot draws by-bucket figures (e.g. translation's BLEU by source length with "
                             "--buckets); these runs have none")
        path = line_chart({n: [f.get(f"{metric}@{b}", math.nan) for b in labels] for n, f in figures.items()},
                          labels, xlabel="bucket", ylabel=metric, path=plot)
        print(f"wrote {path}")
    return 0



#: the flags of ``qkv evaluate RUN...`` include the settings of the runs' applications (:mod:`.runs`)
TAKES_SETTINGS = True

#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("evaluate", "the metrics of runs of any application on a split of their data (or "
            "--data), side by side", EvaluateCommand, evaluate)
