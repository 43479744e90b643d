"""``qkv predict RUN INPUT...``: a run of any application on inputs written as text, and the one way every predicting
command goes (``qkv translate``, ``classify``, ``caption``, ``answer``, ``summarize``, ``transcribe``, ``segment``,
``show-attention`` are the same with their own extra flags): load the predictor once (:func:`load`), read the inputs
(:func:`read_inputs`, :func:`inputs_of`), predict, then :func:`finish`: what was cut said on stderr and the rows
written by ``--json``.

An input is what the application reads, written as a string: a sentence or a text, an image or audio file, or
``CONTEXT<TAB>QUESTION`` for question answering. A result is one JSON row (:func:`row_of`): ``input`` and what the
application found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..options import option
from .common import add_command, input_files, input_texts, safe, warn, write_json
from .shared import DeviceOption, FileOption, JsonOption, RunArgument

__all__ = ["register", "PredictCommand", "load", "read_inputs", "inputs_of", "row_of", "cut_of", "finish"]


@dataclass
class PredictCommand(JsonOption, FileOption, DeviceOption, RunArgument):
    inputs: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="INPUT",
                               help="inputs: sentences or texts, image or audio files, or CONTEXT<TAB>QUESTION "
                                    "(question answering), as the run's application reads them")

    FLAG_HELP = {"json": "write one row per input as JSON: the input and the prediction (NaN written null)"}


def load(run: str, device: str = "auto", name: str | None = None):
    """The predictor of ``run`` (of application ``name``, or whichever the run is), read once."""
    from ..tasks import application, load_predictor

    return application(name).predictor.load(run, device) if name else load_predictor(run, device)


def read_inputs(given: Sequence[str], file: str | None, what: str) -> list[str]:
    """The inputs given as arguments, then the lines of ``--file`` (a blank line is an error: outputs line up)."""
    return input_texts(list(given), file, what)


# ---------------------------------------------------------------------------------- what each application reads


def _pairs(strings: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for n, s in enumerate(strings, 1):
        context, tab, question = s.rpartition("\t")
        if not tab:
            raise ValueError(f"input {n}: a question-answering input is CONTEXT<TAB>QUESTION, got no tab")
        pairs.append((context, question))
    return pairs


def _caption_images(predictor, strings: Sequence[str]):
    import torch

    return torch.stack([predictor.read(p) for p in input_files(list(strings), "image file")])


@dataclass(frozen=True)
class _Io:
    inputs: Callable[[Any, Sequence[str]], Any]  #: (predictor, strings) -> what predict takes
    row: Callable[[str, Any], dict[str, Any]]  #: (input as given, result) -> a JSON row


def _probabilities(r) -> dict[str, Any]:
    return {"label": r.label, "probability": r.probability, "probabilities": r.probabilities}


_IO: dict[str, _Io] = {
    "translate": _Io(lambda p, s: list(s), lambda s, r: {"input": s, "text": r.text, "score": r.score, "cut": r.cut}),
    "sentiment": _Io(lambda p, s: list(s),
                     lambda s, r: {"input": s, **_probabilities(r), "value": r.value, "cut": r.cut}),
    "images": _Io(lambda p, s: input_files(list(s), "image file"), lambda s, r: {"input": s, **_probabilities(r)}),
    "caption": _Io(_caption_images, lambda s, r: {"input": s, "text": r.text, "score": r.score}),
    "qa": _Io(lambda p, s: _pairs(s),
              lambda s, r: {"input": r.question, "context": r.context, "answer": r.answer,
                            "probability": r.probability, "start": r.start, "end": r.end, "cut": r.cut}),
    "segment": _Io(lambda p, s: input_files(list(s), "image file"),
                   lambda s, r: {"input": s, "size": [int(r.labels.shape[-1]), int(r.labels.shape[-2])],
                                 "shares": r.shares()}),
    "summarize": _Io(lambda p, s: list(s), lambda s, r: {"input": s, "text": r.text, "score": r.score, "cut": r.cut}),
    "speech": _Io(lambda p, s: input_files(list(s), "audio file"),
                  lambda s, r: {"input": s, "text": r.text, "score": r.score}),
}


def inputs_of(predictor, strings: Sequence[str]) -> Any:
    """What ``predictor.predict`` takes, from inputs written as strings (its own ``inputs_from_strings`` where it
    has one)."""
    own = getattr(predictor, "inputs_from_strings", None)
    return own(list(strings)) if own is not None else _IO[predictor.task].inputs(predictor, strings)


def row_of(predictor, given: str, result: Any) -> dict[str, Any]:
    """One JSON row of a result: ``input`` (as given) and what the application found."""
    own = getattr(predictor, "result_row", None)
    return {"input": given, **own(result)} if own is not None else _IO[predictor.task].row(given, result)


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
    if "shares" in row:
        out = ", ".join(f"{c} {v:.1%}" for c, v in sorted(row["shares"].items(), key=lambda kv: -kv[1]))
    else:
        out = str(row.get("text", row.get("answer", row.get("label", ""))))
        if isinstance(row.get("probability"), float) and row["probability"] == row["probability"]:
            out += f"\t{row['probability']:.3f}"
        elif row.get("value") is not None:
            out += f"\t{row['value']:+.3f}"
    return f"{safe(str(row['input']))}\t{safe(out)}"


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


def register(commands, train_commands) -> None:
    add_command(commands, "predict", "any application's run on inputs: sentences, texts, image or audio files, "
                "CONTEXT<TAB>QUESTION (one line each; --json for rows)", PredictCommand, predict)
