"""Question answering's answers: :class:`Answer` (the result type of :class:`~qkv.tasks.qa.Reader`), the best span
of every encoded example (:func:`predict_examples`, batched) and their metrics (:func:`answer_metrics`). The
trainer's task and the reader share them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .encode import Encoded, collate_qa

__all__ = ["Answer", "predict_examples", "answer_metrics"]


@dataclass
class Answer:
    """A reader's answer: the ``answer`` text (``context[start:end]``, character offsets), its token span
    ``start_token..end_token`` (inclusive), ``probability`` ``p_start * p_end``, the context's ``tokens`` and the
    question's ``attention`` over them (one weight per token, summing to 1)."""

    context: str
    question: str
    answer: str
    start: int
    end: int
    start_token: int
    end_token: int
    probability: float
    tokens: list[str]
    attention: list[float]


@torch.no_grad()
def predict_examples(model: nn.Module, encoded: list[Encoded], contexts: list[str], max_answer_len: int = 20,
                     questions: list[str] | None = None, batch_size: int = 128) -> list[Answer]:
    """The best span of every encoded example (batched by length, in eval mode, the mode restored after)."""
    from ...models.reading import decode_spans

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].context))
    out: dict[int, Answer] = {}
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        batch = collate_qa([encoded[i] for i in idx])
        b = {k: v.to(device) for k, v in batch.items()}
        res = model(b["context"], b["context_mask"], b["question"], b["question_mask"], b["match"])
        start, end, prob = decode_spans(res.start_logits, res.end_logits, b["context_mask"], max_answer_len)
        attention = res.attention.float().cpu()
        for k, i in enumerate(idx):
            e, c = encoded[i], contexts[i]
            st, en = int(start[k]), int(end[k])
            a, z = e.offsets[st][0], e.offsets[en][1]
            out[i] = Answer(c, questions[i] if questions else "", c[a:z], a, z, st, en, float(prob[k]),
                            [c[x:y] for x, y in e.offsets], attention[k, :len(e.context)].tolist())
    model.train(was_training)
    return [out[i] for i in range(len(encoded))]


def answer_metrics(answers: Sequence[Answer], gold: Sequence[Sequence[str]], encoded: Sequence[Encoded], *,
                   chars: bool | None = None) -> dict[str, float]:
    """SQuAD's ``exact_match`` and ``f1`` of ``answers`` against the ``gold`` answers of each question, how many
    ``questions``, and ``attention_mass``: the question's attention on the gold span's tokens (``encoded``'s
    ``start..end``), averaged over the questions whose span lies within the kept context (NaN for none)."""
    from ...metrics import squad_metrics

    metrics = squad_metrics([a.answer for a in answers], gold, chars=chars)
    mass = [sum(a.attention[e.start:e.end + 1]) for a, e in zip(answers, encoded, strict=True) if e.start >= 0]
    metrics["attention_mass"] = sum(mass) / len(mass) if mass else math.nan
    return metrics
