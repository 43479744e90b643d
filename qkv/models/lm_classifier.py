"""A text classifier whose body is a pretrained causal language model (:class:`LMClassifier`).

Paper: Howard & Ruder, 2018, "Universal Language Model Fine-tuning for Text Classification" (ULMFiT,
https://arxiv.org/abs/1801.06146): a language model trained on unlabelled text, then a classifier head over its
states, fine-tuned with discriminative learning rates (lower for lower layers) and gradual unfreezing (the head
first, then one more layer from the top). What differs here: the body is a GPT-style Transformer
(:class:`~qkv.models.lm.CausalLM`) instead of an AWD-LSTM, and the head reads attention pooling over the states
(whose weights are the classifier's visible output, as for qkv's other classifiers) beside the last token's state,
where ULMFiT concatenates the last state with max and mean pooling. The rates and the schedule are the trainer's
(:meth:`LMClassifier.layer_groups` names the groups, bottom to top).

Axis letters: ``B`` batch, ``T`` tokens, ``E`` model width, ``R`` pooling queries (hops), ``C`` classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..layers.pooling import AttentionPooling
from .classifiers import ClassifierOutput, _check_inputs
from .lm import CausalLM, LMConfig

__all__ = ["LMClassifier"]


class LMClassifier(nn.Module):
    """``ids (B, T)``, ``mask (B, T)`` -> ``(logits (B, C), weights)``, read by a causal language model's body.

    Args:
        lm: the language model's configuration (the fields of :class:`~qkv.models.lm.LMConfig`); its weights are
            loaded apart, into :attr:`body` (``body.load_state_dict(lm_state_dict)``).
        num_classes: ``C`` (1 for regression).
        bos_id: the token read before every text (the language model's document start, its ``<eos>``), so that
            the first word is read as the start of a document, as in pretraining.
        hops: ``R`` queries of the attention pooling.  dropout: on the pooled features, before the output layer.

    A text reads at most ``lm["max_len"] - 1`` tokens (one position is the document start) with learned or
    sinusoidal positions. A backward language model (``lm["reverse"]``) reads each text from its last token to its
    first, as it was trained; the weights it returns are in the text's own order.
    """

    def __init__(self, lm: Mapping[str, Any], num_classes: int, *, bos_id: int, hops: int = 1,
                 dropout: float = 0.1):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.body = CausalLM(LMConfig(**lm))
        if not 0 <= bos_id < self.body.cfg.vocab_size:
            raise ValueError(f"bos_id ({bos_id}) must be a token id (< vocab_size {self.body.cfg.vocab_size})")
        dim = self.body.cfg.dim
        self.bos_id, self.hops = bos_id, hops
        self.pool = AttentionPooling(dim, num_queries=hops)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim * (hops + 1), num_classes)

    @property
    def max_tokens(self) -> int | None:
        """The most tokens of a text the model reads (``None``: any, with ALiBi)."""
        return None if self.body.context is None else self.body.context - 1

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> ClassifierOutput:
        """``ids (B, T)`` right-padded, ``mask (B, T)`` bool, True at real tokens -> ``(logits (B, C), weights)``:
        ``weights (B, T)`` (``(B, R, T)`` for several hops) sum to 1 over the real tokens, 0 on padding."""
        mask = _check_inputs(ids, mask)
        b = ids.shape[0]
        order = _backwards(mask) if self.body.cfg.reverse else None
        if order is not None:
            ids = ids.gather(1, order)
        tokens = torch.cat([torch.full((b, 1), self.bos_id, dtype=ids.dtype, device=ids.device), ids], dim=1)
        states = self.body.features(tokens)  # causal: padding on the right never reaches a real token
        pooled, weights = self.pool(states[:, 1:], mask)
        last = states[torch.arange(b, device=ids.device), mask.sum(1)]  # the last real token read (or the start)
        features = torch.cat([pooled.reshape(b, -1), last], dim=-1)
        if order is not None:  # the weights of each token in the text's own order (the reversal is its own inverse)
            weights = weights.gather(-1, order if weights.dim() == 2 else order[:, None].expand_as(weights))
        return ClassifierOutput(self.head(self.drop(features)), weights)

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """The parameters in groups from the bottom up: the embeddings (tokens and positions), each Transformer
        layer, then the head (the final norm, the pooling and the output layer): what discriminative learning
        rates and gradual unfreezing act on."""
        embed = list(self.body.embed.parameters()) + ([] if self.body.pos is None else list(self.body.pos.parameters()))
        head = [*self.body.norm.parameters(), *self.pool.parameters(), *self.head.parameters()]
        return [embed, *(list(layer.parameters()) for layer in self.body.layers), head]


def _backwards(mask: Tensor) -> Tensor:
    """``(B, T)`` indices that reverse each right-padded row's real tokens and leave its padding where it is; a mask
    whose real tokens do not come first is a ``ValueError`` (a backward model could not tell where a text ends)."""
    t = mask.shape[1]
    lengths = mask.sum(1, keepdim=True)
    pos = torch.arange(t, device=mask.device)[None]
    if not torch.equal(mask, pos < lengths):
        raise ValueError("a backward language model reads right-padded texts: mask must be True on each row's first "
                         "tokens and False after them")
    return torch.where(pos < lengths, lengths - 1 - pos, pos)
