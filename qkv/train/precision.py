"""The optimizer's parameter groups (:func:`param_groups`: weight decay on matrices only; :func:`layered_groups`:
discriminative learning rates and gradual unfreezing, with :func:`group_lr`) and the mixed precision dtype of a run
(:func:`amp_dtype`, :func:`dtype_name`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["param_groups", "layered_groups", "group_lr", "dtype_name", "amp_dtype"]


def param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weights with two or more dimensions; none on biases, norms and other vectors."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return param_groups_of(params, weight_decay)


def layered_groups(layers: list[list[nn.Parameter]], weight_decay: float, *, lr_decay: float = 1.0,
                   unfreeze_steps: int = 0) -> list[dict[str, Any]]:
    """Parameter groups of ``layers`` (lists of parameters, bottom to top), for discriminative fine-tuning (Howard &
    Ruder, 2018, ULMFiT): the layer ``d`` places below the top one learns at the schedule's rate divided by
    ``lr_decay ** d`` (``lr_scale``) and, with ``unfreeze_steps``, is frozen until step ``d * unfreeze_steps``
    (``unfreeze_step``: the top layer trains from the start, then one more every ``unfreeze_steps`` steps). Each
    layer is split as :func:`param_groups` (weight decay on matrices only); :func:`group_lr` reads the two keys."""
    if not lr_decay >= 1.0:
        raise ValueError(f"lr_decay must be >= 1, got {lr_decay}")
    if unfreeze_steps < 0:
        raise ValueError(f"unfreeze_steps must be >= 0, got {unfreeze_steps}")
    groups = []
    for d, params in enumerate(reversed(layers)):
        params = [p for p in params if p.requires_grad]
        for g in param_groups_of(params, weight_decay):
            groups.append({**g, "lr_scale": lr_decay ** -d, "unfreeze_step": d * unfreeze_steps})
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return groups


def param_groups_of(params: list[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in params if p.ndim >= 2]
    keep = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0})
            if g["params"]]


def group_lr(group: dict[str, Any], lr: float, step: int) -> float:
    """The learning rate of an optimizer ``group`` at ``step`` (0-based) when the schedule gives ``lr``: ``lr``
    times the group's ``lr_scale`` (default 1), and 0 while the step is before its ``unfreeze_step`` (default 0).
    A group with an ``unfreeze_step`` has its parameters' ``requires_grad`` set to whether it trains at ``step``
    (a frozen layer costs no gradient, and the optimizer leaves it, and its moments, untouched)."""
    frozen = step < group.get("unfreeze_step", 0)
    if "unfreeze_step" in group:
        for p in group["params"]:
            p.requires_grad_(not frozen)
    return 0.0 if frozen else lr * group.get("lr_scale", 1.0)


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
