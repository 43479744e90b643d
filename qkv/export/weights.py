"""Attention weights as named graph outputs: a wrapper that runs a model inside :func:`qkv.capture_attention`.

Traced by ``torch.export``, the capture is part of the graph: every attention module's weights (token attention
``(B, H, Tq, Tk)``, channel gates ``(B, C)``, spatial maps ``(B, H, W)``, as :class:`qkv.AttentionRecord` holds
them) become outputs named ``attention.<module path>`` after the model's own outputs.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..capture import capture_attention

__all__ = ["WithWeights", "weight_names"]


def _names(records) -> list[str]:
    names, seen = [], {}
    for r in records:
        n = seen[r.name] = seen.get(r.name, 0) + 1
        names.append(f"attention.{r.name}" + (f".{n}" if n > 1 else ""))
    return names


class WithWeights(nn.Module):
    """``forward(*inputs) -> (*outputs, *weights)``: ``graph``'s outputs, then the weights of every attention of
    ``model`` (a submodule of ``graph``) in the order they ran. :attr:`names` holds the weights' output names once
    the wrapper has run."""

    def __init__(self, graph: nn.Module, model: nn.Module, flatten: Callable[[object], tuple[Tensor, ...]] = tuple):
        super().__init__()
        self.inner, self.flatten = graph, flatten
        self._watched = (model,)  # not a second registration: the exporters want one path per parameter
        self.names: list[str] = []

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        with capture_attention(self._watched[0], join_steps=False) as records:
            out = self.inner(*inputs)
        self.names = _names(records)
        out = (out,) if isinstance(out, Tensor) else tuple(out)
        return (*out, *(r.weights for r in records))


def weight_names(wrapper: WithWeights, *inputs: Tensor) -> list[str]:
    """The names of the weight outputs of ``wrapper`` (runs it once on ``inputs``)."""
    wrapper(*inputs)
    return list(wrapper.names)
