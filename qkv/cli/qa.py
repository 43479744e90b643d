"""``qkv train qa`` and ``qkv answer``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..tasks import qa as task
from .common import add_command, add_train_command, print_result, read_train_options, safe, use_color
from .options import options_from_args


@dataclass
class AnswerCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory")
    context: str | None = option(None, help="the passage to read")
    question: str | None = option(None, help="the question about it")
    html: str | None = option(None, metavar="HTML", help="write a page with the context shaded by the question's "
                                                         "attention")
    color: str = option("auto", choices=("auto", "always", "never"),
                        help="ANSI colours (auto: when stdout is a terminal)")
    top: int = option(3, low=0, help="without colours, list this many most attended tokens")
    evaluate: bool = option(False, help="instead: exact match and F1 on --data")
    data: str | None = option(None, help="with --evaluate: 'facts' (the run's own test splits), a SQuAD .json or a "
                                         "context<TAB>question<TAB>answer file")
    on_error: str = option("raise", choices=("raise", "skip"), help="with --evaluate: answers that are not spans of "
                                                                     "their context: stop, or skip and count them")
    json: str | None = option(None, help="with --evaluate: write the figures as JSON")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def train(args) -> int:
    from ..train import train as run_training

    options, config = read_train_options(args, task.QAOptions, task.train_defaults)
    print_result(run_training(task.QATask(options), config))
    return 0


def _evaluate(o: AnswerCommand) -> int:
    from ..data.squad import read_qa_file

    if o.context or o.question or o.html:
        raise ValueError("--evaluate reads questions from --data: leave out --context, --question and --html")
    if not o.data:
        raise ValueError("--evaluate needs --data (facts or a file)")
    reader = task.Reader.load(o.run, o.device)
    figures: dict[str, dict[str, float]] = {}
    if o.data == "facts":
        if reader.options.data != "facts":
            raise ValueError(f"--data facts: this run was trained on {reader.options.data}, not on facts")
        corpus = task.load_data(reader.options)
        chars = corpus.language == "zh"
        for split in ("test", "test_phrasings"):
            figures[split] = reader.evaluate(corpus.split(split), chars=chars)
    else:
        read = read_qa_file(o.data, on_error=o.on_error)
        figures[Path(o.data).name] = reader.evaluate(read.examples)
        if read.skipped:
            print(f"skipped {read.skipped} question(s) whose answer is not a span of the context, e.g. "
                  f"{safe(read.problems[0])}")
    print("| data | exact match | F1 | questions |\n|---|---|---|---|")
    for name, m in figures.items():
        print(f"| {safe(name)} | {m['exact_match']:.4f} | {m['f1']:.4f} | {int(m['questions'])} |")
    if o.json:
        Path(o.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {o.json}")
    return 0


def answer(args) -> int:
    from ..viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    o = options_from_args(args, AnswerCommand)
    if o.evaluate:
        return _evaluate(o)
    if o.data or o.json or o.on_error != "raise":
        raise ValueError("--data, --json and --on-error go with --evaluate")
    if not o.context or not o.question:
        raise ValueError("give --context and --question (or --evaluate --data PATH)")
    a = task.Reader.load(o.run, o.device).predict(o.context, o.question)
    color = use_color(o.color)
    print(f"answer: {safe(a.answer)}\tprobability {a.probability:.3f}\ttokens {a.start_token}-{a.end_token}")
    line = highlight_ansi([safe(t) for t in a.tokens], a.attention, color=color)
    if not color and o.top:
        line += "\t[" + ", ".join(f"{safe(t)} {w:.2f}" for t, w in top_tokens(a.tokens, a.attention, o.top)) + "]"
    print(f"attention: {line}")
    if o.html:
        item = HighlightedText(a.tokens, a.attention, caption=f"{a.question} -> {a.answer} ({a.probability:.3f})",
                               details=[("answer tokens", f"{a.start_token}-{a.end_token}")])
        print(f"wrote {save_html(o.html, [item], title='The question attends to the context')}")
    return 0


def register(commands, train_commands) -> None:
    add_train_command(train_commands, "qa", "train a reader that answers questions by pointing at a span",
                      task.QAOptions, task.train_defaults, train)
    add_command(commands, "answer", "answer a question about a context with a trained qa run, showing its attention",
                AnswerCommand, answer)
