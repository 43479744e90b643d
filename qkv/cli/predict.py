"""``qkv predict RUN INPUT...``: a run of any application on inputs written as text, and the one way every predicting
command goes (``qkv translate``, ``classify``, ``caption``, ``answer``, ``summarize``, ``transcribe``, ``segment``,
``show-attention`` are the same with their own extra flags): load the predictor once (:func:`load`), read the inputs
(:func:`read_inputs`, :func:`inputs_of`), predict, then :func:`finish`: what was cut said on stderr and the rows
written by ``--json``.

An input is what the application reads, written as a string: a sentence or a text, an image or audio file, or
``CONTEXT<TAB>QUESTION`` for question answering (the predictor's ``inputs_from_strings``). A result is one JSON
row (:func:`row_of`): ``input``, then the predictor's ``result_row``: ``output``, the line a person reads, and what
the application found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..options import option
from .common import input_files, read_lines, safe, warn, write_json
from .shared import DeviceOption, FileOption, JsonOption, RunArgument

__all__ = ["COMMAND", "PredictCommand", "load", "read_inputs", "inputs_of", "row_of", "cut_of", "finish"]


@dataclass
class PredictCommand(JsonOption, FileOption, DeviceOption, RunArgument):
    inputs: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="INPUT",
                               help="inputs: sentences or texts, image or audio files, or CONTEXT<TAB>QUESTION "
                                    "(question answering), as the run's application reads them")

    FLAG_HELP = {"json": "write one row per input as JSON: the input and the prediction (NaN written null)"}


def load(run: str, device: str = "auto", name: str | None = None):
    """The predictor of ``run`` (of application ``name``, or whichever the run is), read once."""
    from ..apps import application, load_predictor

    return application(name).predictor.load(run, device) if name else load_predictor(run, device)


def read_inputs(given: Sequence[str], file: str | None, what: str) -> list[str]:
    """The inputs given as arguments, then the lines of ``--file`` (a blank line is an error: outputs line up with
    lines); none at all is an error."""
    out = list(given) + (read_lines(file) if file else [])
    if not out:
        raise ValueError(f"give {what}, or --file")
    return out


def input_paths(o, given: Sequence[str], what: str, others: str = "") -> list[str]:
    """The files a command predicts on: ``given`` then the lines of ``o.file``, each an existing ``what``; none
    (and no ``others``, e.g. ``--index``) is an error. A command's ``--evaluate`` reads its own data: with it, files,
    ``--file``, ``--index`` and ``--plot`` are refused (they would be ignored)."""
    evaluate = getattr(o, "evaluate", None)
    index = getattr(o, "index", None)
    if evaluate and (given or o.file or index or getattr(o, "plot", None)):
        raise ValueError(f"--evaluate reads its examples from its data: leave out the {what}s, --file"
                         f"{', --index' if hasattr(o, 'index') else ''} and --plot")
    if not (given or o.file or index or evaluate):
        raise ValueError(f"give {what}s{others}" + (" or --evaluate" if hasattr(o, "evaluate") else ""))
    return input_files(read_inputs(given, o.file, f"{what}s"), what) if given or o.file else []


def inputs_of(predictor, strings: Sequence[str], **given: Any) -> Any:
    """What ``predictor.predict`` takes, from inputs written as strings: files are checked first (a folder is "is a
    directory", a missing file named), then the application's own ``inputs_from_strings``."""
    kind = getattr(predictor, "input_kind", "text")
    if kind.endswith(" file"):
        input_files(list(strings), kind)
    return predictor.inputs_from_strings(list(strings), **given)


def row_of(predictor, given: str, result: Any) -> dict[str, Any]:
    """One JSON row of a result: ``input`` (as given), then the application's ``result_row`` (``output`` first)."""
    return {"input": given, **predictor.result_row(result)}


def cut_of(predictor, result: Any, settings: dict[str, Any]) -> str | None:
    """What a result left out, in words (a source cut at the model's limit, an output stopped at the longest
    allowed), or ``None``; what the library already logs (a translation's or a classified text's source cut, a
    question cut) is not said twice."""
    task = predictor.task
    if task == "summarize" and result.cut:
        return (f"the source was cut to its first {len(result.source_tokens)} words (the run's --max-source): "
                f"{result.cut} more were not read")
    if task == "speech":
        longest = settings.get("max_len") or 300
        if len(result.tokens) >= longest:
            return f"the transcript stopped at {longest} characters without ending (--max-len)"
    return None


def finish(predictor, given: Sequence[str], results: Sequence[Any], json_path: str | None,
           **settings: Any) -> list[dict[str, Any]]:
    """After a prediction: each cut said on stderr (and in its row, ``note``), the rows written to ``json_path``."""
    rows = []
    for s, r in zip(given, results, strict=True):
        row = row_of(predictor, s, r)
        note = cut_of(predictor, r, settings)
        if note:
            warn(f"{safe(s[:60])}: {note}")
            row["note"] = note
        rows.append(row)
    if json_path:
        write_json(json_path, rows)
    return rows


def _line(row: dict[str, Any]) -> str:
    return f"{safe(str(row['input']))}\t{safe(str(row.get('output', '')))}"


def predict(args) -> int:
    from .options import options_from_args

    o = options_from_args(args, PredictCommand)
    given = read_inputs(o.inputs, o.file, "inputs (INPUT...)")
    predictor = load(o.run, o.device)
    results = predictor.predict(inputs_of(predictor, given))
    rows = finish(predictor, given, results, None)
    for row in rows:
        print(_line(row))
    if o.json:
        write_json(o.json, rows)
    return 0



#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("predict", "any application's run on inputs: sentences, texts, image or audio files, "
            "CONTEXT<TAB>QUESTION (one line each; --json for rows)", PredictCommand, predict)
