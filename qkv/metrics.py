"""Metrics every application shares: accuracy and cross-entropy, regression errors, exact match, BLEU and chrF.

BLEU and chrF are sacrebleu's (Post, 2018, "A Call for Clarity in Reporting BLEU Scores",
https://aclanthology.org/W18-6319), from the ``train`` extra. Inputs are tensors of logits and labels, or lists
of strings; results are plain floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["accuracy", "cross_entropy", "classification_metrics", "regression_metrics", "exact_match",
           "translation_metrics", "bleu_by_length"]
__all__ += ["normalize_answer", "answer_exact_match", "answer_f1", "squad_metrics"]  # question answering
__all__ += ["caption_bleu", "box_mass", "grounding"]  # image captioning
__all__ += ["rouge", "repeated_ngram_rate"]  # summarisation
__all__ += ["confusion_matrix", "segmentation_metrics"]  # semantic segmentation


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


# --------------------------------------------------------------------------- question answering (SQuAD's definitions)

def normalize_answer(text: str, *, chars: bool = False) -> str:
    """SQuAD v1.1's normalisation: lower-case, remove punctuation, remove the articles a/an/the, collapse white
    space (Rajpurkar et al., 2016, the official ``evaluate-v1.1.py``). ``chars=True`` (Chinese) also removes every
    Unicode punctuation mark (，。？ ...) and all white space."""
    import re
    import string
    import unicodedata

    text = text.lower()
    drop = set(string.punctuation)
    text = "".join(c for c in text if c not in drop and not (chars and unicodedata.category(c).startswith("P")))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return "".join(text.split()) if chars else " ".join(text.split())


def _is_cjk(text: str) -> bool:
    return any("\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff" for c in text)


def _answer_units(text: str, chars: bool) -> list[str]:
    norm = normalize_answer(text, chars=chars)
    return list(norm) if chars else norm.split()


def answer_f1(prediction: str, ground_truths: str | Sequence[str], *, chars: bool | None = None) -> float:
    """SQuAD's token F1 of ``prediction`` against the best of ``ground_truths``: the overlap of the normalised
    bags of words (of characters when ``chars``; default: characters when a text holds CJK characters)."""
    from collections import Counter

    golds = [ground_truths] if isinstance(ground_truths, str) else list(ground_truths)
    if not golds:
        raise ValueError("no ground-truth answers")
    best = 0.0
    for gold in golds:
        c = (_is_cjk(prediction) or _is_cjk(gold)) if chars is None else chars
        p, g = _answer_units(prediction, c), _answer_units(gold, c)
        common = sum((Counter(p) & Counter(g)).values())
        if common:
            precision, recall = common / len(p), common / len(g)
            best = max(best, 2 * precision * recall / (precision + recall))
        elif not p and not g:
            best = max(best, 1.0)
    return best


def answer_exact_match(prediction: str, ground_truths: str | Sequence[str], *, chars: bool | None = None) -> float:
    """1.0 when the normalised ``prediction`` equals one of the normalised ``ground_truths``, else 0.0."""
    golds = [ground_truths] if isinstance(ground_truths, str) else list(ground_truths)
    if not golds:
        raise ValueError("no ground-truth answers")
    for gold in golds:
        c = (_is_cjk(prediction) or _is_cjk(gold)) if chars is None else chars
        if normalize_answer(prediction, chars=c) == normalize_answer(gold, chars=c):
            return 1.0
    return 0.0


def squad_metrics(predictions: Sequence[str], ground_truths: Sequence[Sequence[str]], *,
                  chars: bool | None = None) -> dict[str, float]:
    """``{"exact_match", "f1", "questions"}``: means over the questions (fractions in [0, 1]; NaN with none)."""
    if len(predictions) != len(ground_truths):
        raise ValueError(f"{len(predictions)} predictions but {len(ground_truths)} lists of answers")
    n = len(predictions)
    if not n:
        return {"exact_match": math.nan, "f1": math.nan, "questions": 0.0}
    em = sum(answer_exact_match(p, g, chars=chars) for p, g in zip(predictions, ground_truths, strict=True))
    f1 = sum(answer_f1(p, g, chars=chars) for p, g in zip(predictions, ground_truths, strict=True))
    return {"exact_match": em / n, "f1": f1 / n, "questions": float(n)}


# ----------------------------------------------------------------------------------------------- image captioning

def caption_bleu(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus BLEU-1 to BLEU-4 (sacrebleu, ``max_ngram_order`` 1..4, every reference of an image used), as
    ``{"bleu1": ..., "bleu4": ...}`` on the 0-100 scale; NaN with no hypotheses."""
    from sacrebleu.metrics import BLEU

    multi = _references(refs)
    if len(hyps) != len(multi):
        raise ValueError(f"{len(hyps)} hypotheses but {len(multi)} references")
    if not hyps:
        return {f"bleu{n}": math.nan for n in range(1, 5)}
    width = max(len(r) for r in multi)
    streams = [[r[i] if i < len(r) else r[0] for r in multi] for i in range(width)]
    return {f"bleu{n}": BLEU(max_ngram_order=n).corpus_score(list(hyps), streams).score for n in range(1, 5)}


