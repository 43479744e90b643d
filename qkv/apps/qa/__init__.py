"""Question answering with attention: the options, data, model, the trainer's task and a :class:`Reader`.

The question is the query, the context's tokens are the keys and values: a reader points at the answer's first
and last token (asked *when* the mass-energy equation was proposed, attention goes to "1905"). The
default data is generated fact passages in English and Chinese mixed (held-out entities and phrasings,
:mod:`qkv.data.facts`), read by one mixed word tokeniser (Latin words and numbers whole, CJK by characters);
SQuAD v1.1 JSON and ``context<TAB>question<TAB>answer`` files work too (:mod:`qkv.apps.qa.squad`). A context longer
than ``max_context`` tokens is read in overlapping windows. Models: the Attentive Reader, a BiDAF-style reader and
a Transformer encoder (:mod:`qkv.models.reading`). Metrics: SQuAD's exact match and F1 (characters for Chinese).

Its parts under the contract of :mod:`qkv.apps.base`: :class:`QATask` (the trainer's task), :class:`Reader` (a run
read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are ``context<TAB>question``
strings) and :func:`evaluate_reader`, the one metric both evaluate with.

Example::

    from qkv.apps.qa import QAOptions, QATask, Reader, train_defaults
    from qkv.train import train
    options = QAOptions(data="facts", model="reader")              # English and Chinese facts
    train(QATask(options), train_defaults(options).replace(max_minutes=5, out="runs/qa"))
    reader = Reader.load("runs/qa")
    reader.predict([("质能方程由爱因斯坦于1905年提出。", "质能方程是什么时候提出的？")])[0].answer  # '1905'
    reader.evaluate(split="test_phrasings")        # {'exact_match': ..., 'f1': ..., 'questions': 1000.0, ...}
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .decode import Answer, answer_metrics, predict_examples
from .options import MODELS, QAOptions, train_defaults
from .predictor import Reader
from .task import QATask, evaluate_reader, load_data, model_spec, train_tokenizer

__all__ = ["APPLICATION", "QAOptions", "load_data", "model_spec", "train_defaults", "train_tokenizer",
           "evaluate_reader", "QATask", "Answer", "Reader", "predict_examples", "answer_metrics", "MODELS"]


APPLICATION = Application(
    name="qa", commands=command.COMMANDS,
    train_defaults=train_defaults, task=QATask, predictor=Reader, export=export.graphs)
