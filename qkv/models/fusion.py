"""Language-model fusion in the one decoder: a causal language model's log-probabilities added to every step of a
beam (shallow fusion), beside the model's own and, where there is one, the CTC prefix scores.

Paper: Gulcehre et al., 2015, "On Using Monolingual Corpora in Neural Machine Translation"
(https://arxiv.org/abs/1503.03535), shallow fusion; Kannan et al., 2018, "An analysis of incorporating an external
language model into a sequence-to-sequence model" (https://arxiv.org/abs/1712.01996), with a length reward against
the early stops that a language model's preference for short outputs causes. The joint score of a hypothesis is

    log p_decoder(y) [+ lambda_ctc * log p_ctc(y)] + lambda_lm * log p_lm(y) + reward * |y|

where ``|y|`` counts the tokens before ``<eos>``. :class:`LMScorer` is a :class:`~qkv.models.decoding.PrefixScorer`
that keeps the language model's key/value caches per hypothesis (the prefix is read once); :class:`ScorerSum` adds
several scorers (CTC and LM).

The language model reads the decoder's tokens through a map of token strings (:func:`token_map`): both must
tokenise the same way (characters for characters); a decoder token the model does not know is scored as its
``<unk>``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..data.tokenize import UNK_ID
from .decoding import PrefixScorer, reorder_state

__all__ = ["LMScorer", "ScorerSum", "token_map", "fusion_scorer", "DEFAULT_WEIGHT"]

logger = logging.getLogger(__name__)

#: ``lambda_lm`` when a language model is given without a weight
DEFAULT_WEIGHT = 0.3


def token_map(decoder_tokenizer, lm_tokenizer) -> tuple[Tensor, float]:
    """``(map (V,), coverage)``: for every id of the decoder's vocabulary the language model's id of the same token
    string (its ``<unk>`` where it has none; the four special ids map to themselves), and the share of the decoder's
    ordinary tokens the language model knows. Tokenisers of different kinds are a ``ValueError``."""
    if decoder_tokenizer.kind != lm_tokenizer.kind:
        raise ValueError(f"the language model's tokens ({lm_tokenizer.kind}) are not the decoder's "
                         f"({decoder_tokenizer.kind}): train the language model with tokenizer="
                         f"{decoder_tokenizer.kind!r}")
    lm_ids = {tok: i for i, tok in enumerate(lm_tokenizer.tokens_of_ids(range(lm_tokenizer.vocab_size)))}
    strings = decoder_tokenizer.tokens_of_ids(range(decoder_tokenizer.vocab_size))
    specials = len(decoder_tokenizer.specials)
    ids = [i if i < specials else lm_ids.get(s, lm_tokenizer.unk_id) for i, s in enumerate(strings)]
    known = sum(s in lm_ids for s in strings[specials:])
    return torch.tensor(ids, dtype=torch.long), known / max(len(strings) - specials, 1)


class LMScorer(PrefixScorer):
    """``weight * log p_lm(next token | prefix) + reward`` (the reward on every token but ``eos_id``) for
    :func:`~qkv.models.decoding.search`.

    Args:
        lm: a :class:`~qkv.models.lm.CausalLM` (``new_caches()`` / ``step(tokens (N, L), caches)``).
        weight: ``lambda_lm``.  reward: added per token (a length reward; 0 for none).
        vocab_map: ``(V',)`` the language model's id of each decoder id (:func:`token_map`); ``None``: the same ids.
        eos_id: the decoder's end token.  start_id: what the language model reads first (its own ``<eos>``: the
            start of a document, as it was trained).

    The state of ``N`` hypotheses is ``{"caches": [KVCache, ...]}``, updated in place by each call (the last token
    of every prefix is read then) and reordered by the search like any other state. A prefix that outgrows a model
    with a bounded context (learned or sinusoidal positions) is read again from its last ``context // 2`` tokens,
    and the steps go on from there (a sliding window re-read every half context).
    """

    def __init__(self, lm: torch.nn.Module, *, weight: float, reward: float = 0.0, vocab_map: Tensor | None = None,
                 eos_id: int, start_id: int):
        if weight < 0:
            raise ValueError(f"the language model's weight must be >= 0, got {weight}")
        self.lm, self.weight, self.reward, self.eos_id, self.start_id = lm, float(weight), float(reward), eos_id, \
            start_id
        self.device = next(lm.parameters()).device
        self.vocab_map = None if vocab_map is None else vocab_map.to(self.device)
        self.unk_id = UNK_ID
        self.lm_vocab = lm.cfg.vocab_size

    def initial_state(self) -> dict[str, Any]:
        """Empty caches (the search repeats them for the beams when they are still empty: nothing to copy)."""
        return {"caches": self.lm.new_caches()}

    def lm_ids(self, tokens: Tensor) -> Tensor:
        """The language model's ids of decoder ``tokens``; a token of an extended vocabulary (a copied source word)
        is its ``<unk>``."""
        tokens = tokens.to(self.device)
        known = len(self.vocab_map) if self.vocab_map is not None else self.lm_vocab
        beyond = tokens >= known
        tokens = tokens.masked_fill(beyond, 0)
        ids = tokens if self.vocab_map is None else self.vocab_map[tokens]
        return ids.masked_fill(beyond, self.unk_id)

    @torch.no_grad()
    def __call__(self, prefixes: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        n, device = prefixes.shape[0], self.device
        fed = torch.full((n, 1), self.start_id, dtype=torch.long, device=device) if prefixes.shape[1] == 0 else \
            self.lm_ids(prefixes[:, -1:])
        context = getattr(self.lm, "context", None)
        if context is not None and len(state["caches"][0]) + 1 > context:
            # past the model's context: it reads the last half-context of each prefix afresh, then steps on
            state["caches"] = self.lm.new_caches()
            fed = self.lm_ids(prefixes[:, -max(context // 2, 1):])
        logp = torch.log_softmax(self.lm.step(fed, state["caches"])[:, -1].float(), dim=-1)
        if self.vocab_map is not None:
            logp = logp[:, self.vocab_map]
        scores = self.weight * logp
        if self.reward:
            bonus = torch.full_like(scores, self.reward)
            bonus[:, self.eos_id] = 0.0
            scores = scores + bonus
        return scores.to(prefixes.device), state


class ScorerSum(PrefixScorer):
    """The sum of several prefix scorers' scores; its state is the list of theirs (each selected by its own)."""

    def __init__(self, scorers: Sequence[PrefixScorer]):
        if not scorers:
            raise ValueError("ScorerSum needs at least one scorer")
        self.scorers = list(scorers)

    def __call__(self, prefixes: Tensor, state: list[Any]) -> tuple[Tensor, list[Any]]:
        total, candidates = None, []
        for scorer, own in zip(self.scorers, state, strict=True):
            scores, cand = scorer(prefixes, own)
            total = scores if total is None else total + scores
            candidates.append(cand)
        return total, candidates

    def select(self, candidates: list[Any], rows: Tensor, tokens: Tensor) -> list[Any]:
        return [scorer.select(c, rows, tokens) if hasattr(scorer, "select") else reorder_state(c, rows)
                for scorer, c in zip(self.scorers, candidates, strict=True)]