def box_mass(attention: Tensor, box: Sequence[float], image_size: Sequence[int]) -> float:
    """The share of ``attention (h, w)`` that falls inside ``box = (y0, x0, y1, x1)`` (pixels, end exclusive) of
    an image of ``image_size = (H, W)``: each grid cell covers ``H/h x W/w`` pixels and its weight is spread
    evenly over them, so a cell half inside the box counts half. Weights need not sum to 1 (the mass is a
    fraction of their sum)."""
    a = attention.detach().double()
    if a.dim() != 2:
        raise ValueError(f"attention must be (h, w), got {tuple(a.shape)}")
    h, w = a.shape
    hh, ww = image_size
    y0, x0, y1, x1 = (float(v) for v in box)
    if not (0 <= y0 <= y1 <= hh and 0 <= x0 <= x1 <= ww):
        raise ValueError(f"box {tuple(box)} is not (y0, x0, y1, x1) inside a {hh}x{ww} image")
    ys = torch.arange(h + 1, dtype=torch.float64) * (hh / h)
    xs = torch.arange(w + 1, dtype=torch.float64) * (ww / w)
    fy = (torch.minimum(ys[1:], torch.tensor(y1)) - torch.maximum(ys[:-1], torch.tensor(y0))).clamp_min(0) / (hh / h)
    fx = (torch.minimum(xs[1:], torch.tensor(x1)) - torch.maximum(xs[:-1], torch.tensor(x0))).clamp_min(0) / (ww / w)
    total = float(a.sum())
    return float((a * fy[:, None] * fx[None, :]).sum()) / total if total > 0 else 0.0


def grounding(masses: Sequence[float], threshold: float = 0.5) -> dict[str, float]:
    """``{"grounding": mean, "grounding_above": share > threshold, "grounded_words": count}`` of the attention
    masses (:func:`box_mass`) of the words that name an item; NaN with no such words."""
    n = len(masses)
    if not n:
        return {"grounding": math.nan, "grounding_above": math.nan, "grounded_words": 0.0}
    return {"grounding": sum(masses) / n, "grounding_above": sum(m > threshold for m in masses) / n,
            "grounded_words": float(n)}


# --------------------------------------------------------------------------- summarisation

def rouge(hyps: Sequence[str], refs: Sequence[str], *,
          tokenize: Callable[[str], list[str]] | None = None) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 (x 100, averaged over the texts) of ``rouge-score`` (Lin, 2004, "ROUGE: A
    Package for Automatic Evaluation of Summaries", https://aclanthology.org/W04-1013; Google's re-implementation,
    from the ``summarize`` extra). ``tokenize``: the words of a text (default: rouge-score's, lower-cased ASCII
    letters and digits only; give one that keeps CJK characters for Chinese)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:  # pragma: no cover - the extra is missing
        raise ImportError("ROUGE needs rouge-score: pip install qkv[summarize]") from None
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} outputs but {len(refs)} references")
    if not hyps:
        raise ValueError("no outputs to score")

    class _Words:
        def tokenize(self, text: str) -> list[str]:
            return tokenize(text)

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"],
                                      tokenizer=_Words() if tokenize is not None else None)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for h, r in zip(hyps, refs, strict=True):
        for name, score in scorer.score(r, h).items():
            totals[name] += score.fmeasure
    return {name: 100.0 * v / len(hyps) for name, v in totals.items()}


def repeated_ngram_rate(outputs: Sequence[Sequence[str]], n: int = 3) -> float:
    """The share of the ``n``-grams of the outputs (token lists) that repeat an earlier ``n``-gram of the same
    output: 0 without repetition, near 1 for "the the the ..."; NaN when no output has ``n`` tokens."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    total = repeated = 0
    for tokens in outputs:
        seen: set[tuple[str, ...]] = set()
        for i in range(len(tokens) - n + 1):
            gram = tuple(tokens[i:i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / total if total else math.nan


# --------------------------------------------------------------------------- semantic segmentation

def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, *, ignore_index: int | None = None) -> Tensor:
    """``(K, K)`` int64 counts of pixels of true class ``i`` (row) predicted ``j`` (column), from label maps
    ``pred`` and ``target`` of one shape; pixels whose target is ``ignore_index`` are not counted, and a target
    outside ``0..K-1`` otherwise is a ``ValueError``."""
    if pred.shape != target.shape:
        raise ValueError(f"predictions {tuple(pred.shape)} and targets {tuple(target.shape)} differ in shape")
    p, t = pred.reshape(-1).long(), target.reshape(-1).long()
    if ignore_index is not None:
        keep = t != ignore_index
        p, t = p[keep], t[keep]
    for name, x in (("target", t), ("prediction", p)):
        if len(x) and (int(x.min()) < 0 or int(x.max()) >= num_classes):
            raise ValueError(f"a {name} label outside 0..{num_classes - 1}: {int(x.min())}..{int(x.max())}")
    return torch.bincount(t * num_classes + p, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def segmentation_metrics(confusion: Tensor, class_names: Sequence[str] | None = None) -> dict[str, float]:
    """``{"miou", "pixel_accuracy", "iou/NAME"...}`` of a confusion matrix (:func:`confusion_matrix`).

    ``IoU_k = TP / (TP + FP + FN)``; a class neither present nor predicted has IoU NaN and is left out of the mean
    (as mmsegmentation does). ``pixel_accuracy``: the share of counted pixels predicted right; ``pixels``: how
    many were counted."""
    c = confusion.double()
    k = c.shape[0]
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    if c.dim() != 2 or c.shape[1] != k or len(names) != k:
        raise ValueError(f"confusion must be (K, K) with K = {len(names)} class names, got {tuple(c.shape)}")
    tp = c.diagonal()
    union = c.sum(0) + c.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, math.nan))
    total = float(c.sum())
    seen = ~iou.isnan()
    out = {"miou": float(iou[seen].mean()) if seen.any() else math.nan,
           "pixel_accuracy": float(tp.sum()) / total if total else math.nan, "pixels": total}
    out.update({f"iou/{n}": float(v) for n, v in zip(names, iou, strict=True)})
    return out
