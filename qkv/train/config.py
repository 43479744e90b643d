"""The trainer's configuration: one small dataclass whose fields carry their defaults, help and ranges.

Every task's ``qkv train ...`` command generates its training flags from these fields (:mod:`qkv.cli.options`),
so ``--epochs``, ``--max-minutes``, ``--out``, ``--resume``, ``--device`` and the rest mean the same thing for
every task. A task changes the defaults (its ``TRAIN_DEFAULTS`` preset), not the meaning.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..options import OptionError, check_options, option, ref
from .rng import MAX_SEED

__all__ = ["TrainConfig", "SCHEDULES", "AMP_MODES"]

SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt")
AMP_MODES = ("auto", "off", "bf16", "fp16")

# Fields that change what an exact resume computes; a resumed run warns when one of them differs.
RESULT_FIELDS = ("seed", "batch_size", "lr", "weight_decay", "betas", "eps", "schedule", "warmup_steps",
                 "min_lr_ratio", "clip_norm", "drop_last", "bucket_batches", "epochs", "amp", "max_minutes",
                 "schedule_steps")


@dataclass
class TrainConfig:
    """How to train; what to train is the :class:`qkv.train.Task`'s business (model, data, loss, metrics).

    Every value is checked on construction: a bad one raises ``ValueError`` naming the field.
    """

    # --- length and stopping -------------------------------------------------------------------------
    epochs: int = option(10, low=1, help="passes over the training data; also the length of the LR schedule "
                         "(unless --max-minutes ends the run first)")
    max_minutes: float | None = option(None, low=0, low_open=True,
                                       help="time budget of the run (over every --resume): the LR schedule ends "
                                       "where the measured step time says the budget ends, leaving time to "
                                       "evaluate, save and pick the best model; whichever ends first, epochs or "
                                       "time, sets the schedule's length")
    max_steps: int | None = option(None, low=1, help="stop after this many optimizer steps in total")
    schedule_steps: int | None = option(None, low=1, help="length of the LR schedule in optimizer steps "
                                        "(default: epochs x batches per epoch)")
    monitor: str | None = option(None, cli=False, help="metric of eval_split that picks the best model")
    mode: str = option("max", choices=("max", "min"), cli=False, help="whether a larger monitor is better")
    patience: int = option(0, low=0, help="early stopping: evaluations without improvement (0 = never)")
    min_delta: float = option(0.0, low=0, cli=False, help="an improvement must beat the best by more than this")
    # --- batches -------------------------------------------------------------------------------------
    batch_size: int = option(64, low=1, help="examples per optimizer step over all processes (the global batch)")
    drop_last: bool = option(False, cli=False, help="drop the last, smaller batch of every epoch")
    bucket_batches: int = option(50, low=1, cli=False,
                                 help="with the task's lengths: sort by length within pools of this many batches")
    # --- optimizer (AdamW) and schedule --------------------------------------------------------------
    lr: float = option(1e-3, low=0, low_open=True, high=10.0, help="peak learning rate")
    weight_decay: float = option(0.01, low=0, help="AdamW decoupled weight decay (not on biases and norms)")
    betas: tuple[float, ...] = option((0.9, 0.999), low=0, high=0.999999, help="AdamW moment decay rates, B1,B2")
    eps: float = option(1e-8, low=0, low_open=True, cli=False, help="AdamW epsilon")
    schedule: str = option("cosine", choices=SCHEDULES, help="LR decay after warm-up")
    warmup_steps: int = option(0, low=0, help="linear LR warm-up steps")
    min_lr_ratio: float = option(0.0, low=0, high=1, help="linear/cosine decay ends at lr x this")
    clip_norm: float | None = option(1.0, low=0, help="clip the global gradient norm to this (0 = off)")
    # --- hardware ------------------------------------------------------------------------------------
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    amp: str = option("auto", choices=AMP_MODES, help="mixed precision: auto is bf16/fp16 on CUDA, off on the CPU")
    ddp_find_unused: bool = option(False, cli=False, help="DistributedDataParallel(find_unused_parameters=...)")
    threads: int | None = option(None, low=1, cli=False,
                                 help="CPU threads for torch, fixed for the run; None follows the machine on the CPU: "
                                 "1 or all cores, whichever trains faster now, checked again every few minutes "
                                 "(unless OMP_NUM_THREADS fixes it; qkv's --threads sets this)")
    # --- reproducibility, output ---------------------------------------------------------------------
    seed: int = option(0, low=0, high=MAX_SEED, help="seed of initialisation, data order and dropout")
    out: str | None = option(None, help="run directory: checkpoint/, best/, metrics.jsonl (default: write nothing)")
    resume: bool = option(False, help="continue exactly from OUT/checkpoint (data order, optimizer, RNG state)")
    eval_split: str | None = option("valid", cli=False, help="split evaluated after every epoch; None = never")
    eval_every: int = option(0, low=0, help="also evaluate every this many optimizer steps (0 = at epoch ends)")
    final_splits: tuple[str, ...] = option(("valid", "test"), cli=False,
                                           help="splits evaluated once at the end, with the best weights")
    log_every: int = option(50, low=1, help="optimizer steps between lines of metrics.jsonl")
    progress: bool | None = option(None, help="progress bars (default: when stderr is a terminal)")
    extra: dict[str, Any] = option(default_factory=dict, cli=False, help="free-form, stored with the run")

    def __post_init__(self):
        self.betas = tuple(self.betas)
        self.final_splits = tuple(self.final_splits)
        if self.out is not None:
            self.out = str(self.out)
        if self.clip_norm == 0:
            self.clip_norm = None
        check_options(self)
        if len(self.betas) != 2:
            raise OptionError(ref("betas") + " must be two numbers in [0, 1), got {given!r}", "betas", given=self.betas)
        if not (isinstance(self.device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)):
            raise OptionError(ref("device") + " must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {given!r}", "device",
                              given=self.device)
        if self.patience and not self.monitor:
            raise OptionError(ref("patience") + "={n} needs a metric to watch: set " + ref("monitor") +
                              " (e.g. 'accuracy')", "patience", "monitor", n=self.patience)
        if self.monitor and not self.eval_split:
            raise OptionError(ref("monitor") + "={given!r} needs " + ref("eval_split") + " (the split it is measured "
                              "on)", "monitor", "eval_split", given=self.monitor)
        if self.resume and self.out is None:
            raise OptionError(ref("resume") + "=True needs " + ref("out") + " (the run directory to resume from)",
                              "resume", "out")
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
