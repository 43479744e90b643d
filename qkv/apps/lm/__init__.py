"""A language model of qkv's own: a causal Transformer (:class:`qkv.models.lm.CausalLM`) trained on any text, its
bits per character on held-out documents, sampling, and every attention over a text.

The data is a text file (one document per line), JSON lines or TSV (a field or column), or the corpora beside the
project by name (``tatoeba``: the English sentences; ``debian``: the package descriptions); characters by default
(bits per character are then exact), subwords or words.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`LMTask` (the trainer's task), :class:`LanguageModel`
(a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are prompts) and
:func:`evaluate_lm`, the one metric both evaluate with.

Example::

    from qkv.apps.lm import LMOptions, LMTask, LanguageModel, train_defaults
    from qkv.train import train
    options = LMOptions(data="tatoeba", dim=128, num_layers=4)
    train(LMTask(options), train_defaults(options).replace(max_minutes=5, out="runs/lm"))
    LanguageModel.load("runs/lm").predict(["The cat "], seed=0)[0].text
"""

from __future__ import annotations

from ..base import Application
from . import command
from .options import LMOptions, budget_defaults, train_defaults
from .predictor import Generation, LanguageModel
from .task import LMTask, evaluate_lm, load_data, model_spec

__all__ = ["APPLICATION", "LMOptions", "train_defaults", "budget_defaults", "load_data", "model_spec", "LMTask",
           "evaluate_lm", "LanguageModel", "Generation"]


APPLICATION = Application(
    name="lm", commands=command.COMMANDS,
    train_defaults=train_defaults, task=LMTask, predictor=LanguageModel, budget_defaults=budget_defaults)
