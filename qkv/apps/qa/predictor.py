"""A trained reader read back: :class:`Reader` (``load`` / ``predict`` / ``evaluate`` / ``view``) and its result,
:class:`Answer` (the answer's text and span, its probability and the question's attention over the context)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from ...options import OptionError, ref
from ..base import PageInput, Predictor, ViewInput, a_run, jsonable, need_text, text_inputs
from .decode import Answer, predict_examples, question_cut_note
from .encode import Encoded, encode_example, token_offsets, windows
from .options import QASettings
from .task import QATask, chars_of, encode_examples, evaluate_reader

logger = logging.getLogger(__name__)

__all__ = ["Answer", "Reader"]


class Reader(Predictor):
    """A trained reader: ``Reader.load("runs/qa").predict([(context, question), ...])`` -> :class:`Answer` s."""

    task_class = QATask
    view_inputs = ("text", "question")
    input_kind = "context<TAB>question"
    settings = QASettings

    def _answers(self, encoded: list[Encoded], contexts: list[str], questions: list[str] | None = None,
                 batch_size: int = 128) -> list[Answer]:
        o = self.options
        return predict_examples(self.model, encoded, contexts, o.max_answer_len, questions, batch_size,
                                max_context=o.max_context, stride=o.stride)

    def predict(self, inputs: Sequence[tuple[str, str]], *, batch_size: int = 128) -> list[Answer]:
        """An :class:`Answer` for every ``(context, question)`` pair (windows batched by length); an empty or
        token-less text is a ``ValueError`` naming the pair.

        A context longer than ``max_context`` tokens is read in overlapping windows (the best span of all is
        kept: :func:`~qkv.apps.qa.decode.predict_examples`); a question longer than ``max_question`` tokens is
        cut, with a warning logged and a note on the answer."""
        if isinstance(inputs, tuple) and len(inputs) == 2 and all(isinstance(t, str) for t in inputs):
            raise ValueError("predict takes a list of (context, question) pairs: predict([(context, question)])")
        encoded = []
        for n, pair in enumerate(inputs, 1):
            name = "" if len(inputs) == 1 else f" {n}"
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise ValueError(f"input{name} must be a (context, question) pair, got {type(pair).__name__}")
            for what, text in zip(("context", "question"), pair, strict=True):
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"the {what} is empty" if len(inputs) == 1 else f"{what} {n} is empty")
            try:
                encoded.append(encode_example(*pair, self.tokenizer, max_question=self.options.max_question))
            except ValueError as e:
                raise ValueError(f"pair{name}: {e}") from None
            if encoded[-1].question_cut:
                logger.warning("%s%s", f"question {n}: " if len(inputs) > 1 else "", question_cut_note(encoded[-1]))
        return self._answers(encoded, [c for c, _ in inputs], [q for _, q in inputs], batch_size)

    def inputs_from_strings(self, strings: Sequence[str], *, question: str | None = None,
                            **given: Any) -> list[tuple[str, str]]:
        """``(context, question)`` pairs: each string ``context<TAB>question`` (split at its last tab), or, with
        ``question``, each string a context asked that question. A string without a tab (and no ``question``)
        is a ``ValueError`` naming it."""
        self.check_settings(given, "predict")
        texts = text_inputs(strings)
        if question is not None:
            if not question.strip():
                raise ValueError("the question is empty")
            return [(t, question) for t in texts]
        pairs = []
        for n, t in enumerate(texts, 1):
            context, tab, asked = t.rpartition("\t")
            if not tab:
                raise ValueError(f"input {n} must be context<TAB>question (or give the question apart), got "
                                 f"{t[:40]!r}")
            for what, text in (("context", context), ("question", asked)):
                if not text.strip():
                    raise ValueError(f"the {what} is empty" if len(texts) == 1 else f"input {n}: the {what} is empty")
            pairs.append((context, asked))
        return pairs

    def result_row(self, result: Answer) -> dict[str, Any]:
        """``output`` (the answer), its ``probability``, its character span ``start``/``end`` in the context,
        its token span, and the ``notes`` (what was cut or read in windows)."""
        return jsonable({"output": result.answer, "question": result.question, "probability": result.probability,
                         "start": result.start, "end": result.end,
                         "tokens": [result.start_token, result.end_token], "notes": list(result.notes)})

    def score(self, examples, *, chars: bool | None = None) -> dict[str, float]:
        """:func:`~qkv.apps.qa.decode.answer_metrics` (exact match, F1, questions, attention mass on the gold
        span) of this reader on ``examples`` (:class:`qkv.data.facts.QAExample`); ``chars``: character F1
        (default: by the texts)."""
        examples = list(examples)
        return evaluate_reader(self.model, examples, encode_examples(examples, self.tokenizer, self.options),
                               self.options, chars=chars)

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 on_error: str | None = None, **settings: Any) -> dict[str, float]:
        """Exact match, F1, ``questions`` and ``attention_mass`` (:meth:`score`) of the first ``limit`` questions.

        ``data=None`` (or ``"facts"`` for a facts run): ``split`` of the run's own data (``valid``, ``test``, and
        for facts ``test_phrasings``). ``data`` a SQuAD ``.json`` or ``context<TAB>question<TAB>answer`` file: all
        of it, read with ``on_error`` (``raise``, or ``skip`` the answers that are not spans of their context,
        counted in ``skipped`` and logged).
        """
        from .squad import read_qa_file

        self.check_settings({"on_error": on_error, **settings})
        if data and data != "facts":
            if split != "test":
                raise ValueError(f"a data file is evaluated whole: split {split!r} is for the run's own data")
            read = read_qa_file(data, on_error=on_error or "raise")
            if read.skipped:
                logger.warning("%s: skipped %d question(s) whose answer is not a span of the context, e.g. %s",
                               data, read.skipped, read.problems[0])
            if not read.examples:
                raise ValueError(f"{data}: no question to answer")
            return {**self.score(read.examples[:limit]), "skipped": float(read.skipped)}
        if data == "facts" and self.options.data != "facts":
            raise ValueError(f"data facts: this run was trained on {self.options.data}, not on facts")
        if on_error is not None:
            raise ValueError("on_error is for a data file: the run's own data was read as in training")
        corpus = self.dataset()
        if split not in corpus.splits or split == "train":
            raise ValueError(f"no split {split!r}; one of {', '.join(s for s in corpus.splits if s != 'train')}")
        return self.score(corpus.split(split)[:limit], chars=chars_of(corpus.language))

    def view_input(self, given: ViewInput) -> tuple[str, str]:
        """``(context, question)``: ``given.text`` and ``given.question``, neither empty."""
        context = need_text(given.text, self.application)
        question = given.question
        if not question or not question.strip():
            raise OptionError(a_run(self.application) + " needs " + ref("question") + " as well as the context",
                              "question")
        return context, question

    def view_predict(self, x: tuple[str, str], **options: Any) -> Answer:
        """The answer to one question, its windows in one batch (a row of the records per window)."""
        (answer,) = self.predict([x], batch_size=1 << 30, **options)
        return answer

    def view_page(self, records: list, x: tuple[str, str], answer: Answer) -> PageInput:
        """The attention of the reader answering the question about the context: the prediction's own forward
        pass, recorded (the window the answer came from, when the context took several)."""
        context, question = x
        if answer.windows > 1:  # the window the answer came from (its row of the batch; all are max_context long)
            row = windows(len(answer.tokens), self.options.max_context, self.options.stride).index(answer.window)
            records = [dataclasses.replace(r, weights=r.weights[row:][:1]) for r in records]
        a, b = answer.window
        o = self.options
        q_tokens = [question[x:y] for x, y in token_offsets(question, self.tokenizer)[:o.max_question]]
        return PageInput(records, {"source": answer.tokens[a:b], "target": q_tokens},
                         title=f"{question} \u2192 {answer.answer}",
                         notes=[f"{o.model} reader; context: {context if len(context) <= 300 else context[:300] + '…'}",
                                f"answer probability {answer.probability:.2f}", *answer.notes])
