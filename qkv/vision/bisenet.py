"""BiSeNet's attention refinement module (ARM) and feature fusion module (FFM).

Paper: Yu, Wang, Peng, Gao, Yu and Sang, "BiSeNet: Bilateral Segmentation Network for Real-time Semantic
Segmentation", ECCV 2018, https://arxiv.org/abs/1808.00897 (Figure 3 (b) and (c)).

    ARM:  w = sigmoid(BN(conv_1x1(avgpool(x))))                       out = x * w
    FFM:  u = relu(BN(conv([x_spatial; x_context])))                   fuse the two paths
          w = sigmoid(conv_1x1(relu(conv_1x1(avgpool(u)))))           out = u + u * w

What differs from the paper: the figure does not give the FFM's kernel size or a reduction inside its
attention; the defaults here are a 1x1 convolution (as the released code) and no reduction
(``reduction=1``); ``reduction`` shrinks the hidden layer as in SE. The FFM takes any number of inputs
(``forward(*features)``) and concatenates them; ``channels`` is their total.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import hooks
from ._common import LayerLike, check_input, check_positive, global_avg_pool, make_layer, reduced_channels
from .squeeze_excite import scale_channels

__all__ = ["AttentionRefinement", "FeatureFusion"]


class AttentionRefinement(nn.Module):
    """ARM: ``x * sigmoid(BN(conv_1x1(avgpool(x))))``.

    Args:
        channels: ``C``.  gate_layer: the gate.  norm_layer: after the convolution (``None``: none).
        bias: of the convolution (default: only without a norm).

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention ``(B, C, 1, 1)``.
    """

    attention_kind = "channel"  #: what qkv.capture_attention records

    def __init__(self, channels: int, *, gate_layer: LayerLike = nn.Sigmoid,
                 norm_layer: type[nn.Module] | None = nn.BatchNorm2d, bias: bool | None = None,
                 device=None, dtype=None):
        super().__init__()
        check_positive(channels=channels)
        kw = {"device": device, "dtype": dtype}
        bias = norm_layer is None if bias is None else bias
        self.channels = channels
        self.conv = nn.Conv2d(channels, channels, 1, bias=bias, **kw)
        self.norm = norm_layer(channels, **kw) if norm_layer is not None else nn.Identity()
        self.gate = make_layer(gate_layer)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        weights = self.gate(self.norm(self.conv(global_avg_pool(x))))
        if hooks.active():
            hooks.report_map("channel", weights)
        out = scale_channels(x, weights)
        return (out, weights) if return_attention else out


class FeatureFusion(nn.Module):
    """FFM: fuse features by concatenation and a conv, then re-weight channels: ``u + u * w``.

    Args:
        channels: the total channels of the inputs once concatenated.  out_channels: of ``u`` (default
            ``channels``).  kernel_size: of the fusing convolution.  reduction: of the attention's hidden
            layer.  act_layer: after the fusing conv and inside the attention.  gate_layer: the gate.
        norm_layer: after the fusing convolution.  bias: of the two attention convolutions.

    Shapes: ``*features (B, C_i, H, W)`` with ``sum C_i = channels`` -> ``(B, out_channels, H, W)``;
    attention ``(B, out_channels, 1, 1)``.
    """

    attention_kind = "channel"  #: what qkv.capture_attention records

    def __init__(self, channels: int, out_channels: int | None = None, *, kernel_size: int = 1,
                 reduction: int = 1, act_layer: LayerLike = nn.ReLU, gate_layer: LayerLike = nn.Sigmoid,
                 norm_layer: type[nn.Module] = nn.BatchNorm2d, bias: bool = True, device=None, dtype=None):
        super().__init__()
        out_channels = channels if out_channels is None else out_channels
        check_positive(channels=channels, out_channels=out_channels, kernel_size=kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        hidden = reduced_channels(out_channels, reduction)
        kw = {"device": device, "dtype": dtype}
        self.channels, self.out_channels = channels, out_channels
        self.fuse = nn.Sequential(nn.Conv2d(channels, out_channels, kernel_size, padding=kernel_size // 2,
                                            bias=False, **kw),
                                  norm_layer(out_channels, **kw), make_layer(act_layer))
        self.attn = nn.Sequential(nn.Conv2d(out_channels, hidden, 1, bias=bias, **kw), make_layer(act_layer),
                                  nn.Conv2d(hidden, out_channels, 1, bias=bias, **kw), make_layer(gate_layer))

    def forward(self, *features: Tensor, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        if not features:
            raise ValueError("FeatureFusion needs at least one feature map")
        shapes = [tuple(f.shape) for f in features]
        if any(f.dim() != 4 or f.shape[0] != features[0].shape[0] or f.shape[2:] != features[0].shape[2:]
               for f in features):
            raise ValueError(f"FeatureFusion inputs must be (B, C_i, H, W) with the same B, H, W, got {shapes}")
        x = torch.cat(features, dim=1) if len(features) > 1 else features[0]
        check_input(x, self.channels, f"FeatureFusion (inputs {shapes})")
        u = self.fuse(x)
        weights = self.attn(global_avg_pool(u))
        if hooks.active():
            hooks.report_map("channel", weights)
        out = u + scale_channels(u, weights)
        return (out, weights) if return_attention else out
