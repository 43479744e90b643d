"""One trainer for every task: :func:`train` a :class:`Task` with a :class:`TrainConfig`.

The task gives the model, the examples, ``collate``, ``loss`` (summed, with its count) and ``evaluate``; the
trainer does the rest: AdamW with warm-up and decay, clipping, mixed precision, progress bars,
``metrics.jsonl``, atomic pickle-free checkpoints, exact resume, a time budget, early stopping,
DistributedDataParallel under ``torchrun``, a lock on the run directory and SIGTERM handled like Ctrl-C.
:func:`load_model` and :func:`load_checkpoint` read a run back for inference.

Example:
    >>> from qkv.train import TrainConfig, train
    >>> result = train(MyTask(), TrainConfig(epochs=3, out="runs/demo"))   # doctest: +SKIP
    >>> result.metrics["test"]                                             # doctest: +SKIP
"""

from .checkpoint import Checkpoint, load_checkpoint, load_model, resolve_checkpoint
from .config import TrainConfig
from .distributed import resolve_device
from .interrupt import Interrupted
from .lock import RunInUseError, RunLock
from .schedule import epoch_batches, lr_factor
from .task import Task, to_device
from .trainer import Trainer, TrainResult, TrainState, train

__all__ = [
    "Task",
    "TrainConfig",
    "train",
    "Trainer",
    "TrainResult",
    "TrainState",
    "Checkpoint",
    "load_checkpoint",
    "load_model",
    "resolve_checkpoint",
    "resolve_device",
    "epoch_batches",
    "lr_factor",
    "to_device",
    "Interrupted",
    "RunInUseError",
    "RunLock",
]
