"""Look inside a trained run: every attention of one input (:func:`inspect_run`, for ``qkv view``), and whether a
classifier's attention explains its decisions (:func:`comprehensiveness`, ERASER's score).

Example::

    from qkv.tasks.inspect import inspect_run
    from qkv.viz.page import save_attention_page
    view = inspect_run("runs/dates", text="7 mars 2019")
    save_attention_page("dates.html", view.records, tokens=view.tokens, title=view.title, notes=view.notes)
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture import AttentionRecord, capture_attention

__all__ = ["PageInput", "inspect_run", "comprehensiveness", "INSPECTORS"]


@dataclass
class PageInput:
    """What :func:`qkv.viz.page.attention_page` needs: the records, axis labels, the image, a title and notes."""

    records: list[AttentionRecord]
    tokens: dict[str, list[str]] | list[str] | None = None
    image: Any = None
    title: str = "Attention"
    notes: list[str] = field(default_factory=list)

    def page_kwargs(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "image": self.image, "title": self.title, "notes": self.notes}


def _need_text(text: str | None, task: str) -> str:
    if text is None or not text.strip():
        raise ValueError(f"a {task} run needs a text to look at")
    return text


def _translate(run: str | os.PathLike, text: str | None, image: Any, device: str, **_) -> PageInput:
    from ..data import BOS_ID, EOS_ID, UNK_ID
    from ..models.decoding import greedy_decode
    from .translate import Translator

    tr = Translator.load(run, device)
    text = _need_text(text, "translation")
    dev = next(tr.model.parameters()).device
    src_ids = tr.src_tok.encode(text)[:256] or [UNK_ID]
    src = torch.tensor([src_ids], device=dev)
    mask = torch.ones_like(src, dtype=torch.bool)
    out = greedy_decode(tr.model, src, mask, max_len=100)[0].tokens
    produced = out + [EOS_ID]  # the rows: every produced token, the end included
    tgt_in = torch.tensor([[BOS_ID] + produced[:-1]], device=dev)
    with torch.no_grad(), capture_attention(tr.model) as records:
        tr.model(src, mask, tgt_in)
    tokens = {"source": tr.src_tok.tokens_of_ids(src_ids), "target": tr.tgt_tok.tokens_of_ids(produced)}
    return PageInput(records, tokens, title=f"{text} \u2192 {tr.tgt_tok.decode(out)}",
                     notes=[f"{tr.options.model} translation model; target rows are the tokens it produced (greedy)"])


def _sentiment(run: str | os.PathLike, text: str | None, image: Any, device: str, **_) -> PageInput:
    from .sentiment import SentimentClassifier

    clf = SentimentClassifier.load(run, device)
    text = _need_text(text, "sentiment")
    with capture_attention(clf.model) as records:  # the prediction's own forward pass, recorded
        (pred,) = clf.predict([text])
    label = f"{pred.value:+.2f}" if clf.regression else f"{pred.label} ({pred.probability:.2f})"
    tokens: dict[str, list[str]] | list[str] = pred.tokens
    if getattr(clf.model, "pooling", None) == "cls":  # a [CLS] query in front of the tokens, attending over them
        tokens = {"source": ["[CLS]", *pred.tokens], "target": ["[CLS]"]}
    return PageInput(records, tokens, title=f"{text} \u2192 {label}",
                     notes=[f"{clf.options.model} sentiment model"])


def _caption(run: str | os.PathLike, text: str | None, image: Any, device: str, *, index: int | None = None,
             **_) -> PageInput:
    from .caption import Captioner

    cap = Captioner.load(run, device)
    if index is not None:
        image = cap.test_images([index])[0][0]
    if image is None:
        raise ValueError("a captioning run needs --image FILE or --index N (an image of its test split)")
    x = cap.read(image) if isinstance(image, (str, os.PathLike)) else image
    with torch.no_grad(), capture_attention(cap.model) as records:
        (caption,) = cap.predict(x[None], beam=1)
    words = list(caption.words)
    return PageInput(records, {"target": [*words, "<eos>"], "words": words}, x.float() / 255,
                     title=caption.text, notes=[f"{cap.options.model} captioning model, greedy decoding; pick a "
                                                "word as the query of the image view"])


#: task name -> ``fn(run, text, image, device) -> PageInput``; an application adds itself here
INSPECTORS: dict[str, Callable[..., PageInput]] = {"translate": _translate, "sentiment": _sentiment,
                                                   "caption": _caption}


def inspect_run(run: str | os.PathLike, *, text: str | None = None, image: Any = None, index: int | None = None,
                question: str | None = None, device: str = "cpu") -> PageInput:
    """Every attention of ``run``'s model on one input: ``text`` (translation, sentiment; the context of question
    answering, with ``question``), or ``image`` (a path or a tensor, for image and captioning runs) or ``index``
    (an image of the run's test split). Raises ``ValueError`` for an input the run cannot take."""
    from ..train.checkpoint import load_checkpoint

    task = load_checkpoint(run).task
    if task not in INSPECTORS:
        raise ValueError(f"{run} is a {task!r} run; qkv view knows {', '.join(sorted(INSPECTORS))}")
    return INSPECTORS[task](run, text, image, device, index=index, question=question)


@torch.no_grad()
def comprehensiveness(clf, texts: Sequence[str], *, k: int = 1, draws: int = 5, seed: int = 0) -> dict[str, float]:
    """Does the attention explain? Remove the ``k`` most-attended tokens of each text, or ``k`` random ones, and
    measure how much the probability of the predicted class drops (ERASER's comprehensiveness, DeYoung et al.
    2020; tokens removed, the rest kept in order).

    ``clf`` is a :class:`~qkv.tasks.sentiment.SentimentClassifier` of a classification run. Texts with at most
    ``k`` tokens are skipped. Returns the means over texts: ``attention`` (the drop when removing the most
    attended), ``random`` (the mean drop over ``draws`` random removals), ``difference`` and ``wins`` (the share
    of texts where the attention removal drops more than the random mean), and ``texts`` (how many counted).
    """
    from ..data.text_classification import collate_texts

    if clf.regression:
        raise ValueError("comprehensiveness needs a classification run (this one predicts a value)")
    if k < 1 or draws < 1:
        raise ValueError(f"k and draws must be >= 1, got {k} and {draws}")
    rng = random.Random(seed)
    att, rnd, wins, n = 0.0, 0.0, 0, 0

    def probs(batch_ids: list[list[int]]) -> torch.Tensor:
        b = collate_texts([(x, 0) for x in batch_ids])
        return clf.model(b["ids"].to(clf.device), b["mask"].to(clf.device)).logits.float().softmax(-1).cpu()

    for start in range(0, len(texts), 64):
        chunk = [t for t in texts[start:start + 64] if isinstance(t, str) and t.strip()]
        ids = [x[: clf.max_len] for x in clf.tokenizer.encode_batch(chunk)]
        keep = [i for i, x in enumerate(ids) if len(x) > k]
        if not keep:
            continue
        ids = [ids[i] for i in keep]
        b = collate_texts([(x, 0) for x in ids])
        res = clf.model(b["ids"].to(clf.device), b["mask"].to(clf.device))
        p = res.logits.float().softmax(-1).cpu()
        w = res.weights.float().cpu()
        w = w.mean(1) if w.dim() == 3 else w
        cls = p.argmax(-1)
        top = [set(w[i, :len(x)].topk(k).indices.tolist()) for i, x in enumerate(ids)]
        removed = [[t for j, t in enumerate(x) if j not in top[i]] for i, x in enumerate(ids)]
        p_att = probs(removed)
        p_rnd = torch.zeros(len(ids))
        for _ in range(draws):
            drop = [set(rng.sample(range(len(x)), k)) for x in ids]
            q = probs([[t for j, t in enumerate(x) if j not in drop[i]] for i, x in enumerate(ids)])
            p_rnd += q[torch.arange(len(ids)), cls] / draws
        base = p[torch.arange(len(ids)), cls]
        d_att = base - p_att[torch.arange(len(ids)), cls]
        d_rnd = base - p_rnd
        att += float(d_att.sum())
        rnd += float(d_rnd.sum())
        wins += int((d_att > d_rnd).sum())
        n += len(ids)
    if n == 0:
        raise ValueError(f"no text has more than k={k} tokens")
    return {"attention": att / n, "random": rnd / n, "difference": (att - rnd) / n, "wins": wins / n, "texts": n}
