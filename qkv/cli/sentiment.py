"""``qkv train sentiment`` and ``qkv classify``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..tasks import sentiment as task
from .common import add_command, add_train_command, input_texts, print_result, read_train_options, safe, use_color
from .options import options_from_args


@dataclass
class ClassifyCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory")
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="texts to classify")
    file: str | None = option(None, help="a file of texts, one per line")
    html: str | None = option(None, metavar="HTML", help="write a page with every text's words shaded by attention")
    title: str = option("Attention over words", help="title of the HTML page")
    color: str = option("auto", choices=("auto", "always", "never"),
                        help="ANSI colours (auto: when stdout is a terminal)")
    top: int = option(3, low=0, help="without colours, list this many most attended words")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def train(args) -> int:
    options, config = read_train_options(args, task.SentimentOptions, task.train_defaults)
    summary = task.train_folds(options, config)
    for k, result in enumerate(summary["runs"]):
        print_result(result, head=f"fold {k + 1}: " if options.folds else "")
    if options.folds:
        print(f"{options.folds}-fold test accuracy: {summary['mean']:.4f} +- {summary['std']:.4f}")
        if config.out:
            path = Path(config.out) / "kfold.json"
            path.write_text(json.dumps({k: summary[k] for k in ("test_accuracy", "mean", "std")}, indent=1) + "\n",
                            encoding="utf-8")
            print(f"wrote {path}")
            print(f"run directory: {config.out}")
    return 0


def classify(args) -> int:
    from ..viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    o = options_from_args(args, ClassifyCommand)
    texts = input_texts(o.text, o.file, "texts to classify")
    predictions = task.SentimentClassifier.load(o.run, o.device).predict(texts)
    color = use_color(o.color)
    for p in predictions:
        line = f"{p.caption}\t{highlight_ansi([safe(t) for t in p.tokens], p.weights, color=color)}"
        if not color and o.top:
            line += "\t[" + ", ".join(f"{safe(t)} {w:.2f}" for t, w in top_tokens(p.tokens, p.weights, o.top)) + "]"
        print(line)
    if o.html:
        items = [HighlightedText(p.tokens, p.weights, caption=p.caption,
                                 details=[(k, f"{v:.3f}") for k, v in p.probabilities.items()]) for p in predictions]
        print(f"wrote {save_html(o.html, items, title=o.title)}")
    return 0


def register(commands, train_commands) -> None:
    add_train_command(train_commands, "sentiment", "train a text classifier with attention (sentiment by default)",
                      task.SentimentOptions, task.train_defaults, train)
    add_command(commands, "classify", "classify text with a trained sentiment run, showing its attention",
                ClassifyCommand, classify)
