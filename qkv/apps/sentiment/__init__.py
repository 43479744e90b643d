"""Sentiment analysis with attention: which words a classifier looks at.

The default data format is the movie-review snippets (``id<TAB>rating<TAB>text``, binary by the rating's sign,
or the rating itself with ``regression``); ``text_col``/``label_col`` read any CSV/TSV file instead. The
model's pooled attention weights are its visible output: each prediction carries a weight per word.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`SentimentTask` (the trainer's task),
:class:`SentimentClassifier` (a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line
inputs are texts) and :func:`evaluate_classifier`, the one metric both evaluate with.

Example::

    from qkv.apps.sentiment import SentimentClassifier, SentimentOptions, train_defaults, train_folds
    options = SentimentOptions(data="movie-review-snippets.tsv.gz", model="bigru")
    train_folds(options, train_defaults(options).replace(out="runs/mr"))
    SentimentClassifier.load("runs/mr").predict(["a gorgeous, witty, seductive movie."])[0].label
"""

from __future__ import annotations

from ...data.text_classification import collate_texts
from ..base import Application
from . import command, export
from .faithfulness import comprehensiveness
from .options import MODELS, SentimentOptions, train_defaults
from .predictor import SentimentClassifier, SentimentPrediction
from .task import SentimentTask, evaluate_classifier, load_data, make_splits, model_spec, train_folds

__all__ = ["APPLICATION", "SentimentOptions", "load_data", "make_splits", "model_spec", "train_defaults",
           "SentimentTask", "train_folds", "evaluate_classifier", "collate_texts", "SentimentPrediction",
           "SentimentClassifier", "comprehensiveness", "MODELS"]


def _train(options: SentimentOptions, config) -> list:
    return train_folds(options, config)["runs"]


APPLICATION = Application(
    name="sentiment", commands=command.COMMANDS,
    train_defaults=train_defaults, task=SentimentTask, predictor=SentimentClassifier, train=_train,
    export=export.graphs)
