"""The run's ``metrics.jsonl``: :class:`MetricsLog` appends whole lines (and repairs a torn one), and
:func:`log_train` writes the trainer's ``train`` lines."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..options import option_error, ref

__all__ = ["MetricsLog", "log_train"]

log = logging.getLogger("qkv.train.trainer")


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only; ``path=None`` writes nothing).

    Every line is one ``write`` call on a file opened for appending, so it reaches the file whole; a write that
    fails part-way (a full disk) is cut back off, and the error names the file and the option ``flag`` (its field
    name). A torn last line that a killed process left behind is removed, with a warning, when the log is opened.
    """

    def __init__(self, path: Path | None, *, flag: str = "out"):
        self.path, self.flag = path, flag
        if path is not None:
            self._repair()

    def _error(self, e: OSError, doing: str) -> OSError:
        err = option_error(OSError, "cannot {doing} {path} (" + ref(self.flag) + "): {why}", self.flag, doing=doing,
                           path=self.path, why=e.strerror or e)
        err.errno = e.errno
        return err

    def _repair(self) -> None:
        """Cut a last line without its newline (a write that a crash or a full disk interrupted)."""
        try:
            with open(self.path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                if size == 0:
                    return
                f.seek(size - 1)
                if f.read(1) == b"\n":
                    return
                end, keep = size, 0
                while end > 0:  # the last newline, reading backwards
                    start = max(0, end - 65536)
                    f.seek(start)
                    chunk = f.read(end - start)
                    i = chunk.rfind(b"\n")
                    if i >= 0:
                        keep = start + i + 1
                        break
                    end = start
                f.truncate(keep)
        except FileNotFoundError:
            return
        except OSError as e:
            raise self._error(e, "repair") from None
        log.warning("%s: removed a torn last line (%d bytes) that an interrupted write left", self.path, size - keep)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        data = (json.dumps(record, sort_keys=False) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise self._error(e, "write") from None
        try:
            size = os.fstat(fd).st_size
            done = 0
            try:
                while done < len(data):
                    done += os.write(fd, data[done:])
            except OSError as e:
                with contextlib.suppress(OSError):
                    if done:
                        os.ftruncate(fd, size)  # no torn line
                raise self._error(e, "append to") from None
        finally:
            os.close(fd)


def log_train(trainer, logs: dict[str, Any]) -> None:
    """Write the ``train`` line of ``metrics.jsonl`` for the steps since the last one (``trainer._interval``), and
    log it; the task's stats are summed over processes (every rank reaches this step)."""
    iv, st, d = trainer._interval, trainer.state, trainer.dist
    names = sorted(iv["stats"])
    stats = {}
    if names:
        vals = torch.stack([torch.as_tensor(iv["stats"][k], dtype=torch.float64).to(d.device) for k in names])
        stats = dict(zip(names, d.all_reduce_sum(vals).tolist(), strict=True))
    count = max(iv["count"], 1e-12)
    record = {"event": "train", "epoch": trainer._epoch_float(),
              "global_step": st.global_step, "loss": iv["loss"] / count, "lr": logs["lr"],
              f"{trainer.task.unit}_per_s": iv["count"] / max(iv["seconds"], 1e-9)}
    if iv.get("grad_norm") is not None:
        record["grad_norm"] = float(iv["grad_norm"])
    record.update({k: v / count for k, v in stats.items()})
    if trainer.budget is not None:
        record["schedule_steps"] = trainer.horizon.total  # where the time budget's fit ends the LR schedule
    record["time"] = round(st.elapsed, 3)
    trainer.metrics.write(record)
    if d.is_main:
        (log.debug if trainer.show_progress else log.info)(
            "step %d (epoch %.2f): %s", st.global_step, record["epoch"],
            ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in ("event", "epoch", "global_step", "time")))
