"""What every captioner shares, below the models that use it: the teacher-forced result :class:`CaptionOutput`,
:func:`rows_of` (a decoding state's per-image rows taken for each caption) and the loss terms that belong to a
model (:class:`CaptionLosses`: Xu et al.'s doubly stochastic penalty, the hard model's REINFORCE terms). Re-exported
by :mod:`qkv.models.captioning`.

Axis letters: ``B`` images, ``R`` captions (rows of a teacher-forced batch), ``T`` caption positions, ``L`` grid
positions, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["CaptionOutput", "CaptionLosses", "rows_of", "doubly_stochastic_penalty", "reinforce_loss"]


@dataclass
class CaptionOutput:
    """What a captioner's teacher-forced ``forward`` returns (weights returned, not stashed).

    ``logits (B, T, V)``; ``attention (B, T, L)``; ``beta (B, T)`` (soft model's gate, else None);
    ``sample_log_prob (B, T)`` ``log alpha_t[s_t]`` and ``entropy (B, T)`` of ``alpha_t`` (hard model in
    training, else None); ``naming (B, T, V)``: in training, a second reading of each step's word through the
    glimpse from the third stage's features (models with ``naming``, else None).
    """

    logits: Tensor
    attention: Tensor
    beta: Tensor | None = None
    sample_log_prob: Tensor | None = None
    entropy: Tensor | None = None
    naming: Tensor | None = None


def rows_of(state: dict, owner: Tensor | None) -> dict:
    """A decoding state of ``B`` images with its per-image tensors taken at ``owner (R,)``, the image of each
    caption (unchanged for None): several captions of an image, the image encoded once."""
    if owner is None:
        return state
    return {k: v[owner] if isinstance(v, Tensor) else v for k, v in state.items()}


def doubly_stochastic_penalty(attn: Tensor, mask: Tensor) -> Tensor:
    """Xu et al.'s ``sum_b sum_i (1 - sum_t alpha_bti)^2`` over the real steps: ``attn (B, T, L)``, ``mask (B, T)``
    bool (True at real target positions, padding excluded). Returns a scalar (summed over the batch)."""
    per_location = (attn * mask[..., None].to(attn.dtype)).sum(dim=1)  # (B, L)
    return ((1.0 - per_location) ** 2).sum()


def reinforce_loss(log_likelihood: Tensor, sample_log_prob: Tensor, entropy: Tensor, mask: Tensor,
                   baseline: float | Tensor, *, reward_weight: float = 1.0, entropy_weight: float = 0.0) -> Tensor:
    """The hard-attention terms of Xu et al.'s learning rule (their eq. 12), as a loss to minimise (summed).

    ``-reward_weight * sum_b (R_b - baseline) sum_t log p(s_bt) - entropy_weight * sum_b sum_t H_bt`` with
    ``R_b = log_likelihood (B,)`` (detached here), ``sample_log_prob, entropy (B, T)`` and ``mask (B, T)`` bool.
    Its gradient is the score-function estimate of ``d E[R] / d alpha`` plus the entropy bonus; the caption's
    own cross-entropy (the first term of eq. 12) is the caller's.
    """
    m = mask.to(sample_log_prob.dtype)
    advantage = (log_likelihood.detach() - baseline).to(sample_log_prob.dtype)
    return -reward_weight * (advantage * (sample_log_prob * m).sum(1)).sum() - entropy_weight * (entropy * m).sum()


class CaptionLosses:
    """The loss terms a captioner adds to its captions' cross-entropy (none by default): the soft model's doubly
    stochastic penalty, the hard model's REINFORCE terms. The task computes the cross-entropy and calls
    :meth:`auxiliary_loss`; what the terms need (a baseline, a penalty's weight) stays with the model."""

    def auxiliary_loss(self, out: CaptionOutput, log_likelihood: Tensor, mask: Tensor, *,
                       doubly_stochastic: float = 0.0, reward_weight: float = 1.0, entropy_weight: float = 0.0,
                       baseline_decay: float = 0.9) -> tuple[Tensor | None, dict[str, Tensor]]:
        """``(loss or None, stats)`` beside the cross-entropy of a teacher-forced batch: ``out`` from ``forward``,
        ``log_likelihood (B,)`` of each caption (detached), ``mask (B, T)`` bool; the weights are the options'."""
        return None, {}
