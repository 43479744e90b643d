"""An image model's attention maps sorted by kind (:class:`AttentionView`, :func:`attention_view`): what
``qkv show-attention`` draws."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

__all__ = ["AttentionView", "attention_view"]


@dataclass
class AttentionView:
    """A batch's probabilities and its attention maps by kind (what ``qkv show-attention`` draws).

    ``spatial``: ``{name: (B, h, w)}``; ``channel``: ``{name: (B, C)}``; ``branches``: ``{name: (B, M, C)}``
    with ``branch_labels[name]``; ``non_local``: ``{name: (B, HW, HW')}`` with ``grids[name] = ((h, w), (h', w'))``.
    """

    probabilities: Tensor
    spatial: dict[str, Tensor] = field(default_factory=dict)
    channel: dict[str, Tensor] = field(default_factory=dict)
    branches: dict[str, Tensor] = field(default_factory=dict)
    branch_labels: dict[str, list[str]] = field(default_factory=dict)
    non_local: dict[str, Tensor] = field(default_factory=dict)
    grids: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.spatial or self.channel or self.branches or self.non_local)


def attention_view(model: nn.Module, x: Tensor) -> AttentionView:
    """One forward pass of ``x (B, C, H, W)`` with ``return_attention=True``, its maps sorted by kind.

    The maps come back in the order the blocks ran; forward hooks on the SK and non-local blocks give the
    kernel sizes and the feature-map sizes their maps need.
    """
    from ... import vision

    records: list[tuple[nn.Module, tuple[int, int]]] = []  # SK and non-local blocks, in the order they ran
    hooks = [m.register_forward_hook(lambda mod, args, out: records.append((mod, tuple(args[0].shape[-2:]))))
             for m in model.modules() if isinstance(m, vision.SelectiveKernel | vision.NonLocal)]
    try:
        with torch.no_grad():
            logits, maps = model(x, return_attention=True)
    finally:
        for h in hooks:
            h.remove()
    view = AttentionView(probabilities=logits.float().softmax(-1).cpu())
    pending = iter(records)  # the 3-D maps (SK, non-local) come in the same order
    for name, m in maps.items():
        if isinstance(m, vision.CBAMAttention):
            view.channel[f"{name}.channel"] = m.channel.flatten(1).float().cpu()
            view.spatial[f"{name}.spatial"] = m.spatial[:, 0].float().cpu()
        elif not isinstance(m, Tensor):
            logger.warning("skipping attention map %s of type %s", name, type(m).__name__)
        elif m.dim() == 4 and m.shape[1] == 1 and m.shape[-2:].numel() > 1:
            view.spatial[name] = m[:, 0].float().cpu()
        elif m.dim() == 4 and m.shape[-2:].numel() == 1:
            view.channel[name] = m.flatten(1).float().cpu()
        elif m.dim() == 3 and (rec := next(pending, None)) is not None:
            mod, (h, w) = rec
            if isinstance(mod, vision.SelectiveKernel):
                view.branches[name] = m.float().cpu()
                view.branch_labels[name] = [f"{k}x{k}" for k in mod.kernel_sizes]
                continue
            keys = (h // 2, w // 2) if mod.subsample else (h, w)
            if h * w != m.shape[1] or keys[0] * keys[1] != m.shape[2]:
                logger.warning("skipping non-local map %s: shape %s does not fit a %dx%d feature map", name,
                               tuple(m.shape), h, w)
                continue
            view.non_local[name] = m.float().cpu()
            view.grids[name] = ((h, w), keys)
        else:
            logger.warning("skipping attention map %s of shape %s", name, tuple(m.shape))
    return view
