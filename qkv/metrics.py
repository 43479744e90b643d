"""Metrics every application shares: accuracy and cross-entropy, regression errors, exact match, BLEU and chrF.

BLEU and chrF are sacrebleu's (Post, 2018, "A Call for Clarity in Reporting BLEU Scores",
https://aclanthology.org/W18-6319), from the ``train`` extra. Inputs are tensors of logits and labels, or lists
of strings; results are plain floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["accuracy", "cross_entropy", "classification_metrics", "regression_metrics", "exact_match",
           "translation_metrics", "bleu_by_length"]


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """The fraction of rows of ``logits (N, C)`` whose largest entry is at ``labels (N,)``; NaN when N = 0."""
    if len(labels) == 0:
        return math.nan
    return float((logits.argmax(-1) == labels).double().mean())


def cross_entropy(logits: Tensor, labels: Tensor) -> float:
    """Mean negative log-likelihood of ``labels (N,)`` under ``softmax(logits (N, C))``, in nats (float64)."""
    if len(labels) == 0:
        return math.nan
    return float(F.cross_entropy(logits.double(), labels))


def classification_metrics(logits: Tensor, labels: Tensor) -> dict[str, float]:
    """``{"accuracy", "loss"}`` of ``logits (N, C)`` against ``labels (N,)``."""
    return {"accuracy": accuracy(logits, labels), "loss": cross_entropy(logits, labels)}


def regression_metrics(pred: Tensor, target: Tensor) -> dict[str, float]:
    """MSE, MAE, Pearson's r and the sign ``accuracy`` of ``pred (N,)`` against ``target (N,)``.

    ``accuracy`` is the agreement of signs over the targets that are not 0 (so that a model that predicts a
    rating is compared with a classifier of its sign on the same footing); NaN when there are none.
    """
    pred, y = pred.double(), target.double()
    nonzero = y != 0
    r = torch.corrcoef(torch.stack([pred, y]))[0, 1] if len(y) > 1 else torch.tensor(math.nan)
    return {"mse": float(((pred - y) ** 2).mean()), "mae": float((pred - y).abs().mean()), "pearson": float(r),
            "accuracy": float(((pred[nonzero] > 0) == (y[nonzero] > 0)).double().mean()) if nonzero.any()
            else math.nan}


def _references(refs: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    return [[r] if isinstance(r, str) else list(r) for r in refs]


def exact_match(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """The fraction of hypotheses equal (after stripping spaces at the ends) to one of their references."""
    multi = _references(refs)
    if len(hyps) != len(multi):
        raise ValueError(f"{len(hyps)} hypotheses but {len(multi)} references")
    if not hyps:
        return math.nan
    return sum(h.strip() in {x.strip() for x in r} for h, r in zip(hyps, multi, strict=True)) / len(hyps)


def translation_metrics(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus BLEU and chrF (sacrebleu, every reference of a sentence used), exact match and the sentence count.

    ``refs[i]`` is one reference or a list of them. With no sentences, the scores are NaN (not 0).
    """
    import sacrebleu

    multi = _references(refs)
    em = exact_match(hyps, multi)
    if not hyps:
        return {"exact_match": math.nan, "bleu": math.nan, "chrf": math.nan, "sentences": 0.0}
    width = max(len(r) for r in multi)
    streams = [[r[i] if i < len(r) else r[0] for r in multi] for i in range(width)]
    return {"exact_match": em, "bleu": sacrebleu.corpus_bleu(list(hyps), streams).score,
            "chrf": sacrebleu.corpus_chrf(list(hyps), streams).score, "sentences": float(len(hyps))}


def bleu_by_length(hyps: Sequence[str], refs: Sequence[Sequence[str]], lengths: Sequence[int],
                   buckets: Sequence[tuple[int, int]]) -> list[dict[str, float | str]]:
    """:func:`translation_metrics` of the sentences whose source length falls in each ``[lo, hi]`` bucket, with
    the bucket's name under ``"bucket"`` (``"0-10"``)."""
    rows: list[dict[str, float | str]] = []
    for lo, hi in buckets:
        sel = [i for i, n in enumerate(lengths) if lo <= n <= hi]
        rows.append({"bucket": f"{lo}-{hi}", **translation_metrics([hyps[i] for i in sel], [refs[i] for i in sel])})
    return rows
