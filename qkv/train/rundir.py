"""The trainer and its run directory: holding it for the run's life (:func:`hold_run_directory`), finding the
checkpoint to resume (:func:`find_checkpoint`), writing the training state (:func:`save`) and restoring it
(:func:`restore`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from ..options import OptionError, option_error, ref
from . import rng
from .budget import Horizon
from .checkpoint import (
    VERSION,
    Checkpoint,
    load_checkpoint,
    optimizer_from_files,
    optimizer_to_files,
    resolve_checkpoint,
    write_checkpoint,
)
from .config import RESULT_FIELDS
from .fit import model_change, weight_differences
from .lock import RunInUseError, RunLock
from .schedule import derive_seed
from .state import TrainState

__all__ = ["hold_run_directory", "find_checkpoint", "load_resumed_weights", "save", "restore"]

log = logging.getLogger("qkv.train.trainer")


@contextlib.contextmanager
def hold_run_directory(out: Path | None, dist) -> Iterator[None]:
    """Hold ``out``'s :class:`~qkv.train.lock.RunLock` (rank 0 takes it; every rank learns whether it could)
    for the block: taken before anything looks at or writes into ``out``, released on any exit."""
    if out is None:
        yield
        return
    lock, error = RunLock(out, flag="out"), None
    if dist.is_main:
        try:
            lock.acquire()
        except OSError as e:
            error = e
    if dist.enabled:  # the other ranks must not go on alone
        failed = dist.broadcast(torch.tensor([float(error is not None)], device=dist.device))
        if failed.item() and error is None:
            error = RunInUseError("{path} (" + ref("out") + "): rank 0 could not lock the run directory", "out",
                                  path=out)
    if error is not None:
        raise error
    try:
        yield
    finally:
        lock.release()


def find_checkpoint(out: Path | None, resume: bool) -> Checkpoint | None:
    """The checkpoint to resume from (``None`` for a fresh run). Raises ``FileExistsError`` when ``out`` holds a
    checkpoint and ``resume`` is false, ``FileNotFoundError`` when ``resume`` finds nothing, ``ValueError`` when
    the checkpoint cannot be resumed."""
    if out is None:
        return None
    try:
        path = resolve_checkpoint(out / "checkpoint", prefer=())
    except FileNotFoundError:
        if resume:
            raise option_error(FileNotFoundError, "nothing to resume: {out} holds no checkpoint (checkpoint/); drop " +
                               ref("resume") + " to start a new run there", "resume", out=out) from None
        return None
    if not resume:
        raise option_error(FileExistsError, "{out} already holds a checkpoint ({path}); pass " + ref("resume") +
                           " to continue it, or choose another output directory", "resume", out=out, path=path)
    ckpt = load_checkpoint(path, prefer=())
    if ckpt.state is None:
        raise ValueError(f"{path} has no training state (state.json); it cannot be resumed")
    if ckpt.version != VERSION:
        raise ValueError(f"{path} was written in checkpoint format version {ckpt.version} (this qkv writes "
                         f"{VERSION}); it cannot be resumed: load it for prediction, or start a new run")
    log.info("resuming from %s", path)
    return ckpt


def load_resumed_weights(ckpt: Checkpoint, config: dict, module: torch.nn.Module) -> None:
    """Load ``ckpt``'s weights into ``module``, the model that the task (``config``: its ``config()``) builds now.
    Every option that shapes the model must be as the run was started: a model spec that differs from the stored
    one, or weights that do not fit, is a ``ValueError`` naming the options and their stored and given values
    (the settings of training, such as the learning rate, may change: :func:`restore` warns)."""
    templates, options, values = model_change(ckpt.config, config)
    if not templates:
        values = {f"_{i}": d for i, d in enumerate(weight_differences(ckpt.state_dict, module))}
        templates = ["{" + k + "}" for k in values]
    if templates:
        raise OptionError("cannot resume {path}: the model differs from the checkpoint's (" + "; ".join(templates) +
                          "); resume with the options the run was started with, or start a new run in another "
                          "output directory", *dict.fromkeys(options), path=ckpt.path, **values)
    module.load_state_dict(ckpt.state_dict)


def save(trainer, collective: bool = True) -> None:
    """Write ``trainer.out/checkpoint`` (rank 0): weights, assets, position, optimizer, scaler, the schedule's
    horizon and the time budget's estimates, and the RNG states of every rank when ``collective``."""
    d, st = trainer.dist, trainer.state
    states = rng.capture()
    rng_tensors = {}
    if d.enabled and collective:
        for name in sorted(states):
            for r, t in enumerate(d.all_gather(states[name])):
                rng_tensors[f"rng.{r}.{name}"] = t
    else:
        rng_tensors = {f"rng.{d.rank}.{k}": v for k, v in states.items()}
    if d.is_main:
        opt_tensors, opt_meta = optimizer_to_files(trainer.optimizer.state_dict())
        scaler = trainer.scaler.state_dict() if trainer.scaler.is_enabled() else None
        budget = trainer.budget.state_dict() if trainer.budget is not None else None
        state = {"position": dataclasses.asdict(st), "train_config": trainer.config.to_dict(),
                 "optimizer": opt_meta, "scaler": scaler, "world_size": d.world_size,
                 "num_examples": len(trainer.examples), "steps_per_epoch": trainer.steps_per_epoch,
                 "total_steps": trainer.horizon.total, "horizon": dataclasses.asdict(trainer.horizon),
                 "budget": budget, "torch": torch.__version__, "saved_at": time.time()}
        write_checkpoint(trainer.out / "checkpoint", weights=trainer.module.state_dict(), task=trainer.task.name,
                         config=trainer.task.config(), save_assets=trainer.task.save_assets, state=state,
                         state_tensors={**opt_tensors, **rng_tensors}, flag="out")


