"""``qkv predict RUN INPUT...``: a run of any application on inputs written as text, the way every predicting command
goes (:mod:`qkv.apps.command`): the predictor loaded once, the inputs read (the predictor's
``inputs_from_strings``: a sentence or a text, an image or audio file, ``CONTEXT<TAB>QUESTION``...), then what was
cut said on stderr and one JSON row per result (``input``, then the predictor's ``result_row``) with ``--json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..apps.command import RunInputs, finish, inputs_of, read_inputs
from ..apps.console import safe, write_json
from ..options import option

__all__ = ["COMMAND", "PredictCommand"]


@dataclass
class PredictCommand(RunInputs):
    inputs: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="INPUT",
                               help="inputs: sentences or texts, image or audio files, or CONTEXT<TAB>QUESTION "
                                    "(question answering), as the run's application reads them")

    FLAG_HELP = {"json": "write one row per input as JSON: the input and the prediction (NaN written null)",
                 "run": "run directory or checkpoint directory (its application's settings are then flags too: "
                        "qkv predict RUN --help lists them)"}


def _line(row: dict[str, Any]) -> str:
    return f"{safe(str(row['input']))}\t{safe(str(row.get('output', '')))}"


def predict(args) -> int:
    from ..apps import load_predictor
    from .options import options_from_args
    from .runs import settings_given

    o = options_from_args(args, PredictCommand)
    given = read_inputs(o.inputs, o.file, "inputs (INPUT...)")
    settings = settings_given(args, getattr(args, "settings", ()))
    predictor = load_predictor(getattr(args, "checkpoints", {}).get(o.run, o.run), o.device)
    settings = predictor.check_settings(settings, "predict")
    results = predictor.predict(inputs_of(predictor, given), **settings)
    rows = finish(predictor, given, results, None, **settings)
    for row in rows:
        print(_line(row))
    if o.json:
        write_json(o.json, rows)
    return 0


#: the flags of ``qkv predict RUN`` include the settings of the run's application (:mod:`.runs`)
TAKES_SETTINGS = True

#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("predict", "any application's run on inputs: sentences, texts, image or audio files, "
           "CONTEXT<TAB>QUESTION (one line each; --json for rows)", PredictCommand, predict)
