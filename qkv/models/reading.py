"""Question answering models (readers that point at an answer span)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["QA_MODELS"]

#: model name -> constructor taking keyword arguments (registered in :mod:`qkv.models.registry`)
QA_MODELS: dict[str, Callable[..., nn.Module]] = {}
