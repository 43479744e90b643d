"""What a task (translation, image classification, sentiment...) gives the trainer.

A task is a subclass of :class:`Task`. The trainer owns the loop, the optimizer, the schedule, devices,
mixed precision, DDP, checkpoints and logs; the task owns the model, the data, the loss and the metrics.

Lifecycle, in every process: ``load_assets(dir)`` (only when resuming), ``setup()``, ``build_model()``,
``train_examples()``, ``callbacks(config)``, then ``collate``/``loss`` for every batch and ``evaluate`` on rank 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Task", "to_device"]


class Task:
    """Base class of the trainer's tasks. Override the four abstract methods; the rest have defaults.

    Example, a regression on fixed tensors::

        class Regression(Task):
            name = "regression"
            unit = "items"

            def __init__(self, x, y):
                self.x, self.y = x, y

            def build_model(self):
                return nn.Linear(self.x.shape[1], 1)

            def train_examples(self):
                return list(zip(self.x, self.y))

            def collate(self, examples):
                xs, ys = zip(*examples)
                return torch.stack(xs), torch.stack(ys)

            def loss(self, model, batch):
                x, y = batch
                err = (model(x).squeeze(-1) - y) ** 2
                return err.sum(), len(y), {}

    Attributes:
        name: stored in the checkpoint's ``config.json``, so that a command knows which task to rebuild.
        unit: what ``loss`` counts, shown in the progress bar as ``unit/s`` ("items", "tokens", "images").
    """

    name: str = "task"
    unit: str = "items"

    # --- required --------------------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """A new model on the CPU. The trainer seeds the RNGs before calling it, moves and wraps it."""
        raise NotImplementedError

    def train_examples(self) -> Sequence:
        """The training examples, indexable (``len`` and ``[i]``). The trainer chooses the order."""
        raise NotImplementedError

    def collate(self, examples: list) -> Any:
        """A batch (tensors, or a dict/tuple/dataclass of tensors, on the CPU) from a list of examples.

        Runs in the training process; random augmentation here may use the global torch/random/numpy RNGs,
        whose states the checkpoints keep.
        """
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, Tensor | int | float, dict[str, Tensor | float]]:
        """``(summed_loss, count, stats)`` for one batch (on the training device).

        ``summed_loss`` is the **sum** over the batch's items or tokens (``reduction="sum"``), and ``count``
        how many there are; the trainer divides by the count summed over all processes, so that gradients
        equal a single-process run on the same global batch. ``stats`` are sums too (e.g.
        ``{"correct": n}``), logged divided by the count (training accuracy). Call ``model(...)`` for the
        forward pass: under DDP ``model`` is the DDP wrapper, whose forward synchronises gradients.
        """
        raise NotImplementedError

    # --- optional --------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Prepare data and tokenisers (called once, after ``load_assets`` when resuming)."""

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Metrics of ``split`` (e.g. ``"valid"``, ``"test"``). Called in eval mode, under ``no_grad``, with the
        plain (unwrapped) model on the training device, on rank 0 only; RNG use here does not affect training.
        Raise ``ValueError`` for a split the task does not have."""
        return {}

    def config(self) -> dict[str, Any]:
        """JSON-serialisable settings that rebuild the model for inference (architecture, sizes...)."""
        return {}

    def save_assets(self, directory: Path) -> None:
        """Write tokeniser/vocabulary files into ``directory`` (exists, empty); stored with every checkpoint."""

    def load_assets(self, directory: Path) -> None:
        """Read what :meth:`save_assets` wrote; called before :meth:`setup` when resuming, so that a resumed run
        uses the saved tokeniser rather than fitting a new one."""

    def param_groups(self, model: nn.Module, config: Any) -> list[dict[str, Any]]:
        """The optimizer's parameter groups for ``model`` and the run's ``config`` (a :class:`qkv.train.TrainConfig`):
        by default weight decay on matrices only (:func:`qkv.train.precision.param_groups`); a group may carry an
        ``lr_scale`` and an ``unfreeze_step`` (:func:`qkv.train.precision.layered_groups`: discriminative rates,
        gradual unfreezing)."""
        from .precision import param_groups

        return param_groups(model, config.weight_decay)

    def callbacks(self, config: Any) -> Sequence[Any]:
        """The task's own trainer callbacks for a run with ``config`` (a :class:`qkv.train.TrainConfig`), called
        after every optimizer step as ``callback(state, logs)`` beside those given to :func:`qkv.train.train`
        (e.g. switching a loss term on part-way through the training); none by default."""
        return ()

    def lengths(self) -> Sequence[int] | None:
        """Length of every training example (e.g. target tokens), to batch similar lengths together and pad
        less; ``None`` (the default) keeps batches uniformly random."""
        return None

    def to_device(self, batch: Any, device: torch.device) -> Any:
        """Move a collated batch to the device (default: every tensor inside dicts, lists, tuples, dataclasses)."""
        return to_device(batch, device)


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside it (through mappings, lists, tuples, dataclasses) moved to ``device``."""
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, Mapping):
        return type(obj)({k: to_device(v, device) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj
