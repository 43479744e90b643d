"""CTC for decoding: greedy (best path) decoding and the CTC prefix scorer of joint CTC/attention beam search.

:class:`CTCPrefixScorer` is a :class:`~qkv.models.decoding.PrefixScorer`: for every hypothesis ``g`` and next
token ``c`` it gives ``weight * (psi(g + c) - psi(g))``, where ``psi(h)`` is the CTC *prefix* probability, the
probability that the collapsed CTC output begins with ``h`` (summed over all alignments of all continuations),
and ``psi(g + <eos>)`` the probability that the output is exactly ``g``. Watanabe et al., 2017, "Hybrid
CTC/Attention Architecture for End-to-End Speech Recognition" (https://ieeexplore.ieee.org/document/8068205),
Algorithm 2, computed for every next token at once (vectorised over hypotheses and the vocabulary, a loop over
frames).

With the attention decoder's log-probabilities weighted by ``1 - weight`` (:func:`joint_step`), the beam ranks
hypotheses by ``(1 - weight) log p_att(g) + weight log p_ctc(g)``.

:func:`ctc_beam_search` is CTC prefix beam search without attention: the same scorer with weight 1 is the only
score, so a hypothesis's score is ``log psi(g)`` while it grows and ``log P(y = g)`` once ended.

Axis letters: ``N`` hypotheses, ``S`` frames, ``V`` the vocabulary (``blank`` is one of its ids), ``t`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .decoding import PrefixScorer

__all__ = ["CTCPrefixScorer", "ctc_greedy", "ctc_beam_search", "joint_step"]

_NEG = float("-inf")


def ctc_greedy(log_probs: Tensor, lengths: Tensor, blank: int = 0) -> list[list[int]]:
    """Best-path decoding of ``log_probs (B, S, V)``: the most likely token per frame, repeats merged, blanks
    removed, over the first ``lengths (B,)`` frames of each row."""
    best = log_probs.argmax(-1)
    out = []
    for row, n in zip(best.tolist(), lengths.tolist(), strict=True):
        ids, last = [], None
        for tok in row[:n]:
            if tok != last and tok != blank:
                ids.append(tok)
            last = tok
        out.append(ids)
    return out


class CTCPrefixScorer(PrefixScorer):
    """CTC prefix scores for :func:`qkv.models.decoding.search` (module docstring).

    Args:
        log_probs: ``(B, S, V)`` CTC log-probabilities of the ``B`` inputs.  lengths: ``(B,)`` their frames.
        blank: the blank id.  eos_id: the end token (scored as "the output is exactly this prefix").
        weight: ``lambda`` on the scores.  banned: ids that are never output (``<pad>``, ``<bos>``: ``-inf``).

    The state of ``N`` hypotheses is ``{"r": (N, S, 2), "psi": (N,), "x": (N, S, V), "len": (N,)}``: the forward
    variables ``r_t^n(g), r_t^b(g)`` (log-probabilities of the prefix ending at frame ``t`` in a non-blank or a blank)
    and ``psi(g)``. :meth:`initial_state` gives the ``B`` inputs' states for the search's ``prefix_state``.
    """

    def __init__(self, *, blank: int = 0, eos_id: int, weight: float = 1.0, banned: tuple[int, ...] = ()):
        self.blank, self.eos_id, self.weight, self.banned = blank, eos_id, weight, tuple(banned)

    def initial_state(self, log_probs: Tensor, lengths: Tensor) -> dict:
        """The empty prefix's state for each input: ``r^n = -inf``, ``r^b_t = sum_{u <= t} log p_u(blank)``."""
        x = log_probs.float()
        n, s, _ = x.shape
        r = torch.full((n, s, 2), _NEG, device=x.device)
        r[:, :, 1] = torch.cumsum(x[:, :, self.blank], dim=1)
        return {"r": r, "psi": torch.zeros(n, device=x.device), "x": x, "len": lengths.to(x.device).long()}

    def __call__(self, prefixes: Tensor, state: dict) -> tuple[Tensor, dict]:
        x, r_g, length = state["x"], state["r"], state["len"]
        n, s, v = x.shape
        dev = x.device
        last = prefixes[:, -1] if prefixes.shape[1] else torch.full((n,), -1, dtype=torch.long, device=dev)
        r_gsum = torch.logsumexp(r_g, dim=-1)  # (N, S): prefix g ends at t, in any state
        same = torch.arange(v, device=dev)[None, :] == last[:, None]  # (N, V): c repeats g's last token
        # phi_t(c) = r^b_t(g) if c == last(g) else r^b_t(g) + r^n_t(g), for every frame: (N, S, V)
        phi = torch.where(same[:, None, :], r_g[:, :, 1:2].expand(n, s, v), r_gsum[:, :, None].expand(n, s, v))
        r = torch.full((n, s, v, 2), _NEG, device=dev)
        if prefixes.shape[1] == 0:  # h = c: it may start at the first frame
            r[:, 0, :, 0] = x[:, 0]
        psi = r[:, 0, :, 0].clone()
        valid = torch.arange(s, device=dev)[None, :] < length[:, None]  # (N, S)
        for t in range(1, s):
            rn = torch.logaddexp(r[:, t - 1, :, 0], phi[:, t - 1]) + x[:, t]
            rb = torch.logaddexp(r[:, t - 1, :, 0], r[:, t - 1, :, 1]) + x[:, t, self.blank:self.blank + 1]
            r[:, t, :, 0], r[:, t, :, 1] = rn, rb
            add = torch.where(valid[:, t, None], phi[:, t - 1] + x[:, t], torch.full_like(psi, _NEG))
            psi = torch.logaddexp(psi, add)
        end = (length - 1).clamp(min=0)
        psi[:, self.eos_id] = r_gsum.gather(1, end[:, None])[:, 0]  # the output is exactly g
        psi[:, self.blank] = _NEG
        for banned in self.banned:
            psi[:, banned] = _NEG
        scores = self.weight * (psi - state["psi"][:, None])
        impossible = torch.isneginf(state["psi"])[:, None] | torch.isnan(scores)  # g itself cannot be output
        scores = scores.masked_fill(impossible, _NEG)
        return scores, {"r": r, "psi": psi, "x": x, "len": length}

    def select(self, candidates: dict, rows: Tensor, tokens: Tensor) -> dict:
        r = candidates["r"][rows, :, tokens]  # (N, S, 2): extension `tokens` of hypothesis `rows`
        return {"r": r, "psi": candidates["psi"][rows, tokens], "x": candidates["x"][rows],
                "len": candidates["len"][rows]}


