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

__all__ = ["head_statistics", "STATISTICS"]

#: the statistics, with what each means (shown on the page)
STATISTICS = {
    "entropy": "entropy of each row's weights, in nats (low: attends to few keys)",
    "distance": "mean distance between a query and the keys it attends to, in positions",
    "first": "share of attention on the first token (an attention sink)",
    "previous": "share of attention on the previous token",
    "induction": "share on the tokens that followed an earlier occurrence of the current token (copying)",
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
    w = weights if weights.dtype == torch.float64 else weights.float()
    h, tq, tk = w.shape
    if tokens is not None and len(tokens) != tk:
        raise ValueError(f"tokens must give the {tk} key positions, got {len(tokens)}")
    live = w.sum(-1) > 0  # (H, Tq) rows with any weight

    def mean_rows(x: Tensor, rows: Tensor | None = None) -> Tensor:  # x (H, Tq) -> (H,)
        keep = live if rows is None else live & rows
        count = keep.sum(-1)
        out = (x * keep).sum(-1) / count.clamp_min(1)
        return torch.where(count > 0, out, torch.full_like(out, float("nan")))

    nan = torch.full((h,), float("nan"), dtype=w.dtype)
    entropy = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)
    out = {"entropy": mean_rows(entropy), "first": mean_rows(w[..., 0])}
    if not self_attention or tq > tk:
        out.update(distance=nan, previous=nan, induction=nan)
        return {k: v.float() for k, v in out.items()}
    qpos = torch.arange(tk - tq, tk, dtype=w.dtype)  # (Tq,) position of each query
    kpos = torch.arange(tk, dtype=w.dtype)
    out["distance"] = mean_rows((w * (qpos[:, None] - kpos[None, :]).abs()).sum(-1))
    prev_idx = (qpos - 1).long()
    has_prev = prev_idx >= 0
    prev = w[:, torch.arange(tq), prev_idx.clamp_min(0)] * has_prev
    out["previous"] = mean_rows(prev, has_prev[None].expand(h, tq))
    if tokens is None:
        out["induction"] = nan
    else:
        # follows[i, j]: key j followed an earlier occurrence of query i's token (token[j-1] == token[i], j <= i)
        ids = {t: n for n, t in enumerate(dict.fromkeys(tokens))}
        key_ids = torch.tensor([ids[t] for t in tokens])
        q_ids = key_ids[tk - tq:]
        before = torch.cat([torch.tensor([-1]), key_ids[:-1]])  # token before each key position
        follows = (before[None, :] == q_ids[:, None]) & (kpos[None, :] <= qpos[:, None])
        rows = follows.any(-1)
        out["induction"] = mean_rows((w * follows).sum(-1), rows[None].expand(h, tq))
    return {k: v.float() for k, v in out.items()}
