"""What happens at each step, as pure functions: the learning-rate factor and the order of batches.

Both depend only on their arguments (no hidden state), which is what makes an exact resume simple: the
trainer stores its position (epoch, step) and recomputes the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["lr_factor", "epoch_batches", "num_batches", "derive_seed"]


def lr_factor(step: int, total_steps: int, *, schedule: str = "cosine", warmup_steps: int = 0,
              min_lr_ratio: float = 0.0, progress: float | None = None) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based) of ``total_steps``.

    Linear warm-up over ``warmup_steps`` (step 0 uses ``1/warmup_steps``), then ``constant``, ``linear`` or
    ``cosine`` decay to ``min_lr_ratio`` at ``total_steps``, or ``inverse_sqrt`` (Vaswani et al., 2017:
    ``sqrt(warmup_steps / (step + 1))``, no floor). Steps past the end keep the final value.

    ``progress`` (in ``[0, 1]``) replaces ``(step - warmup_steps) / (total_steps - warmup_steps)``: the position in
    the decay of a schedule whose length moves (:class:`qkv.train.budget.Horizon`).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup_steps, 1) / (step + 1))
    if progress is None:
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        shape = 1.0 - progress
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown schedule {schedule!r}; expected constant, linear, cosine or inverse_sqrt")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that mixes integers (e.g. ``(seed, epoch)``), stable across runs and platforms."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


def epoch_batches(n: int, batch_size: int, *, seed: int, epoch: int, drop_last: bool = False,
                  lengths: Sequence[int] | None = None, bucket_batches: int = 50,
                  min_batch: int = 1) -> list[list[int]]:
    """The global batches of epoch ``epoch``: lists of example indices, a pure function of the arguments.

    Examples are shuffled with a generator seeded from ``(seed, epoch)``. With ``lengths``, each pool of
    ``bucket_batches * batch_size`` shuffled examples is sorted by length before being cut into batches, and
    the batches are then shuffled, so that a batch holds similar lengths (less padding) and the order stays
    random. A last batch smaller than ``batch_size`` is dropped with ``drop_last``, and always when it has
    fewer than ``min_batch`` examples (the number of processes, each of which needs one).
    """
    if lengths is not None and len(lengths) != n:
        raise ValueError(f"lengths has {len(lengths)} entries for {n} examples")
    g = torch.Generator().manual_seed(derive_seed(seed, epoch))
    order = torch.randperm(n, generator=g).tolist()
    if lengths is not None and bucket_batches > 1:
        pool = bucket_batches * batch_size
        order = [i for s in range(0, n, pool) for i in sorted(order[s:s + pool], key=lengths.__getitem__)]
    batches = [order[s:s + batch_size] for s in range(0, n, batch_size)]
    if batches and (len(batches[-1]) < min_batch or (drop_last and len(batches[-1]) < batch_size)):
        batches.pop()
    if lengths is not None and bucket_batches > 1:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return batches


def num_batches(n: int, batch_size: int, *, drop_last: bool = False, min_batch: int = 1) -> int:
    """``len(epoch_batches(n, batch_size, ...))`` without building them."""
    full, rest = divmod(n, batch_size)
    return full + (1 if rest and not drop_last and rest >= min_batch else 0)