def restore(trainer, ckpt: Checkpoint, n: int) -> None:
    """Set ``trainer``'s state, optimizer, scaler and RNGs from ``ckpt`` (``n``: the number of training examples,
    which must not have changed)."""
    cfg, d, saved = trainer.config, trainer.dist, ckpt.state
    if saved["num_examples"] != n or saved["steps_per_epoch"] != trainer.steps_per_epoch:
        raise ValueError(f"the training data changed since {ckpt.path} was written: {n} examples in "
                         f"{trainer.steps_per_epoch} batches now, {saved['num_examples']} in "
                         f"{saved['steps_per_epoch']} then; resume needs the same data and batch_size")
    old = saved["train_config"]
    changed = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in cfg.to_dict().items()
               if k in RESULT_FIELDS and old.get(k) != v]
    if changed:
        log.warning("resuming with different settings; the run will not match an uninterrupted one (%s)",
                    "; ".join(changed))
    trainer.state = TrainState(**saved["position"])
    # the schedule goes on from the progress it reached (a checkpoint without it: the length it had, fixed)
    if saved.get("horizon") is not None:
        trainer.horizon = Horizon(**saved["horizon"])
    if trainer.budget is not None:
        trainer.budget.horizon = trainer.horizon
    if trainer.budget is not None and saved.get("budget") is not None:
        trainer.budget.load_state_dict(saved["budget"])  # the next fit moves the horizon if the settings changed
    else:
        trainer.horizon.move(trainer.state.global_step, trainer.total_steps)
    tensors = ckpt.state_tensors()
    trainer.optimizer.load_state_dict(optimizer_from_files(tensors, saved["optimizer"]))
    if saved.get("scaler") and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(saved["scaler"])
    prefix = f"rng.{d.rank}."
    mine = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    if mine:
        rng.restore(mine)
    else:
        log.warning("no saved RNG state for rank %d (the checkpoint came from %d process(es)); reseeding",
                    d.rank, saved["world_size"])
        rng.seed_all(derive_seed(cfg.seed, 2, d.rank, trainer.state.global_step))
