"""Stage two of attention: turn raw scores into weights along the last axis.

A normaliser is any callable ``(scores) -> weights`` acting on the last axis. The core hands it
scores whose masked positions hold a very negative finite number and sets those weights to exactly
zero afterwards, so a user's normaliser needs no mask logic of its own.

- ``softmax``: ``exp(s_i) / sum_j exp(s_j)``.
- ``sparsemax``: the Euclidean projection of the scores onto the probability simplex
  (Martins & Astudillo, 2016, "From Softmax to Sparsemax", https://arxiv.org/abs/1602.02068);
  weights are exactly zero outside a data-dependent support.
- ``smooth``: ``sigmoid(s_i) / sum_j sigmoid(s_j)`` (Chorowski et al., 2015, https://arxiv.org/abs/1506.07503).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["softmax", "sparsemax", "smooth", "get_normalizer", "NORMALIZERS"]

Normalizer = Callable[[Tensor], Tensor]


def softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis."""
    return torch.softmax(scores, dim=-1)


class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor) -> Tensor:
        sorted_z, _ = torch.sort(z, dim=-1, descending=True)
        cumsum = sorted_z.cumsum(dim=-1)
        k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
        # support size: the largest k with 1 + k * z_(k) > sum_{j <= k} z_(j)
        in_support = 1 + k * sorted_z > cumsum
        support = in_support.sum(dim=-1, keepdim=True).clamp(min=1)
        tau = (cumsum.gather(-1, support - 1) - 1) / support.to(z.dtype)
        p = (z - tau).clamp(min=0)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (p,) = ctx.saved_tensors
        s = (p > 0).to(grad.dtype)
        mean = (grad * s).sum(dim=-1, keepdim=True) / s.sum(dim=-1, keepdim=True).clamp(min=1)
        return s * (grad - mean)


def sparsemax(scores: Tensor) -> Tensor:
    """Sparsemax over the last axis: ``argmin_p ||p - s||`` over the probability simplex.

    An empty last axis gives empty weights; float16/bfloat16 are sorted and summed in float32.
    """
    if scores.shape[-1] == 0:
        return scores.clone()
    if scores.dtype in (torch.float16, torch.bfloat16):
        return _Sparsemax.apply(scores.float()).to(scores.dtype)
    return _Sparsemax.apply(scores)


def smooth(scores: Tensor) -> Tensor:
    """Chorowski et al.'s smoothing (2015): ``sigmoid(s_i) / sum_j sigmoid(s_j)``, flatter than softmax, so that
    a location-aware speech model spreads its attention over the several frames of one sound."""
    if scores.shape[-1] == 0:
        return scores.clone()
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    s = torch.sigmoid(work)
    return (s / s.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)).to(scores.dtype)


NORMALIZERS: dict[str, Normalizer] = {"softmax": softmax, "sparsemax": sparsemax, "smooth": smooth}


def get_normalizer(normalize: str | Normalizer) -> Normalizer:
    """Resolve a normaliser given by name (``softmax``, ``sparsemax``, ``smooth``) or as a callable."""
    if callable(normalize):
        return normalize
    if isinstance(normalize, str) and normalize in NORMALIZERS:
        return NORMALIZERS[normalize]
    raise ValueError(f"unknown normalize {normalize!r}; expected one of {sorted(NORMALIZERS)} or a callable")
