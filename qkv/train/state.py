"""The trainer's position (:class:`TrainState`, saved in every checkpoint) and what :func:`qkv.train.train` returns
(:class:`TrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

__all__ = ["TrainState", "TrainResult"]


@dataclass
class TrainState:
    """The trainer's position, saved in every checkpoint (``state.json``)."""

    epoch: int = 0  # current epoch, 0-based
    step: int = 0  # batches done in the current epoch
    global_step: int = 0  # optimizer steps done in total
    best: float | None = None  # best value of the monitored metric so far
    best_step: int | None = None  # global_step at which it was reached
    bad_evals: int = 0  # evaluations since the best one
    stopped_early: bool = False  # early stopping ended the run
    elapsed: float = 0.0  # seconds of training over all invocations


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (plain ``nn.Module``); holds the best weights when a metric was monitored.
        state: the final :class:`TrainState`.
        metrics: the final evaluation, ``{split: {metric: value}}`` (rank 0 only; empty on other ranks).
        stopped: why training ended: ``"epochs"``, ``"early_stop"``, ``"max_steps"`` or ``"time"``.
        out: the run directory, or ``None``.
    """

    model: nn.Module
    state: TrainState
    metrics: dict[str, dict[str, float]]
    stopped: str
    out: Path | None
