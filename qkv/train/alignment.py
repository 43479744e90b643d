"""Whether an attention decoder has learned to align: measures of its weights, and a check at a third of the run.

A decoder whose attention has not found the alignment by a third of its budget rarely finds it later (speech: a
seed whose listener-speller attention stays spread over the whole utterance stays unusable), and its loss alone
does not say so: the speller learns a language model that lowers it. Two measures of the teacher-forced weights
``(B, T, S)`` say it:

- *focus*: the mean over output steps of the largest weight (1 / S for uniform weights, near 1 for a sharp
  alignment);
- *progress*: per sequence, the correlation between the output step and the median key position the step attends
  to (0 when the median never moves, as with uniform weights; near 1 when the attention walks along the input, as
  a monotonic alignment does).

:func:`alignment_stats` returns them as sums over output steps, the form of a task's loss statistics (the trainer
divides by the count when it logs them: ``attn_focus``, ``attn_progress`` in ``metrics.jsonl``).
:class:`AlignmentCheck` is a trainer callback that averages them over the last steps and, once a third of the
budget (time, steps or epochs) has passed, logs one warning when the attention has not aligned, saying what to do.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch
from torch import Tensor

__all__ = ["alignment_stats", "AlignmentCheck", "guided_attention_loss", "FOCUS", "PROGRESS"]

log = logging.getLogger("qkv.train.trainer")

#: below either threshold (averaged over the last steps) the attention has not aligned: uniform weights give a focus
#: of 1 / S (below 0.1 from 10 keys on) and a progress of 0; a tiny LAS on spoken words measured focus 0.16 and
#: progress 0.52 as it began to align, 0.25-0.37 and 0.55-0.72 aligned
FOCUS, PROGRESS = 0.1, 0.5


def alignment_stats(weights: Tensor, query_mask: Tensor) -> dict[str, Tensor]:
    """Sums over the valid output steps of the focus and of the progress (module docstring).

    Args:
        weights: ``(B, T, S)`` attention weights, rows summing to 1 over the allowed keys (``(B, H, T, S)``: the
            heads' mean).
        query_mask: ``(B, T)`` bool, True at the output steps that count.
    Returns:
        ``{"attn_focus": sum of the peak weights, "attn_progress": sum over steps of the sequence's correlation}``,
        float64 scalars (detached).
    """
    if weights.ndim == 4:
        weights = weights.mean(1)
    if weights.ndim != 3 or query_mask.shape != weights.shape[:2]:
        raise ValueError(f"weights (B, T, S) and query_mask (B, T) must agree, got {tuple(weights.shape)} and "
                         f"{tuple(query_mask.shape)}")
    w = weights.detach().to(torch.float64)
    m = query_mask.to(torch.float64)
    focus = (w.amax(-1) * m).sum()
    median = (w.cumsum(-1) < 0.5).sum(-1).to(torch.float64)  # (B, T): the first position reaching half the weight
    t = torch.arange(w.shape[1], dtype=torch.float64, device=w.device).expand_as(median)
    n = m.sum(-1).clamp(min=1)
    dt = (t - (t * m).sum(-1, keepdim=True) / n[:, None]) * m
    dm = (median - (median * m).sum(-1, keepdim=True) / n[:, None]) * m
    denom = (dt.square().sum(-1) * dm.square().sum(-1)).sqrt()
    corr = torch.where(denom > 0, (dt * dm).sum(-1) / denom.clamp(min=1e-12), torch.zeros_like(denom))
    return {"attn_focus": focus, "attn_progress": (corr * m.sum(-1)).sum()}


def guided_attention_loss(weights: Tensor, query_mask: Tensor, key_lengths: Tensor, width: float = 0.2) -> Tensor:
    """The guided-attention loss (Tachibana et al., 2017, "Efficiently Trainable Text-to-Speech System Based on Deep
    Convolutional Networks with Guided Attention", https://arxiv.org/abs/1710.08969): the weight an output step puts
    far from the diagonal, ``sum A[t, s] (1 - exp(-(s / S - t / T)^2 / (2 width^2)))`` summed over the valid steps
    (the form of a summed cross-entropy; ``T`` and ``S`` are each sequence's own lengths). A prior for monotonic
    alignments (speech, text to speech) early in training; 0 for weights on the diagonal.

    Args:
        weights: ``(B, T, S)`` (``(B, H, T, S)``: every head is guided, the mean taken).
        query_mask: ``(B, T)`` bool, True at the output steps that count.
        key_lengths: ``(B,)`` keys of each sequence.
    """
    if weights.ndim == 4:
        return guided_attention_loss(weights.flatten(0, 1), query_mask.repeat_interleave(weights.shape[1], 0),
                                     key_lengths.repeat_interleave(weights.shape[1]), width) / weights.shape[1]
    b, t, s = weights.shape
    steps = query_mask.sum(-1).clamp(min=1).to(weights.dtype)
    tt = torch.arange(t, device=weights.device, dtype=weights.dtype)[None, :, None] / steps[:, None, None]
    ss = torch.arange(s, device=weights.device, dtype=weights.dtype)[None, None, :] / \
        key_lengths.clamp(min=1).to(weights.dtype)[:, None, None]
    penalty = 1 - torch.exp(-(ss - tt).square() / (2 * width ** 2))
    return (weights * penalty * query_mask[..., None]).sum()


class AlignmentCheck:
    """A trainer callback: at a third of the budget, one warning when the attention has not aligned.

    The step's statistics (``logs["stats"]``, with :func:`alignment_stats`'s sums and ``logs["count"]`` output steps)
    are averaged over the last ``window`` steps.

    Args:
        config: the run's :class:`~qkv.train.TrainConfig`: its ``max_minutes``, else ``max_steps``, else ``epochs``
            is the budget (the first one set).
        steps_per_epoch: optimizer steps in an epoch (for a budget of epochs).
        advice: what to do, appended to the warning.
        monotonic: whether the alignment walks along the input (speech: yes), so that progress counts too.
    """

    def __init__(self, config: Any, steps_per_epoch: int, *, advice: str = "", monotonic: bool = True,
                 window: int = 50, focus: float = FOCUS, progress: float = PROGRESS):
        self.config, self.steps_per_epoch, self.advice, self.monotonic = config, max(1, steps_per_epoch), advice, \
            monotonic
        self.focus, self.progress = focus, progress
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=window)
        self.done = False
        self.aligned: bool | None = None  # the verdict, once given

    def _third_passed(self, state) -> bool:
        c = self.config
        if c.max_minutes is not None:
            return state.elapsed >= 60.0 * c.max_minutes / 3
        if c.max_steps is not None:
            return state.global_step >= c.max_steps / 3
        return state.global_step >= c.epochs * self.steps_per_epoch / 3

    def __call__(self, state, logs: dict[str, Any]) -> None:
        stats = logs.get("stats") or {}
        if self.done or "attn_focus" not in stats:
            return
        self._recent.append((float(stats["attn_focus"]), float(stats.get("attn_progress", 0.0)),
                             float(logs["count"])))
        if not self._third_passed(state):
            return
        self.done = True
        count = sum(c for _, _, c in self._recent) or 1.0
        focus = sum(f for f, _, _ in self._recent) / count
        progress = sum(p for _, p, _ in self._recent) / count
        self.aligned = focus >= self.focus and (progress >= self.progress or not self.monotonic)
        if self.aligned:
            log.info("attention aligned at step %d: focus %.2f, progress %.2f", state.global_step, focus, progress)
            return
        measures = f"focus {focus:.2f} (aligned: >= {self.focus:g})" + (
            f", progress {progress:.2f} (>= {self.progress:g})" if self.monotonic else "")
        log.warning("the attention has not aligned after a third of the budget (step %d: %s): this run is unlikely "
                    "to become usable%s", state.global_step, measures, f" — {self.advice}" if self.advice else "")
