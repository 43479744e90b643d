"""Image captioning models (Show, Attend and Tell)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["CAPTION_MODELS"]

#: model name -> constructor taking keyword arguments (registered in :mod:`qkv.models.registry`)
CAPTION_MODELS: dict[str, Callable[..., nn.Module]] = {}