def ctc_beam_search(log_probs: Tensor, lengths: Tensor, *, beam: int = 8, blank: int = 0, eos_id: int,
                    banned: tuple[int, ...] = (), max_len: int | None = None) -> list:
    """CTC prefix beam search of ``log_probs (B, S, V)`` over the first ``lengths (B,)`` frames: the
    :class:`~qkv.models.decoding.Hypothesis` of highest ``P(y | x)`` found by :func:`qkv.models.decoding.search`
    with :class:`CTCPrefixScorer` as its only score (``eos_id``: the id that ends a hypothesis, never a CTC
    output; ``banned``: other ids never output). ``max_len``: most tokens (default ``S``, CTC's own limit)."""
    from .decoding import search

    b, s, v = log_probs.shape
    if lengths.shape != (b,):
        raise ValueError(f"lengths must be (B,) = ({b},), got {tuple(lengths.shape)}")
    if not 0 <= eos_id < v or not 0 <= blank < v or eos_id == blank:
        raise ValueError(f"blank ({blank}) and eos_id ({eos_id}) must be two different ids below V = {v}")
    scorer = CTCPrefixScorer(blank=blank, eos_id=eos_id, weight=1.0, banned=banned)
    state = scorer.initial_state(log_probs, lengths)
    zeros = log_probs.new_zeros(1, v).float()

    def step(tokens: Tensor, st):
        return zeros.expand(tokens.shape[0], v), None, st

    return search(step, {}, b, beam=beam, max_len=(max_len or s) + 1, length_penalty=0.0, prefix_scorer=scorer,
                  prefix_state=state, normalize=False, eos_id=eos_id, device=log_probs.device)


def joint_step(decode_step: Callable[[Tensor, Any], tuple[Tensor, Tensor | None, Any]],
               weight: float) -> Callable[[Tensor, Any], tuple[Tensor, Tensor | None, Any]]:
    """A step function giving ``(1 - weight) * log_softmax`` of ``decode_step``'s logits, for
    :func:`~qkv.models.decoding.search` with ``normalize=False`` and a :class:`CTCPrefixScorer` of ``weight``."""

    def step(tokens: Tensor, state: Any):
        logits, attn, state = decode_step(tokens, state)
        return (1.0 - weight) * torch.log_softmax(logits.float(), -1), attn, state

    return step