def fusion_scorer(lm, tokenizer, *, weight: float | None = None, reward: float = 0.0,
                  eos_id: int) -> LMScorer | None:
    """The :class:`LMScorer` of a trained language model ``lm`` (anything with ``.model``, a
    :class:`~qkv.models.lm.CausalLM`, and ``.tokenizer``) for a decoder whose tokens are ``tokenizer``'s.

    ``weight``: ``lambda_lm`` (``None``: :data:`DEFAULT_WEIGHT` with a model); ``reward``: per token. ``None`` is
    returned without a model, or when both are 0 (decoding without it). Weights below 0, or a weight or reward
    without a model, and a model that knows none of the decoder's tokens, are a ``ValueError``; one that knows only
    part of them is logged (the others are scored as its ``<unk>``)."""
    if weight is None:
        weight = DEFAULT_WEIGHT if lm is not None else 0.0
    if weight < 0 or reward < 0:
        raise ValueError(f"lm_weight and length_reward must be >= 0, got {weight} and {reward}")
    if lm is None:
        if weight or reward:
            raise ValueError("lm_weight and length_reward need a language model (lm)")
        return None
    if not weight and not reward:
        return None
    mapping, coverage = token_map(tokenizer, lm.tokenizer)
    if coverage == 0:
        raise ValueError("the language model knows none of the decoder's tokens (another language or alphabet?)")
    if coverage < 1:
        logger.warning("the language model knows %.0f%% of the decoder's tokens; the others are scored as its <unk>",
                       100 * coverage)
    return LMScorer(lm.model, weight=weight, reward=reward, vocab_map=mapping, eos_id=eos_id,
                    start_id=lm.tokenizer.eos_id)
