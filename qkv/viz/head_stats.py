"""Statistics of attention heads, to find the heads that do something: :func:`head_statistics`.

For the weights of one attention module ``(H, Tq, Tk)`` (the queries being the last ``Tq`` of the ``Tk`` positions,
as in a decoder's self-attention with a cache; ``Tq == Tk`` for a whole sequence), each statistic is averaged over
the query rows that have any weight:

- ``entropy``: ``-sum_j w_ij log w_ij`` in nats (0: one key takes everything; ``log n``: spread evenly over n);
- ``distance``: mean attention distance ``sum_j w_ij |i - j|``, in positions (self-attention only);
- ``first``: the share on the first key (an "attention sink" parks there);
- ``previous``: the share on the key just before the query (rows from the second position on);
- ``induction``: the share on the keys that followed an earlier occurrence of the query's token: for query ``i``
  with token ``t``, every ``j <= i`` such that ``token[j - 1] == t`` (a head that copies what came after the same
  token before: Olsson et al., "In-context Learning and Induction Heads", 2022); rows whose token occurs for the
  first time do not count; NaN when no token repeats.

Example::

    stats = head_statistics(record.weights[0], tokens=["the", "cat", "the", "cat"])
    stats["previous"]          # (H,): one value per head
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

__all__ = ["head_statistics", "STATISTICS", "MEASURES"]

#: the statistics, with what each means (shown on the page)
STATISTICS = {
    "entropy": "entropy of each row's weights, in nats (low: attends to few keys)",
    "distance": "mean distance between a query and the keys it attends to, in positions",
    "first": "share of attention on the first token (an attention sink)",
    "previous": "share of attention on the previous token",
    "induction": "share on the tokens that followed an earlier occurrence of the current token (copying)",
}

#: the measures beside the weights, with what each means and does not (shown on the page; computed by
#: :mod:`qkv.integrations.importance`)
MEASURES = {
    "importance": "increase of the model's mean loss on this text, in nats, when this head's output is zeroed "
                  "before the output projection, one head at a time. It says how much this output depends on the "
                  "head here; not what the head does, nor whether heads matter together (they can stand in for "
                  "each other), and a zeroed head is itself an unusual input to the later layers.",
    "value-weighted": "each weight times the norm of the value vector it reads (Kobayashi et al. 2020), rows "
                      "rescaled to 1: a key whose value is small gives little even with a large weight. It leaves "
                      "out the output projection and the residual stream.",
    "attention x gradient": "each weight times the gradient of the chosen token's log-probability with respect "
                            "to it: where a small change of the weight would move that prediction (local, first "
                            "order).",
}


def head_statistics(weights: Tensor, tokens: Sequence[Hashable] | None = None, *,
                    self_attention: bool = True) -> dict[str, Tensor]:
    """``{statistic: (H,)}`` for the weights ``(H, Tq, Tk)`` of one module (see the module's docstring).

    Args:
        weights: ``(H, Tq, Tk)``, rows summing to 1 (or 0 where a row sees no key), float.
        tokens: the ``Tk`` tokens of the key positions (any hashable: ids or strings), for ``induction``.
        self_attention: queries and keys are one sequence (``distance``, ``previous`` and ``induction`` are NaN
            for cross-attention).
    """
    if weights.dim() != 3:
        raise ValueError(f"weights must be (H, Tq, Tk), got {tuple(weights.shape)}")
    h, tq, tk = weights.shape
    if tokens is not None and len(tokens) != tk:
        raise ValueError(f"tokens must give the {tk} key positions, got {len(tokens)}")
    dtype = torch.float64 if weights.dtype == torch.float64 else torch.float32
    positional = self_attention and tq <= tk
    follows = None
    if positional and tokens is not None:
        # follows[i, j]: key j followed an earlier occurrence of query i's token (token[j-1] == token[i], j <= i)
        ids = {t: n for n, t in enumerate(dict.fromkeys(tokens))}
        key_ids = torch.tensor([ids[t] for t in tokens])
        before = torch.cat([torch.tensor([-1]), key_ids[:-1]])
        follows = (before[None, :] == key_ids[tk - tq:, None]) & torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    per_head = [_one_head(weights[i].to(dtype), positional, follows) for i in range(h)]
    return {k: torch.stack([p[k] for p in per_head]).float() for k in STATISTICS}


def _mean(x: Tensor, rows: Tensor) -> Tensor:
    """The mean of ``x (Tq,)`` over ``rows`` (bool), NaN when there are none."""
    n = int(rows.sum())
    return (x * rows).sum() / n if n else torch.tensor(float("nan"), dtype=x.dtype)


def _one_head(w: Tensor, positional: bool, follows: Tensor | None) -> dict[str, Tensor]:
    """The statistics of one head's weights ``(Tq, Tk)``: a few passes over the matrix, no (Tq, Tk) temporaries
    but a lower triangle (the sums of ``|i - j| w_ij`` come from prefix sums)."""
    tq, tk = w.shape
    total = w.sum(-1)
    live = total > 0
    nan = torch.tensor(float("nan"), dtype=w.dtype)
    out = {"entropy": _mean(torch.special.entr(w).sum(-1), live), "first": _mean(w[:, 0], live)}
    if not positional:
        return {**out, "distance": nan, "previous": nan, "induction": nan}
    i = torch.arange(tk - tq, tk, dtype=w.dtype)  # (Tq,) position of each query
    k = torch.arange(tk, dtype=w.dtype)
    lower = torch.tril(w, diagonal=tk - tq)  # keys at or before each query
    below, below_pos = lower.sum(-1), lower @ k
    del lower
    # sum_j w_ij |i - j| = i (2 L - S) - 2 M + T, with L, M the sums of w and j w over j <= i, S, T over all j
    distance = i * (2 * below - total) - 2 * below_pos + w @ k
    out["distance"] = _mean(distance, live)
    has_prev = i >= 1
    prev = w[torch.arange(tq), (i - 1).clamp_min(0).long()] * has_prev
    out["previous"] = _mean(prev, live & has_prev)
    if follows is None:
        out["induction"] = nan
    else:
        out["induction"] = _mean(torch.where(follows, w, 0).sum(-1), live & follows.any(-1))
    return out
