"""The trainer and its run directory: holding it for the run's life (:func:`hold_run_directory`), finding the
checkpoint to resume (:func:`find_checkpoint`) and restoring the training state from it (:func:`restore`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from . import rng
from .checkpoint import VERSION, Checkpoint, load_checkpoint, optimizer_from_files, resolve_checkpoint
from .config import RESULT_FIELDS
from .lock import RunInUseError, RunLock
from .parts import TrainState
from .schedule import derive_seed

__all__ = ["hold_run_directory", "find_checkpoint", "restore"]

log = logging.getLogger("qkv.train.trainer")


@contextlib.contextmanager
def hold_run_directory(out: Path | None, dist) -> Iterator[None]:
    """Hold ``out``'s :class:`~qkv.train.lock.RunLock` (rank 0 takes it; every rank learns whether it could)
    for the block: taken before anything looks at or writes into ``out``, released on any exit."""
    if out is None:
        yield
        return
    lock, error = RunLock(out, flag="--out"), None
    if dist.is_main:
        try:
            lock.acquire()
        except OSError as e:
            error = e
    if dist.enabled:  # the other ranks must not go on alone
        failed = dist.broadcast(torch.tensor([float(error is not None)], device=dist.device))
        if failed.item() and error is None:
            error = RunInUseError(f"{out} (--out): rank 0 could not lock the run directory")
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
            raise FileNotFoundError(f"nothing to resume: {out} holds no checkpoint (checkpoint/); "
                                    "drop --resume to start a new run there") from None
        return None
    if not resume:
        raise FileExistsError(f"{out} already holds a checkpoint ({path}); pass resume=True (--resume) "
                              "to continue it, or choose another output directory")
    ckpt = load_checkpoint(path, prefer=())
    if ckpt.state is None:
        raise ValueError(f"{path} has no training state (state.json); it cannot be resumed")
    if ckpt.version != VERSION:
        raise ValueError(f"{path} was written in checkpoint format version {ckpt.version} (this qkv writes "
                         f"{VERSION}); it cannot be resumed: load it for prediction, or start a new run")
    log.info("resuming from %s", path)
    return ckpt


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
