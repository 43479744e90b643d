"""Processes and devices: the same training code in one process or under ``torchrun --nproc_per_node N``.

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; :func:`setup` reads them, picks the device
(``cuda:LOCAL_RANK`` or the CPU) and starts the process group (NCCL on CUDA, gloo on the CPU). Each global
batch is split into contiguous shares, one per rank (:func:`shard`).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Dist", "setup", "resolve_device", "shard"]

log = logging.getLogger(__name__)


@dataclass
class Dist:
    """Where this process stands: ``rank`` of ``world_size`` processes, and its ``device``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this module started the process group, and ends it in close()

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """``t`` summed over all processes (in place, and returned); a no-op in one process."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def broadcast(self, t: Tensor, src: int = 0) -> Tensor:
        if self.enabled:
            dist.broadcast(t, src)
        return t

    def all_gather(self, t: Tensor) -> list[Tensor]:
        """One copy of ``t`` from every rank (same shape and dtype everywhere), on the CPU."""
        if not self.enabled:
            return [t.cpu()]
        comm = t.to(self.device) if self.device.type == "cuda" else t
        out = [torch.empty_like(comm) for _ in range(self.world_size)]
        dist.all_gather(out, comm.contiguous())
        return [o.cpu() for o in out]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """``"auto"`` is CUDA when available (``cuda:local_rank``), else the CPU; asking for CUDA without it fails."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available here (torch.cuda.is_available() is "
                             "False); use device='cpu' or 'auto'")
        return torch.device("cuda", local_rank) if device == "cuda" else torch.device(device)
    return torch.device(device)


def setup(device: str = "auto", timeout_minutes: float = 60.0) -> Dist:
    """The process's :class:`Dist`, starting the process group if the environment asks for one.

    One process unless ``WORLD_SIZE`` > 1 (set by ``torchrun``) or a process group is already running (then it
    is used as is and left running).
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        dev = resolve_device(device, local)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return Dist(rank, world, local, dev, owns_group=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=resolve_device(device, 0))
    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={world} but this PyTorch build has no torch.distributed")
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kwargs = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=timeout_minutes), **kwargs)
    log.info("process group: %s, rank %d of %d on %s", backend, rank, world, dev)
    return Dist(rank, world, local, dev, owns_group=True)


def shard(batch: list, rank: int, world_size: int) -> list:
    """Rank ``rank``'s contiguous share of a global batch; shares differ in size by at most one."""
    n = len(batch)
    return batch[rank * n // world_size:(rank + 1) * n // world_size]
