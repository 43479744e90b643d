"""Question answering's answers: :class:`Answer` (the result type of :class:`~qkv.apps.qa.Reader`), the best span
of every encoded example (:func:`predict_examples`, batched, a long context read in overlapping windows) and their
metrics (:func:`answer_metrics`). The trainer's task and the reader share them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ...train.threads import follow_threads
from .encode import Encoded, collate_qa, crop, windows

__all__ = ["Answer", "predict_examples", "answer_metrics", "question_cut_note"]


@dataclass
class Answer:
    """A reader's answer: the ``answer`` text (``context[start:end]``, character offsets), its token span
    ``start_token..end_token`` (inclusive, in the whole context), ``probability`` ``p_start * p_end`` (in the
    window it came from), the context's ``tokens`` and the question's ``attention`` over them (one weight per token,
    summing to 1: the weights of the window the answer came from, at that window's tokens, 0 elsewhere).

    A context longer than ``max_context`` tokens is read in ``windows`` overlapping windows; ``window`` is the token
    range ``[a, b)`` of the one the answer came from (the whole context when there is one). ``notes`` say what was
    cut or read in windows, for people (``qkv answer``, the ``qkv view`` page)."""

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
    cut: int = 0  #: question tokens past ``max_question``, not read (a warning is logged)
    window: tuple[int, int] = (0, 0)
    windows: int = 1
    notes: list[str] = field(default_factory=list)


def question_cut_note(e: Encoded) -> str:
    """What :attr:`Encoded.question_cut` means, in words ("" when nothing was cut)."""
    if not e.question_cut:
        return ""
    return (f"the question has {e.question_tokens} tokens: only the first {len(e.question)} were read "
            f"(max_question {len(e.question)}; {e.question_cut} left out)")


@torch.no_grad()
def predict_examples(model: nn.Module, encoded: list[Encoded], contexts: list[str], max_answer_len: int = 20,
                     questions: list[str] | None = None, batch_size: int = 128, *, max_context: int,
                     stride: int) -> list[Answer]:
    """The best span of every encoded whole-context example (:func:`~qkv.apps.qa.encode.encode_example`).

    Each context is read in the windows of :func:`~qkv.apps.qa.encode.windows` (one for a context of at most
    ``max_context`` tokens); every window is decoded alone (:func:`qkv.models.reading.decode_spans`) and the span
    of highest ``p_start * p_end`` over the windows is kept (the first window's on a tie). Windows are batched by
    length, ``batch_size`` at a time, in eval mode (the mode restored after).
    """
    from ...models.reading import decode_spans

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    parts = [(i, w, crop(e, a, b)) for i, e in enumerate(encoded)
             for w, (a, b) in enumerate(windows(len(e.context), max_context, stride))]
    order = sorted(range(len(parts)), key=lambda k: len(parts[k][2].context))
    best: dict[int, tuple[float, int, int, int, list[float]]] = {}  # example -> (prob, window, start, end, attention)
    for s in follow_threads(range(0, len(order), batch_size),
                            lambda s: sum(len(parts[k][2].context) for k in order[s:s + batch_size]), device=device):
        idx = order[s:s + batch_size]
        batch = collate_qa([parts[k][2] for k in idx])
        b = {k: v.to(device) for k, v in batch.items()}
        res = model(b["context"], b["context_mask"], b["question"], b["question_mask"], b["match"])
        start, end, prob = decode_spans(res.start_logits, res.end_logits, b["context_mask"], max_answer_len)
        attention = res.attention.float().cpu()
        for row, k in enumerate(idx):
            i, w, part = parts[k]
            p = float(prob[row])
            if i not in best or p > best[i][0] or (p == best[i][0] and w < best[i][1]):
                best[i] = (p, w, int(start[row]), int(end[row]), attention[row, :len(part.context)].tolist())
    model.train(was_training)
    out = []
    for i, e in enumerate(encoded):
        p, w, st, en, weights = best[i]
        spans = windows(len(e.context), max_context, stride)
        a, b = spans[w]
        st, en = st + a, en + a
        c = contexts[i]
        x, z = e.offsets[st][0], e.offsets[en][1]
        full = [0.0] * len(e.context)
        full[a:b] = weights
        notes = [question_cut_note(e)] if e.question_cut else []
        if len(spans) > 1:
            notes.append(f"the context has {len(e.context)} tokens, more than max_context ({max_context}): read in "
                         f"{len(spans)} overlapping windows {stride} tokens apart; the answer is from window "
                         f"{w + 1} (tokens {a}-{b - 1})")
        out.append(Answer(c, questions[i] if questions else "", c[x:z], x, z, st, en, p,
                          [c[u:v] for u, v in e.offsets], full, e.question_cut, (a, b), len(spans), notes))
    return out


def answer_metrics(answers: Sequence[Answer], gold: Sequence[Sequence[str]], encoded: Sequence[Encoded], *,
                   chars: bool | None = None) -> dict[str, float]:
    """SQuAD's ``exact_match`` and ``f1`` of ``answers`` against the gold answers of each question, how many
    ``questions``, and ``attention_mass``: the question's attention on the gold span's tokens (``encoded``'s
    ``start..end``, whole-context tokens), averaged over the questions whose span is made of whole tokens (NaN for
    none)."""
    from ...metrics import squad_metrics

    metrics = squad_metrics([a.answer for a in answers], gold, chars=chars)
    mass = [sum(a.attention[e.start:e.end + 1]) for a, e in zip(answers, encoded, strict=True) if e.start >= 0]
    metrics["attention_mass"] = sum(mass) / len(mass) if mass else math.nan
    return metrics
