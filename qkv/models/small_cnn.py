"""A small CNN for 28x28 grey images (MNIST, Fashion-MNIST) with the same ``attn=`` argument as the ResNets.

Not from a paper: three stages of 3x3 conv -> BN -> ReLU at 28x28, 14x14 and 7x7, then global average
pooling and a linear classifier. Sized to train on a laptop's CPU in minutes. Attention goes where the
blocks' papers put it in a ResNet, scaled down:

- ``se``, ``eca``, ``cbam``, ``cbam_channel``, ``cbam_spatial``, ``arm`` or a callable ``channels -> module``:
  at the end of every stage, before its pooling;
- ``sk``: replaces the last 3x3 convolution of every stage (with its norm and activation);
- ``non_local``: once, at the end of the 14x14 stage (196 positions, the middle resolution, as the
  Non-local paper places its blocks in res3/res4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .. import vision

__all__ = ["SmallCNN"]

_EVERY_STAGE = ("se", "eca", "cbam", "cbam_channel", "cbam_spatial", "arm")


def _conv_bn_relu(cin: int, cout: int, **kw) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False, **kw), nn.BatchNorm2d(cout, **kw),
                         nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """Conv net for small images: ``(B, in_channels, H, W) -> logits (B, num_classes)``.

    Args:
        num_classes: outputs.  in_channels: image channels (1 for grey).
        widths: channels of the three stages.  convs: 3x3 convolutions per stage.
        attn: a :mod:`qkv.vision` name, a callable ``channels -> nn.Module`` or ``None`` (see the module docstring).
        attn_kwargs: keyword arguments for every attention block.
        dropout: before the classifier.

    ``forward(x, return_attention=True)`` returns ``(logits, maps)``, ``maps`` keyed by ``"stage1"`` ... .
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, *, widths: Sequence[int] = (32, 64, 128),
                 convs: Sequence[int] = (1, 2, 2), attn: str | Callable[[int], nn.Module] | None = None,
                 attn_kwargs: Mapping | None = None, dropout: float = 0.2, device=None, dtype=None):
        super().__init__()
        widths, convs = tuple(widths), tuple(convs)
        if len(widths) != len(convs) or not widths or any(w < 1 for w in widths) or any(c < 1 for c in convs):
            raise ValueError(f"widths and convs must be positive and of the same length, got {widths}, {convs}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        kw = {"device": device, "dtype": dtype}
        attn_kwargs = dict(attn_kwargs or {})
        name = None
        if isinstance(attn, str):
            name = vision.canonical_name(attn)
            if name == "ffm":
                raise ValueError("'ffm' fuses two paths and has no place in a one-path CNN")
        elif attn is not None and not callable(attn):
            raise ValueError(f"attn must be a block name, a callable or None, got {type(attn).__name__}")
        self.attn_name = name if name is not None or attn is None else getattr(attn, "__name__", "custom")

        self.stages = nn.ModuleList()
        self.attns = nn.ModuleList()
        cin = in_channels
        for s, (width, count) in enumerate(zip(widths, convs, strict=True)):
            layers: list[nn.Module] = []
            for i in range(count):
                last = i == count - 1
                if name == "sk" and last:
                    layers.append(vision.SelectiveKernel(cin, width, **attn_kwargs, **kw))
                else:
                    layers.append(_conv_bn_relu(cin, width, **kw))
                cin = width
            self.stages.append(nn.Sequential(*layers))
            if name in _EVERY_STAGE or name == "non_local" and s == min(1, len(widths) - 1):
                block = vision.create(name, width, **attn_kwargs, **kw)
            elif attn is not None and name is None:
                block = attn(width, **attn_kwargs)
            else:
                block = nn.Identity()
            self.attns.append(block)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(cin, num_classes, **kw)

    def forward(self, x: Tensor, *, return_attention: bool = False):
        maps: dict[str, object] = {}
        last = len(self.stages) - 1
        for s, (stage, attn) in enumerate(zip(self.stages, self.attns, strict=True)):
            for layer in stage:
                if return_attention and isinstance(layer, vision.SelectiveKernel):
                    x, maps[f"stage{s + 1}.sk"] = layer(x, return_attention=True)
                else:
                    x = layer(x)
            if not isinstance(attn, nn.Identity):
                if return_attention:
                    x, maps[f"stage{s + 1}"] = attn(x, return_attention=True)
                else:
                    x = attn(x)
            if s < last:
                x = self.pool(x)
        logits = self.fc(self.dropout(torch.flatten(x.mean(dim=(2, 3)), 1)))
        return (logits, maps) if return_attention else logits
