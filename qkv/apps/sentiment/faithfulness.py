"""Does a sentiment model's attention explain its decisions? :func:`comprehensiveness`, ERASER's score
(``qkv faithfulness``)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from ...train.threads import follow_threads

__all__ = ["comprehensiveness"]


@torch.no_grad()
def comprehensiveness(clf, texts: Sequence[str], *, k: int = 1, draws: int = 5, seed: int = 0) -> dict[str, float]:
    """Does the attention explain? Remove the ``k`` most-attended tokens of each text, or ``k`` random ones, and
    measure how much the probability of the predicted class drops (ERASER's comprehensiveness, DeYoung et al.
    2020; tokens removed, the rest kept in order).

    ``clf`` is a :class:`~qkv.apps.sentiment.SentimentClassifier` of a classification run. Texts with at most
    ``k`` tokens are skipped. Returns the means over texts: ``attention`` (the drop when removing the most
    attended), ``random`` (the mean drop over ``draws`` random removals), ``difference`` and ``wins`` (the share
    of texts where the attention removal drops more than the random mean), and ``texts`` (how many counted).
    """
    from ...data.text_classification import collate_texts

    if clf.regression:
        raise ValueError("comprehensiveness needs a classification run (this one predicts a value)")
    if k < 1 or draws < 1:
        raise ValueError(f"k and draws must be >= 1, got {k} and {draws}")
    rng = random.Random(seed)
    att, rnd, wins, n = 0.0, 0.0, 0, 0

    def probs(batch_ids: list[list[int]]) -> torch.Tensor:
        b = collate_texts([(x, 0) for x in batch_ids])
        return clf.model(b["ids"].to(clf.device), b["mask"].to(clf.device)).logits.float().softmax(-1).cpu()

    for start in follow_threads(range(0, len(texts), 64), lambda s: sum(map(len, texts[s:s + 64])),
                                device=clf.device):
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
