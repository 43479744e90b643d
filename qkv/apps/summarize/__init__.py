"""Summarisation with the pointer-generator: attention that copies source words and coverage that stops it
repeating itself (See et al., 2017), on the Debian package descriptions, the fact passages as answers written out,
or a user's JSON Lines / CSV / TSV / CNN-DailyMail files.

The decoder's attention over the source is also a distribution over words to copy (``p_gen`` switches between
generating from the vocabulary and copying), so names and rare words outside the vocabulary can be written out;
coverage (the sum of the past attention) enters the score from ``coverage_from`` on, with the coverage loss.
Models: ``pointer``, ``seq2seq`` (the same without copying) and ``transformer`` (copy attention from its last
cross-attention layer), in :mod:`qkv.models.pointer`. Metrics: ROUGE-1/2/L (rouge-score), the repeated-trigram
rate and the share of copied words; exact match for the facts.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`SummarizeTask` (the trainer's task),
:class:`Summarizer` (a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are
texts) and :func:`evaluate_summaries`, the one metric both evaluate with.

Example::

    from qkv.apps.summarize import SummarizeOptions, SummarizeTask, Summarizer, train_defaults
    from qkv.train import train
    options = SummarizeOptions(data="debian", model="pointer", coverage_from=0.75)   # coverage for the last quarter
    train(SummarizeTask(options), train_defaults(options).replace(max_minutes=30, out="runs/debian"))
    Summarizer.load("runs/debian").predict(["GNU Emacs is the extensible self-documenting text editor."])[0].text
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .decode import Summary, first_words, lead, summarize_batch, summary_metrics
from .options import MODELS, SummarizeOptions, train_defaults
from .predictor import Summarizer
from .task import SummarizeTask, evaluate_summaries, load_data, model_spec, train_tokenizer

__all__ = ["APPLICATION", "SummarizeOptions", "load_data", "model_spec", "train_defaults", "train_tokenizer",
           "SummarizeTask", "Summary", "Summarizer", "summarize_batch", "summary_metrics", "evaluate_summaries",
           "lead", "first_words", "MODELS"]


APPLICATION = Application(
    name="summarize", commands=command.COMMANDS,
    train_defaults=train_defaults, task=SummarizeTask, predictor=Summarizer, export=export.graphs)
