"""The commands every application shares, driven by the registry of :mod:`qkv.tasks`: ``qkv train NAME``,
``qkv evaluate RUN...`` and ``qkv view RUN`` (a run knows its application)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..tasks import APPLICATIONS, ViewInput, application, application_of
from ..viz.files import page_path, picture_path, write_atomic
from .common import add_command, add_train_command, input_texts, numbered_paths, print_result, read_train_options, safe
from .options import options_from_args

__all__ = ["register", "EvaluateCommand", "ViewCommand"]


def _train(name: str):
    def train(args) -> int:
        app = application(name)
        options, config = read_train_options(args, app.options, app.train_defaults, app.budget_defaults)
        results = app.run_training(options, config)
        many = len(results) > 1
        for k, result in enumerate(results):
            print_result(result, head=f"fold {k + 1}: " if many else "")
        if many:
            metric = config.monitor or "loss"
            values = [r.metrics.get("test", {}).get(metric, math.nan) for r in results]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            print(f"{len(results)}-fold test {metric}: {mean:.4f} +- {std:.4f}")
            if config.out:
                print(f"run directory: {config.out}")
        return 0
    return train


@dataclass
class EvaluateCommand:
    runs: list[str] = option(positional=True, nargs="+", help="run or checkpoint directories of any application, "
                             "compared side by side")
    data: str | None = option(None, help="another data set in the run's format (default: each run's own data)")
    split: str = option("test", help="the split to evaluate (valid, test; question answering on facts also "
                        "test_phrasings)")
    limit: int | None = option(None, low=1, flag="--max-examples", help="evaluate at most this many examples")
    beam: int | None = option(None, low=1, high=100, help="generators (translate, caption): beam size")
    max_len: int | None = option(None, low=1, help="generators (translate, caption): longest output, in tokens "
                                 "(default: translate the run's max-decode-len, caption 40)")
    buckets: str | None = option(None, help="translate: edges of the source-length buckets, e.g. 0,10,20,30,40,60")
    length_unit: str | None = option(None, choices=("tokens", "words"), help="translate: unit of the source lengths")
    on_error: str | None = option(None, choices=("raise", "skip"),
                                  help="question answering on a file: answers that are not spans of their context")
    plot: str | None = option(None, help="a chart (PNG/SVG) of the by-bucket figures (metrics named METRIC@BUCKET)")
    json: str | None = option(None, help="write the figures as JSON ({run: {metric: value}})")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def _fmt(v: float) -> str:
    return f"{int(v)}" if float(v).is_integer() and abs(v) >= 1 else f"{v:.4f}"


def evaluate(args) -> int:
    o = options_from_args(args, EvaluateCommand)
    plot = picture_path(o.plot, option="--plot") if o.plot else None  # settled first: printed == written
    settings = {k: v for k in ("beam", "max_len", "buckets", "length_unit", "on_error")
                if (v := getattr(o, k)) is not None}
    figures: dict[str, dict[str, float]] = {}
    for run in o.runs:
        predictor = application_of(run).predictor.load(run, o.device)
        name = Path(run).name or run
        while name in figures:
            name += "'"
        figures[name] = predictor.evaluate(o.data, split=o.split, limit=o.limit, **settings)
    names = list(dict.fromkeys(m for f in figures.values() for m in f))
    print(f"split {o.split}")
    print("| metric | " + " | ".join(map(safe, figures)) + " |\n|---|" + "---|" * len(figures))
    for m in names:
        print(f"| {m} | " + " | ".join(_fmt(f[m]) if m in f else "" for f in figures.values()) + " |")
    if o.json:
        print(f"wrote {write_atomic(o.json, json.dumps(figures, indent=2) + chr(10), option='--json')}")
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


def _numbers(xs: list[str]) -> list[int]:
    return [int(x) for s in xs for x in s.split(",") if x.strip()]


@dataclass
class ViewCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory of any application, or a saved "
                      "Hugging Face model directory (save_pretrained's layout, with its tokenizer)")
    text: list[str] = option(default_factory=list, positional=True, nargs="*",
                             help="inputs to look at (text applications); one page each")
    file: str | None = option(None, help="a file of inputs, one per line")
    image: list[str] | None = option(None, repeat=True, metavar="FILE",
                                     help="an image file (image applications; repeatable)")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the run's test split (repeatable)")
    question: str | None = option(None, help="the question (question-answering runs; the text is the context)")
    out: str = option("attention.html", help="the page to write (numbered NAME-0.html, NAME-1.html... for several)")
    rollout: bool = option(True, help="add attention rollout for stacks of self-attention")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    generate: int | None = option(None, low=1, metavar="N", help="a Hugging Face model generates up to N tokens "
                                  "from the text, its attention recorded at every step")
    layers: list[int] | None = option(None, repeat=True, parse=_numbers, metavar="L",
                                      help="the layers to record (Hugging Face models; e.g. 0,5; default all)")
    heads: list[int] | None = option(None, repeat=True, parse=_numbers, metavar="H",
                                     help="the heads to record (Hugging Face models; default all)")
    strategy: str = option("greedy", choices=("greedy", "sample", "beam"), help="how --generate chooses tokens")
    beam: int = option(4, low=2, applies={"strategy": ("beam",)}, help="hypotheses of --strategy beam")
    seed: int = option(0, low=0, applies={"strategy": ("sample",)}, help="seed of --strategy sample")


def view(args) -> int:
    from ..viz.page import save_attention_page

    o = options_from_args(args, ViewCommand)
    out = page_path(o.out, option="--out")  # settled first: printed == written
    inputs = [ViewInput(image=path, question=o.question) for path in o.image or []] + \
        [ViewInput(index=i, question=o.question) for i in o.index or []]
    if o.text or o.file or not inputs:
        inputs += [ViewInput(text=t, question=o.question)
                   for t in input_texts(o.text, o.file, "a text to look at (or --image FILE)")]
    from ..integrations.transformers_view import is_hf_model_dir

    if is_hf_model_dir(o.run):  # a Hugging Face model: its text through the qkv backend
        from ..integrations.transformers_view import view_page_input

        if o.image or o.index or o.question:
            raise ValueError("a Hugging Face model directory takes texts only (no --image, --index or --question)")
        if o.generate is None and o.strategy != "greedy":
            raise ValueError("--strategy chooses the tokens of --generate N: give --generate")

        def show(given: ViewInput):
            if o.generate is not None:
                from ..integrations.generation import view_generation

                return view_generation(o.run, given.text, o.generate, strategy=o.strategy, beams=o.beam,
                                       seed=o.seed, layers=o.layers, heads=o.heads, device=o.device)
            return view_page_input(o.run, given.text, device=o.device, layers=o.layers, heads=o.heads)
    elif o.generate is not None or o.layers is not None or o.heads is not None or o.strategy != "greedy":
        raise ValueError("--generate, --layers, --heads and --strategy apply to Hugging Face model directories")
    else:
        show = application_of(o.run).predictor.load(o.run, o.device).view
    for path, given in zip(numbered_paths(str(out), len(inputs)), inputs, strict=True):
        page = show(given)
        written = save_attention_page(path, page.records, rollout=o.rollout, **page.page_kwargs())
        print(f"wrote {written} ({len(page.records)} attention modules)")
    return 0


def register(commands, train_commands) -> None:
    for name in APPLICATIONS:
        app = application(name)
        add_train_command(train_commands, name, app.help, app.options, app.train_defaults, _train(name))
    add_command(commands, "evaluate", "the metrics of runs of any application on a split of their data (or "
                "--data), side by side", EvaluateCommand, evaluate)
    add_command(commands, "view", "write one offline HTML page showing every attention of a run's model",
                ViewCommand, view)
