"""What the tasks' commands share."""

from __future__ import annotations

import os
from typing import Any


def print_result(result: Any, head: str = "") -> None:
    """Print how a :class:`qkv.train.TrainResult` ended and its final metrics, one split per line (on the first
    process only, under ``torchrun``)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print(f"{head}stopped: {result.stopped} after {result.state.global_step} steps ({result.state.elapsed:.1f} s)")
    for split, metrics in result.metrics.items():
        print(f"{head}{split}: " + ", ".join(f"{name} {v:.4f}" for name, v in metrics.items()))
    if result.out and not head:
        print(f"checkpoint: {result.out}")
