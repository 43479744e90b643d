"""``qkv answer``: a question about a context answered by a question-answering run (:mod:`.predict`'s way), the
context shaded by the question's attention, or the run evaluated (``--evaluate``:
:func:`qkv.cli.evaluate.evaluation`, as ``qkv evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...options import option
from ..command import DeviceOption, JsonOption, RunArgument, evaluation, finish
from ..console import safe, use_color, write_json
from .options import QASettings
from .predictor import Reader


@dataclass
class AnswerCommand(QASettings, JsonOption, DeviceOption, RunArgument):
    context: str | None = option(None, help="the passage to read")
    question: str | None = option(None, help="the question about it")
    html: str | None = option(None, metavar="HTML", help="write a page with the context shaded by the question's "
                                                         "attention")
    color: str = option("auto", choices=("auto", "always", "never"),
                        help="ANSI colours (auto: when stdout is a terminal)")
    top: int = option(3, low=0, excludes={"color": ("always",)},
                      help="without colours, list this many most attended tokens")
    evaluate: bool = option(False, help="instead: exact match and F1 on --data")
    data: str | None = option(None, requires=("evaluate",), help="with --evaluate: 'facts' (the run's own test "
                              "splits), a SQuAD .json or a context<TAB>question<TAB>answer file")
    on_error: str = option("raise", choices=("raise", "skip"), requires=("evaluate",),
                           help="with --evaluate: answers that are not spans of their context: stop, or skip and "
                                "count them")

    FLAG_HELP = {"json": "write the answer as a JSON row, or with --evaluate the figures (NaN written null)"}


def _evaluate(o: AnswerCommand) -> int:
    if o.context or o.question or o.html:
        raise ValueError("--evaluate reads questions from --data: leave out --context, --question and --html")
    if not o.data:
        raise ValueError("--evaluate needs --data (facts or a file)")
    reader = Reader.load(o.run, o.device)
    figures: dict[str, dict[str, float]] = {}
    if o.data == "facts":
        if o.on_error != "raise":
            raise ValueError("--on-error is for a data file: the run's own data is read as in training")
        for split in ("test", "test_phrasings"):
            figures[split] = evaluation(reader, "facts", split=split)
    else:
        name = Path(o.data).name
        figures[name] = evaluation(reader, o.data, name=name, on_error=o.on_error)
        skipped = int(figures[name].pop("skipped", 0))
        if skipped:
            print(f"skipped {skipped} question(s) whose answer is not a span of the context")
    print("| data | exact match | F1 | questions |\n|---|---|---|---|")
    for name, m in figures.items():
        print(f"| {safe(name)} | {m['exact_match']:.4f} | {m['f1']:.4f} | {int(m['questions'])} |")
    if o.json:
        write_json(o.json, figures)
    return 0


def answer(o: AnswerCommand) -> int:
    from ...viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    if o.evaluate:
        return _evaluate(o)
    if not o.context or not o.question:
        raise ValueError("give --context and --question (or --evaluate --data PATH)")
    reader = Reader.load(o.run, o.device)
    given = [f"{o.context}\t{o.question}"]  # as qkv predict takes it
    results = reader.predict([(o.context, o.question)])
    (a,) = results
    color = use_color(o.color)
    print(f"answer: {safe(a.answer)}\tprobability {a.probability:.3f}\ttokens {a.start_token}-{a.end_token}")
    if a.windows > 1:  # a long context, read in overlapping windows (a question cut is logged as a warning)
        print(f"read: {len(a.tokens)} context tokens in {a.windows} overlapping windows; the answer's is tokens "
              f"{a.window[0]}-{a.window[1] - 1}")
    line = highlight_ansi([safe(t) for t in a.tokens], a.attention, color=color)
    if not color and o.top:
        line += "\t[" + ", ".join(f"{safe(t)} {w:.2f}" for t, w in top_tokens(a.tokens, a.attention, o.top)) + "]"
    print(f"attention: {line}")
    if o.html:
        item = HighlightedText(a.tokens, a.attention, caption=f"{a.question} -> {a.answer} ({a.probability:.3f})",
                               details=[("answer tokens", f"{a.start_token}-{a.end_token}"),
                                        *(("note", n) for n in a.notes)])
        print(f"wrote {save_html(o.html, [item], title='The question attends to the context')}")
    finish(reader, given, results, o.json)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"answer": (AnswerCommand, answer)}
