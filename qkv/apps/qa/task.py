"""Question answering's data, model and the trainer's task: :func:`load_data` (generated facts or a file split by
context), :func:`model_spec`, :func:`train_tokenizer`, :func:`evaluate_reader` (the metric) and :class:`QATask`."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import nn

from ..base import ApplicationTask
from .decode import answer_metrics, predict_examples
from .encode import Encoded, collate_qa, encode_example, rare_dropout, training_window
from .options import QAOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "train_tokenizer", "encode_examples", "evaluate_reader", "QATask", "chinese",
           "chars_of"]

_NAMES = {"reader": "attentive-reader", "bidaf": "bidaf-reader", "transformer": "transformer-reader"}


def _split_file(examples, options: QAOptions) -> dict[str, list]:
    """Train/valid/test by context (a context's questions stay together), shuffled with ``data_seed``."""
    contexts = sorted({e.context for e in examples})
    random.Random(options.data_seed).shuffle(contexts)
    n = len(contexts)
    n_valid, n_test = max(1, round(n * options.valid)), max(1, round(n * options.test))
    side = {c: "valid" for c in contexts[:n_valid]}
    side.update({c: "test" for c in contexts[n_valid:n_valid + n_test]})
    splits: dict[str, list] = {"train": [], "valid": [], "test": []}
    for e in examples:
        splits[side.get(e.context, "train")].append(e)
    if not all(splits.values()):
        counts = ", ".join(f"{len(v)} {k}" for k, v in splits.items())
        raise ValueError(f"{options.data}: {n} distinct contexts give {counts} questions; every split needs at "
                         "least one (at least 3 contexts)")
    return splits


def load_data(options: QAOptions):
    """The :class:`qkv.data.facts.QACorpus` that ``options`` describe (generated facts, or a file split by context)."""
    from ...data.facts import QACorpus, fact_corpus
    from .squad import read_qa_file

    if options.data == "facts":
        return fact_corpus(options.lang, options.n_train, options.n_eval, seed=options.data_seed,
                           entities=options.entities)
    if not Path(options.data).is_file():
        raise FileNotFoundError(f"no such data file: {options.data} (data)")
    read = read_qa_file(options.data, on_error=options.on_error)
    if read.skipped:
        logger.warning("%s: %d question(s) skipped", options.data, read.skipped)
    return QACorpus(_split_file(read.examples, options), "zh" if chinese(read.examples) else "en")


def chars_of(language: str) -> bool | None:
    """Whether answers of ``language`` are compared by characters (Chinese), words (English) or by their text
    (``both``: characters for an answer with CJK characters, :func:`qkv.metrics.answer_f1`)."""
    return {"zh": True, "en": False}.get(language)


def chinese(examples) -> bool:
    """Whether ``examples`` (:class:`qkv.data.facts.QAExample`) are Chinese: CJK characters are most of the text
    of their first 200 contexts."""
    text = "".join(e.context for e in examples[:200])
    return sum("\u3400" <= c <= "\u9fff" for c in text) > 0.3 * max(1, sum(not c.isspace() for c in text))


def model_spec(options: QAOptions, *, vocab_size: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`: the reader ``options`` describe."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "score": o.score_name, "dropout": o.dropout,
                              "match_feature": o.match_feature, "num_layers": o.layers}
    if o.case_feature:  # (a run saved before the flag existed has no key: the reader's default, off)
        config["case_feature"] = True
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim,
                      max_len=max(o.max_context, o.max_question))
    else:
        config.update(embed_dim=o.embed_dim, hidden_dim=o.hidden_dim)
    return {"name": _NAMES[o.model], "config": config}


def train_tokenizer(options: QAOptions, corpus):
    """The tokeniser of the training contexts and questions: ``word`` (``auto``, whatever the language: the mixed
    word tokeniser reads Latin words and numbers whole and CJK text one character at a time, so one model reads
    English and Chinese) or ``char``. A run keeps the tokeniser it was trained with (the character tokeniser of an
    older Chinese run included)."""
    from ...data.tokenize import CharTokenizer, WordTokenizer

    texts = [t for e in corpus.train for t in (e.context, e.question)]
    if options.tokenizer == "char":
        return CharTokenizer.train(texts, min_freq=options.min_freq)
    return WordTokenizer.train(texts, min_freq=options.min_freq, clitics=True)


def encode_examples(examples, tokenizer, options: QAOptions) -> list[Encoded]:
    """Every example (:class:`qkv.data.facts.QAExample`) encoded whole (:func:`~qkv.apps.qa.encode.encode_example`;
    a text without tokens is a ``ValueError`` naming its ``file:line`` or number); the questions cut at
    ``max_question`` are counted in one warning."""
    out = []
    for n, e in enumerate(examples, 1):
        try:
            out.append(encode_example(e.context, e.question, tokenizer, max_question=options.max_question,
                                      answer=(e.answer_start, e.answer_end)))
        except ValueError as err:
            raise ValueError(f"{e.where or f'question {n}'}: {err}") from None
    cut = sum(e.question_cut > 0 for e in out)
    if cut:
        logger.warning("%d question(s) have more than max_question (%d) tokens: only their first %d are read",
                       cut, options.max_question, options.max_question)
    return out


def evaluate_reader(model: nn.Module, examples, encoded: list[Encoded], options: QAOptions, *,
                    chars: bool | None, batch_size: int = 128) -> dict[str, float]:
    """Question answering's metric, for the trainer and the predictor alike: SQuAD exact match and F1, the
    ``questions`` and the attention mass on the answer (:func:`~qkv.apps.qa.decode.answer_metrics`) of ``model``
    on ``examples`` (:class:`qkv.data.facts.QAExample`, ``encoded`` by :func:`encode_examples`)."""
    o = options
    answers = predict_examples(model, encoded, [e.context for e in examples], o.max_answer_len,
                               [e.question for e in examples], batch_size, max_context=o.max_context, stride=o.stride)
    return answer_metrics(answers, [e.answers for e in examples], encoded, chars=chars)


class QATask(ApplicationTask, name="qa", unit="items", options=QAOptions, load_data=load_data, model_spec=model_spec,
             assets=("tokenizer",)):
    """Span extraction: cross-entropy of the answer's start token plus that of its end token."""

    def __init__(self, options: QAOptions, data=None):
        super().__init__(options, data)
        self.encoded: dict[str, list[Encoded]] = {}
        self._rare: list[float] | None = None  # per token id, --rare-dropout's probability (set up with the data)

    def setup(self) -> None:
        o = self.options
        self.read_data()
        if self.tokenizer is None:
            self.tokenizer = train_tokenizer(o, self.data)
        for split, examples in self.data.splits.items():
            self.encoded[split] = encode_examples(examples, self.tokenizer, o)
        # a long context: the window that holds the answer
        train = [w for e in self.encoded["train"] if (w := training_window(e, o.max_context, o.stride)) is not None]
        moved = sum(w.first > 0 for w in train)
        if moved:
            logger.info("%d training questions read the window of their context that holds the answer", moved)
        if len(train) < len(self.encoded["train"]):
            logger.warning("%d training questions have no answer span of at most max_context (%d) tokens: left out",
                           len(self.encoded["train"]) - len(train), o.max_context)
        if not train:
            raise ValueError(f"{o.data}: no training question has an answer span of at most "
                             f"max_context={o.max_context} tokens")
        self._train = train
        self._rare = rare_dropout(train, self.tokenizer.vocab_size, o.rare_dropout) if o.rare_dropout > 0 else None
        logger.info("%s: %s questions; vocabulary %d", o.data,
                    ", ".join(f"{len(v)} {k}" for k, v in self.data.splits.items()), self.tokenizer.vocab_size)

    def train_examples(self):
        return self._train

    def lengths(self):
        return [len(e.context) for e in self._train]

    def collate(self, examples):
        return collate_qa(examples, word_dropout=self.options.word_dropout, rare=self._rare)

    def sizes(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size}

    def loss(self, model, batch):
        out = model(batch["context"], batch["context_mask"], batch["question"], batch["question_mask"], batch["match"])
        start, end = batch["start"], batch["end"]
        loss = F.cross_entropy(out.start_logits, start, reduction="sum") + \
            F.cross_entropy(out.end_logits, end, reduction="sum")
        hit = (out.start_logits.argmax(-1) == start) & (out.end_logits.argmax(-1) == end)
        return loss, len(start), {"span_acc": hit.sum()}

    def evaluate(self, model, split: str) -> dict[str, float]:
        """SQuAD exact match and F1, and the attention mass on the answer, of the first ``eval_max`` questions of
        ``split``."""
        if split not in self.encoded:
            raise ValueError(f"no split {split!r}; one of {', '.join(self.encoded)}")
        n = self.options.eval_max
        return evaluate_reader(model, self.data.split(split)[:n], self.encoded[split][:n], self.options,
                               chars=chars_of(self.data.language))
