"""Translation with attention: the options, data, model, the trainer's task and a :class:`Translator`.

The default data is the multilingual date task (human-written dates in 14 locales -> ISO 8601, characters);
any Tatoeba/Anki file works too (subword tokens trained on its training split). Models: the fixed-context
baseline (the "distracted" model), Bahdanau and Luong attention, and the Transformer.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`TranslateTask` (the trainer's task),
:class:`Translator` (a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are
texts) and :func:`evaluate_translations`, the one metric both evaluate with.

Example::

    from qkv.apps.translate import TranslateOptions, TranslateTask, Translator, train_defaults
    from qkv.train import train
    options = TranslateOptions(data="dates", model="bahdanau")
    train(TranslateTask(options), train_defaults(options).replace(max_minutes=5, out="runs/dates"))
    Translator.load("runs/dates").predict(["7 mars 2019"])[0].text      # '2019-03-07'
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .decode import Translation, translate_batch
from .options import MODELS, RNN_MODELS, TranslateOptions, budget_defaults, train_defaults
from .predictor import Translator, parse_buckets
from .task import TranslateTask, evaluate_translations, load_data, model_spec

__all__ = ["APPLICATION", "TranslateOptions", "load_data", "model_spec", "train_defaults", "budget_defaults",
           "TranslateTask", "Translation", "Translator", "translate_batch", "evaluate_translations", "parse_buckets",
           "MODELS", "RNN_MODELS"]


APPLICATION = Application(
    name="translate", commands=command.COMMANDS,
    train_defaults=train_defaults, task=TranslateTask, predictor=Translator, budget_defaults=budget_defaults,
    export=export.graphs)
