"""The training loop shared by every task: :func:`train`.

One optimizer step per global batch: the batch's examples are split across processes, each process sums its
loss, the counts are summed over processes, and the gradient is that of ``sum of losses / global count``,
exactly as in one process on the whole batch. AdamW, warm-up + decay, gradient clipping, mixed precision,
progress bars, ``metrics.jsonl``, checkpoints (every epoch, at the end, on the time budget, on Ctrl-C or
SIGTERM) and an exact resume. With a time budget the run and its LR schedule end when the measured time says
(:mod:`qkv.train.budget`). The run directory is locked for the run's life (:mod:`qkv.train.lock`): a second
training of it is refused at once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..options import option_error, ref
from . import distributed, rng
from .budget import Horizon, TimeBudget
from .checkpoint import load_checkpoint, write_checkpoint
from .config import TrainConfig
from .interrupt import Interrupted, StopFlag, terminate_raises
from .metrics_log import MetricsLog, log_train
from .precision import amp_dtype, dtype_name, group_lr
from .rundir import find_checkpoint, hold_run_directory, load_resumed_weights, restore, save
from .schedule import derive_seed, epoch_batches, lr_factor, num_batches
from .state import TrainResult, TrainState
from .task import Task
from .threads import follow_machine, thread_tuner, threads_held

__all__ = ["train", "Trainer", "TrainState", "TrainResult"]

log = logging.getLogger(__name__)


Callback = Callable[[TrainState, dict[str, float]], Any]


def train(task: Task, config: TrainConfig, callbacks: Sequence[Callback] = (), *,
          clock: Callable[[], float] = time.monotonic) -> TrainResult:
    """Train ``task``'s model as ``config`` says; see the module docstring and :class:`TrainConfig`.

    ``callbacks`` are called after every optimizer step as ``callback(state, logs)`` with
    ``logs = {"loss", "lr", "count", "seconds", "stats"}`` of that step (``stats``: the task's loss statistics, summed
    over the step's examples in this process). A ``KeyboardInterrupt`` (Ctrl-C, or raised by a callback)
    writes a checkpoint and is raised again; the first Ctrl-C or SIGTERM stops at the end of the current step
    (then :class:`~qkv.train.interrupt.Interrupted`, a ``KeyboardInterrupt`` whose ``exit_code`` is 130 or 143, is
    raised), a second one at once. Under ``torchrun`` every process calls ``train`` with the same arguments.
    ``clock`` is the time source, in seconds (the time budget, ``elapsed``, rates): tests pass a fake one.

    Raises:
        ValueError: bad settings, or data that no longer matches the checkpoint being resumed.
        FileExistsError: ``config.out`` holds a checkpoint and ``config.resume`` is false, or another training
            holds ``config.out`` (:class:`~qkv.train.lock.RunInUseError`).
        OSError: ``config.out`` cannot be written (the message names the path and ``out``).
    """
    return Trainer(task, config, callbacks, clock=clock).fit()


class Trainer:
    """The loop behind :func:`train`; use :func:`train` unless you need the pieces."""

    def __init__(self, task: Task, config: TrainConfig, callbacks: Sequence[Callback] = (), *,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(task, Task):
            raise TypeError(f"task must be a qkv.train.Task, got {type(task).__name__}")
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.task, self.config, self.callbacks, self.clock = task, config, list(callbacks), clock
        self.out = Path(config.out) if config.out is not None else None

    # --- entry -----------------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        self.dist = distributed.setup(self.config.device)
        threads = torch.get_num_threads()  # put back at the end: the tuner or config.threads may change it
        try:
            # threads_held: the loops of its evaluations follow nothing (the count is its tuner's or config.threads)
            with terminate_raises(), hold_run_directory(self.out, self.dist), threads_held():
                return self._fit()
        finally:
            torch.set_num_threads(threads)
            self.dist.close()

    def _fit(self) -> TrainResult:
        cfg, task, d = self.config, self.task, self.dist
        ckpt = find_checkpoint(self.out, cfg.resume)
        if ckpt is not None:
            task.load_assets(ckpt.assets)
        task.setup()
        rng.seed_all(cfg.seed)  # the same initialisation in every process
        self.module = task.build_model()
        if ckpt is not None:  # the same model, or an error naming the options that changed it
            load_resumed_weights(ckpt, task.config(), self.module)
        self.module.to(d.device)
        self.examples = task.train_examples()
        self.lengths = task.lengths()
        self.callbacks += [cb for cb in task.callbacks(cfg) if cb is not None]
        n = len(self.examples)
        if cfg.batch_size < d.world_size:
            raise ValueError(f"batch_size={cfg.batch_size} is the global batch; it must be at least the number "
                             f"of processes ({d.world_size})")
        self.steps_per_epoch = num_batches(n, cfg.batch_size, drop_last=cfg.drop_last, min_batch=d.world_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{n} training examples make no batch of batch_size={cfg.batch_size}"
                             f"{' with drop_last' if cfg.drop_last else ''}")
        self.total_steps = cfg.schedule_steps or cfg.epochs * self.steps_per_epoch  # the LR schedule's length
        self.horizon = Horizon(self.total_steps, cfg.warmup_steps)  # which a time budget moves
        self.budget = None if cfg.max_minutes is None else TimeBudget(
            60.0 * cfg.max_minutes, self.horizon, self.total_steps, cfg.epochs * self.steps_per_epoch,
            self.steps_per_epoch, cfg.eval_every, evaluates=bool(cfg.eval_split), saves=self.out is not None,
            final_evals=len(cfg.final_splits))
        self.optimizer = torch.optim.AdamW(task.param_groups(self.module, cfg), lr=cfg.lr,
                                           betas=cfg.betas, eps=cfg.eps)
        self.amp_dtype = amp_dtype(cfg.amp, d.device)
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.amp_dtype == torch.float16)
        if d.enabled:
            self.model = DistributedDataParallel(
                self.module, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                find_unused_parameters=cfg.ddp_find_unused)
        else:
            self.model = self.module
        self.state = TrainState()
        if ckpt is not None:
            restore(self, ckpt, n)
        else:
            rng.seed_all(derive_seed(cfg.seed, 1, d.rank))  # each process its own dropout/augmentation stream
        if d.is_main and self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLog(self.out / "metrics.jsonl" if d.is_main and self.out is not None else None,
                                  flag="out")
        self.metrics.write({"event": "resume" if ckpt is not None else "start", "time": time.time(),
                            "global_step": self.state.global_step, "world_size": d.world_size,
                            "device": str(d.device), "amp": dtype_name(self.amp_dtype),
                            "examples": n, "steps_per_epoch": self.steps_per_epoch, "task": task.name,
                            "train_config": cfg.to_dict()})
        self._best_weights = None
        self._saved_at_step = self._position() if ckpt is not None else None
        self.show_progress = d.is_main and (cfg.progress if cfg.progress is not None else sys.stderr.isatty())
        stopped = self._loop()
        return self._finish(stopped)

    # --- the loop --------------------------------------------------------------------------------------
    def _loop(self) -> str:
        cfg, st, d = self.config, self.state, self.dist
        start = self.clock()
        elapsed0 = st.elapsed
        self._now = lambda: elapsed0 + self.clock() - start  # seconds of training over all invocations
        self.tuner = thread_tuner(cfg.threads, d.device, d.enabled, elapsed0)  # threads that follow the machine
        self._interval = {"loss": 0.0, "count": 0.0, "stats": {}, "seconds": 0.0}
        self._spent = [0.0, 0, 0.0, 0]  # since the last step: seconds and number of evaluations, of checkpoints
        if self.budget is not None and self.budget.begin(st.global_step, elapsed0):
            log.warning("the time budget (max_minutes=%g) is spent: %.1f s trained; pass a larger one to train on",
                        cfg.max_minutes, elapsed0)
            return "time"
        if cfg.max_steps is not None and st.global_step >= cfg.max_steps:  # checked before a step: a finished run
            log.warning("the run has trained %d steps, max_steps is %d: no step is trained; pass a larger one to "
                        "train on", st.global_step, cfg.max_steps)
            return "max_steps"
        self._phase = None  # "step" while a step computes, "update" while it changes the weights
        self._agreed_interrupt = False
        with StopFlag() as flag:
            try:
                while st.epoch < cfg.epochs and not st.stopped_early:
                    batches = epoch_batches(len(self.examples), cfg.batch_size, seed=cfg.seed, epoch=st.epoch,
                                            drop_last=cfg.drop_last, lengths=self.lengths,
                                            bucket_batches=cfg.bucket_batches, min_batch=d.world_size)
                    bar = tqdm(total=len(batches), initial=st.step, disable=not self.show_progress, unit="step",
                               desc=f"epoch {st.epoch + 1}/{cfg.epochs}", dynamic_ncols=True, leave=True)
                    epoch_t0, epoch_units = self.clock(), 0.0
                    try:
                        for indices in batches[st.step:]:
                            logs = self._step(indices, interrupt=flag.set)
                            st.elapsed = self._now()
                            threads = follow_machine(self, logs)
                            over_time = self._budget_step(logs)
                            epoch_units += logs["count"]
                            bar.update(1)
                            rate = epoch_units / max(self.clock() - epoch_t0, 1e-9)
                            bar.set_postfix(loss=f"{logs['loss']:.4g}", lr=f"{logs['lr']:.3g}",
                                            **{f"{self.task.unit}/s": f"{rate:.4g}"}, **threads, refresh=False)
                            if st.global_step % cfg.log_every == 0:
                                self._log_train(logs)
                            for cb in self.callbacks:
                                cb(st, logs)
                            if logs["interrupt"]:  # every rank saw it in the same step
                                self._agreed_interrupt = True
                                raise Interrupted(flag.signum)
                            if cfg.eval_every and st.global_step % cfg.eval_every == 0 and st.step < len(batches):
                                self._timed(self._periodic_eval, 0)
                            if over_time:
                                return "time"
                            if self.budget is not None and not (self.tuner and self.tuner.trying):  # the end's
                                # time must be known (early, and again); not while the threads are being timed
                                evaluate, save_now = self.budget.timing_due()
                                if evaluate and not self._spent[1]:
                                    self._timed(self._periodic_eval, 0)
                                if save_now and not self._spent[3]:
                                    self._timed(self._save, 2)
                            if cfg.max_steps is not None and st.global_step >= cfg.max_steps:
                                return "max_steps"
                            if st.stopped_early:
                                return "early_stop"
                    finally:
                        bar.close()
                    self._timed(self._periodic_eval, 0)
                    st.epoch, st.step = st.epoch + 1, 0
                    self._timed(self._save, 2)
                return "early_stop" if st.stopped_early else "epochs"
            except KeyboardInterrupt:
                if self._phase == "update":
                    log.warning("interrupted during an optimizer update: the last checkpoint is kept")
                elif self.out is not None:
                    if self._phase == "step":
                        log.warning("interrupted inside step %d: the RNGs have moved on, so a resumed run will be "
                                    "valid but not bitwise identical to an uninterrupted one", st.global_step + 1)
                    # an interrupt on one rank only leaves the others behind: then write without collectives
                    self._save(collective=self._agreed_interrupt)
                    log.warning("interrupted at step %d: checkpoint written to %s", st.global_step,
                                self.out / "checkpoint")
                raise

    def _step(self, indices: list[int], *, interrupt: bool) -> dict[str, float]:
        cfg, d, st = self.config, self.dist, self.state
        t0 = self.clock()
        self._phase = "step"
        local = distributed.shard(indices, d.rank, d.world_size)
        batch = self.task.to_device(self.task.collate([self.examples[i] for i in local]), d.device)
        lr = cfg.lr * lr_factor(st.global_step, self.horizon.total, schedule=cfg.schedule,
                                warmup_steps=cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio,
                                progress=self.horizon.progress(st.global_step))
        for group in self.optimizer.param_groups:
            group["lr"] = group_lr(group, lr, st.global_step)
        with self._autocast():
            loss_sum, count, stats = self.task.loss(self.model, batch)
        if not torch.is_tensor(loss_sum) or loss_sum.ndim != 0:
            raise ValueError(f"{type(self.task).__name__}.loss must return a scalar tensor (the summed loss) "
                             f"first, got {type(loss_sum).__name__}")
        # one all-reduce per step: loss and count for normalising and logging, the interrupt flag, and rank 0's
        # clock with the seconds of its evaluations and checkpoints since the last step (for the time budget)
        clock = [self._now(), self._spent[0], self._spent[2]] if d.is_main else [0.0, 0.0, 0.0]
        shared = torch.cat([loss_sum.detach().to(torch.float64).reshape(1),
                            torch.tensor([float(count), float(interrupt), *clock], dtype=torch.float64,
                                         device=d.device)])
        total_loss, total_count, n_interrupt, now, eval_s, save_s = d.all_reduce_sum(shared).tolist()
        if total_count <= 0:
            raise ValueError(f"{type(self.task).__name__}.loss counted nothing in batch {st.step} of epoch "
                             f"{st.epoch}: count must be the number of items or tokens summed over")
        guard = not self.scaler.is_enabled()  # with fp16 the scaler skips non-finite steps itself
        if guard and not math.isfinite(total_loss):
            self._non_finite("loss", total_loss)
        self.scaler.scale(loss_sum / (total_count / d.world_size)).backward()
        grad_norm = None
        if cfg.clip_norm is not None or guard:
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), cfg.clip_norm or math.inf)
            if guard and not bool(torch.isfinite(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                self._non_finite("gradient norm", float(grad_norm))
            if cfg.clip_norm is None:
                grad_norm = None
        self._phase = "update"
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        st.step += 1
        st.global_step += 1
        self._phase = None
        iv = self._interval
        iv["loss"] += total_loss
        iv["count"] += total_count
        for k, v in stats.items():
            iv["stats"][k] = iv["stats"].get(k, 0.0) + (v.detach().to(torch.float64) if torch.is_tensor(v) else v)
        iv["grad_norm"] = grad_norm
        seconds = self.clock() - t0
        iv["seconds"] += seconds
        return {"loss": total_loss / total_count, "lr": lr, "count": total_count, "interrupt": n_interrupt > 0,
                "now": now, "seconds": seconds, "stats": stats, "eval_seconds": eval_s, "save_seconds": save_s}

    def _timed(self, fn: Callable[[], bool], slot: int) -> None:
        """Run an evaluation (``slot`` 0) or a checkpoint (2), adding its seconds for the time budget."""
        t0 = self.clock()
        if fn():
            self._spent[slot] += self.clock() - t0
            self._spent[slot + 1] += 1

    def _budget_step(self, logs: dict[str, float]) -> bool:
        """Tell the time budget of the step (rank 0's clock, the same on every rank); whether to stop now."""
        spent, self._spent = self._spent, [0.0, 0, 0.0, 0]
        if self.budget is None:
            return False
        return self.budget.record(self.state.global_step, logs["now"], eval_seconds=logs["eval_seconds"],
                                  evals=spent[1], save_seconds=logs["save_seconds"], saves=spent[3])

    def _non_finite(self, what: str, value: float) -> None:
        """Stop before a non-finite loss or gradient reaches the weights: the saved checkpoints stay good."""
        st = self.state
        kept = f"; the last good checkpoint is kept in {self.out / 'checkpoint'}" if self.out is not None else ""
        raise option_error(FloatingPointError, "the {what} is {value} at step {step} (epoch {epoch}): training stopped "
                           "before it changed the weights{kept} — lower the learning rate (" + ref("lr") + "), check "
                           "the data for nan/inf, or keep " + ref("clip_norm") + " on", "lr", "clip_norm", what=what,
                           value=value, step=st.global_step + 1, epoch=st.epoch + 1, kept=kept)

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.dist.device.type, dtype=self.amp_dtype)

    # --- logging -----------------------------------------------------------------------------------------
    def _log_train(self, logs: dict[str, float]) -> None:
        log_train(self, logs)
        self._interval = {"loss": 0.0, "count": 0.0, "stats": {}, "seconds": 0.0}

    # --- evaluation ----------------------------------------------------------------------------------------
    def _evaluate(self, split: str, event: str) -> dict[str, float]:
        self.module.eval()
        try:
            with rng.forked(), torch.no_grad(), self._autocast():
                metrics = self.task.evaluate(self.module, split)
        finally:
            self.module.train()
        metrics = {k: float(v) for k, v in (metrics or {}).items()}
        st = self.state
        self.metrics.write({"event": event, "split": split, "epoch": self._epoch_float(), "global_step": st.global_step,
                            "metrics": metrics, "time": round(st.elapsed, 3)})
        log.info("%s %s at step %d: %s", event, split, st.global_step,
                 ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) or "(no metrics)")
        return metrics

    def _periodic_eval(self) -> bool:
        """Evaluate ``eval_split`` on rank 0, track the best model, decide early stopping for every rank."""
        cfg, st, d = self.config, self.state, self.dist
        if not cfg.eval_split:
            return False
        self._evaluated_at = st.global_step
        stop = torch.zeros(1, dtype=torch.float64, device=d.device)
        if d.is_main:
            metrics = self._evaluate(cfg.eval_split, "eval")
            if cfg.monitor:
                if cfg.monitor not in metrics:
                    raise ValueError(f"monitor={cfg.monitor!r} is not among the metrics of split "
                                     f"{cfg.eval_split!r}: {', '.join(sorted(metrics)) or 'none'}")
                value = metrics[cfg.monitor]
                better = (value > st.best + cfg.min_delta if cfg.mode == "max" else value < st.best - cfg.min_delta) \
                    if st.best is not None else not math.isnan(value)
                if better:
                    st.best, st.best_step, st.bad_evals = value, st.global_step, 0
                    self._save_best()
                else:
                    st.bad_evals += 1
                    if cfg.patience and st.bad_evals >= cfg.patience:
                        log.info("early stopping: %s has not improved for %d evaluations (best %.4g at step %s)",
                                 cfg.monitor, st.bad_evals, st.best, st.best_step)
                        stop.fill_(1.0)
        st.stopped_early = bool(d.broadcast(stop).item())
        return True

    # --- checkpoints -------------------------------------------------------------------------------------
    def _save(self, collective: bool = True) -> bool:
        """Write ``out/checkpoint`` (rank 0) unless it holds this position; whether it was written."""
        if self.out is None or self._saved_at_step == self._position():
            return False
        save(self, collective)
        self._saved_at_step = self._position()
        return True

    def _epoch_float(self) -> float:
        return round(self.state.epoch + self.state.step / self.steps_per_epoch, 4)

    def _position(self):
        st = self.state
        return st.epoch, st.step, st.global_step, st.stopped_early

    def _save_best(self) -> None:
        """Keep the best weights in memory (the final evaluation uses them: never what another process may have
        put on disk) and write them to ``out/best``."""
        self._best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}
        if self.out is not None:
            write_checkpoint(self.out / "best", weights=self.module.state_dict(), task=self.task.name,
                             config=self.task.config(), save_assets=self.task.save_assets, flag="out")

    # --- the end -----------------------------------------------------------------------------------------
    def _finish(self, stopped: str) -> TrainResult:
        cfg, d, st = self.config, self.dist, self.state
        if stopped == "time" and getattr(self, "_evaluated_at", None) != st.global_step:
            self._periodic_eval()  # the annealed model may be the best: within the budget's time kept for the end
        self._save()
        log.info("training stopped (%s) at epoch %d, step %d", stopped, st.epoch, st.global_step)
        results: dict[str, dict[str, float]] = {}
        if d.is_main:
            if cfg.monitor:
                best = self._best_weights
                if best is None and st.best_step is not None and self.out is not None and \
                        (self.out / "best" / "model.safetensors").exists():  # found before a resume: ours (locked)
                    best = load_checkpoint(self.out / "best", prefer=()).state_dict
                if best is not None:
                    self.module.load_state_dict(best)
            for split in cfg.final_splits:
                results[split] = self._evaluate(split, "final")
            st.elapsed = self._now()
            self.metrics.write({"event": "end", "stopped": stopped, "global_step": st.global_step,
                                "best": st.best, "best_step": st.best_step, "time": round(st.elapsed, 3)})
        return TrainResult(model=self.module, state=st, metrics=results, stopped=stopped, out=self.out)
