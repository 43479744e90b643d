"""The trainer's small parts: its state and result, the Ctrl-C flag, ``metrics.jsonl``, optimizer groups, AMP."""

from __future__ import annotations

import json
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TrainState", "TrainResult", "StopFlag", "MetricsLog", "param_groups", "dtype_name", "amp_dtype"]

log = logging.getLogger("qkv.train.trainer")


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


class StopFlag:
    """Turns the first SIGINT into a flag checked between steps; a second SIGINT interrupts at once."""

    def __init__(self):
        self.set = False
        self._previous = None

    def _handler(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        log.warning("interrupt: stopping after this step (press Ctrl-C again to stop at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: Path | None):
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")


def param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weights with two or more dimensions; none on biases, norms and other vectors."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.ndim >= 2]
    keep = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0})
            if g["params"]]


def dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "off"


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(f"amp='fp16' needs a CUDA device (training on {device}); use amp='bf16' or 'off'")
    return torch.bfloat16 if amp == "bf16" else torch.float16
