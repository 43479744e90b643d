"""The optimizer's parameter groups (:func:`param_groups`: weight decay on matrices only) and the mixed precision
dtype of a run (:func:`amp_dtype`, :func:`dtype_name`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["param_groups", "dtype_name", "amp_dtype"]


def param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weights with two or more dimensions; none on biases, norms and other vectors."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.ndim >= 2]
    keep = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0})
            if g["params"]]


def dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "off"


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(f"amp='fp16' needs a CUDA device (training on {device}); use amp='bf16' or 'off'")
    return torch.bfloat16 if amp == "bf16" else torch.float16
