"""The trainer's configuration: one small dataclass with commented defaults, and its command-line options.

Every task's ``qkv train ...`` command builds a :class:`TrainConfig` with :func:`add_arguments` and
:func:`config_from_args`, so ``--epochs``, ``--max-minutes``, ``--out``, ``--resume``, ``--device`` and the
rest mean the same thing for every task. A task changes the defaults, not the meaning.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrainConfig", "add_arguments", "config_from_args", "SCHEDULES", "AMP_MODES"]

SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt")
AMP_MODES = ("auto", "off", "bf16", "fp16")

# Fields that change what an exact resume computes; a resumed run warns when one of them differs.
RESULT_FIELDS = ("seed", "batch_size", "lr", "weight_decay", "betas", "eps", "schedule", "warmup_steps",
                 "min_lr_ratio", "clip_norm", "drop_last", "bucket_batches", "epochs", "amp")


@dataclass
class TrainConfig:
    """How to train; what to train is the :class:`qkv.train.Task`'s business (model, data, loss, metrics).

    Every value is checked on construction: a bad one raises ``ValueError`` naming the field.
    """

    # --- length and stopping -------------------------------------------------------------------------
    epochs: int = 10  # passes over the training examples; also sets the length of the LR schedule
    max_minutes: float | None = None  # wall-clock budget for this invocation: stop cleanly, checkpoint, evaluate
    max_steps: int | None = None  # stop after this many optimizer steps in total (the schedule is unchanged)
    schedule_steps: int | None = None  # length of the LR schedule in optimizer steps; None = epochs x batches/epoch
    monitor: str | None = None  # metric of `eval_split` to track the best model by, e.g. "accuracy"
    mode: str = "max"  # "max" if a larger `monitor` is better, "min" if smaller is
    patience: int = 0  # early stopping: evaluations without improvement before stopping; 0 = never stop early
    min_delta: float = 0.0  # an improvement must beat the best by more than this
    # --- batches -------------------------------------------------------------------------------------
    batch_size: int = 64  # examples per optimizer step, over all processes together (the global batch)
    drop_last: bool = False  # drop the last, smaller batch of every epoch
    bucket_batches: int = 50  # if the task gives lengths: sort by length within pools of this many batches
    # --- optimizer (AdamW) and schedule --------------------------------------------------------------
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.01  # AdamW decoupled weight decay, on weights with 2+ dims (not biases or norms)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW moment decay rates
    eps: float = 1e-8  # AdamW epsilon
    schedule: str = "cosine"  # after warm-up: "constant", "linear" or "cosine" decay, or "inverse_sqrt"
    warmup_steps: int = 0  # linear warm-up from lr/warmup_steps to lr
    min_lr_ratio: float = 0.0  # linear/cosine decay ends at lr * min_lr_ratio
    clip_norm: float | None = 1.0  # clip the global gradient norm to this; None = no clipping
    # --- hardware ------------------------------------------------------------------------------------
    device: str = "auto"  # "auto" (CUDA if available), "cpu", "cuda" or "cuda:N"
    amp: str = "auto"  # mixed precision: "auto" (bf16 on CUDA if supported, else fp16; off on CPU), "off", ...
    ddp_find_unused: bool = False  # DistributedDataParallel(find_unused_parameters=...), for models that skip parts
    # --- reproducibility, output ---------------------------------------------------------------------
    seed: int = 0  # model initialisation, data order (a pure function of seed and epoch), dropout
    out: str | None = None  # run directory: checkpoint/, best/, metrics.jsonl; None = write nothing
    resume: bool = False  # continue from out/checkpoint if there is one (else start fresh)
    eval_split: str | None = "valid"  # evaluated after every epoch (and every `eval_every` steps); None = never
    eval_every: int = 0  # also evaluate every this many optimizer steps; 0 = only at epoch ends
    final_splits: tuple[str, ...] = ("valid", "test")  # evaluated once at the end (with the best weights)
    log_every: int = 50  # optimizer steps between lines in metrics.jsonl
    progress: bool | None = None  # progress bars; None = only when stderr is a terminal (and on rank 0)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, stored with the run (e.g. the CLI command)

    def __post_init__(self):
        self.betas = tuple(self.betas)
        self.final_splits = tuple(self.final_splits)
        if self.out is not None:
            self.out = str(self.out)
        _int(self, "epochs", 1)
        _int(self, "batch_size", 1)
        _int(self, "bucket_batches", 1)
        _int(self, "warmup_steps", 0)
        _int(self, "patience", 0)
        _int(self, "eval_every", 0)
        _int(self, "log_every", 1)
        _int(self, "seed", 0)
        if self.max_steps is not None:
            _int(self, "max_steps", 1)
        if self.schedule_steps is not None:
            _int(self, "schedule_steps", 1)
        if self.max_minutes is not None:
            _positive(self, "max_minutes")
        _positive(self, "lr")
        _positive(self, "eps")
        _nonneg(self, "weight_decay")
        _nonneg(self, "min_delta")
        if self.clip_norm is not None:
            _positive(self, "clip_norm")
        if not (isinstance(self.min_lr_ratio, int | float) and 0.0 <= self.min_lr_ratio <= 1.0):
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if len(self.betas) != 2 or not all(isinstance(b, int | float) and 0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        _choice(self, "schedule", SCHEDULES)
        _choice(self, "amp", AMP_MODES)
        _choice(self, "mode", ("max", "min"))
        if not (isinstance(self.device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.patience and not self.monitor:
            raise ValueError(f"patience={self.patience} needs a metric to watch: set monitor (e.g. 'accuracy')")
        if self.monitor and not self.eval_split:
            raise ValueError(f"monitor={self.monitor!r} needs eval_split (the split it is measured on)")
        if self.resume and self.out is None:
            raise ValueError("resume=True needs out (the run directory to resume from)")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {type(self.extra).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {', '.join(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def _int(cfg, name, low):
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")


def _number(cfg, name):
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return v


def _positive(cfg, name):
    if _number(cfg, name) <= 0:
        raise ValueError(f"{name} must be > 0, got {getattr(cfg, name)!r}")


def _nonneg(cfg, name):
    if _number(cfg, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)!r}")


def _choice(cfg, name, choices):
    v = getattr(cfg, name)
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {v!r}")


def add_arguments(parser: argparse.ArgumentParser, defaults: TrainConfig | None = None) -> None:
    """Add the trainer's options (shared by every ``qkv train`` subcommand) to ``parser``.

    ``defaults`` is the task's preferred :class:`TrainConfig` (its epochs, batch size, lr...); the options
    keep their meaning. Read them back with :func:`config_from_args`.
    """
    d = defaults or TrainConfig()
    g = parser.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training data (default %(default)s)")
    g.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="time budget: stop cleanly with a checkpoint and a final evaluation")
    g.add_argument("--max-steps", type=int, default=d.max_steps, help="stop after this many optimizer steps")
    g.add_argument("--out", default=d.out, help="run directory (checkpoint/, best/, metrics.jsonl)")
    g.add_argument("--resume", action="store_true", default=d.resume,
                   help="continue exactly from OUT/checkpoint (same data order, optimizer and RNG state)")
    g.add_argument("--device", default=d.device, help="auto, cpu, cuda or cuda:N (default %(default)s)")
    g.add_argument("--amp", default=d.amp, choices=AMP_MODES, help="mixed precision (default %(default)s)")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for initialisation, data order and dropout")
    g.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="examples per step over all processes (default %(default)s)")
    g.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default %(default)s)")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    g.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear LR warm-up steps")
    g.add_argument("--schedule", default=d.schedule, choices=SCHEDULES, help="LR decay after warm-up")
    g.add_argument("--clip-norm", type=float, default=d.clip_norm, help="gradient norm clipping (0 = off)")
    g.add_argument("--patience", type=int, default=d.patience,
                   help="early stopping: evaluations without improvement (0 = off)")
    g.add_argument("--log-every", type=int, default=d.log_every, help="steps between metrics.jsonl lines")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=d.progress,
                   help="no progress bars")


def config_from_args(args: argparse.Namespace, defaults: TrainConfig | None = None, **overrides) -> TrainConfig:
    """The :class:`TrainConfig` for options added by :func:`add_arguments`; ``overrides`` win over both."""
    d = defaults or TrainConfig()
    values = {name: getattr(args, name) for name in (
        "epochs", "max_minutes", "max_steps", "out", "resume", "device", "amp", "seed", "batch_size", "lr",
        "weight_decay", "warmup_steps", "schedule", "clip_norm", "patience", "log_every", "progress")}
    if values["clip_norm"] == 0:
        values["clip_norm"] = None
    return dataclasses.replace(d, **{**values, **overrides})
