"""Selective kernel (SK) convolution: branches with different receptive fields, fused by attention over branches.

Paper: Li, Wang, Hu and Yang, "Selective Kernel Networks", CVPR 2019, https://arxiv.org/abs/1903.06586.

    U_m = relu(BN(conv_m(x)))                   split: M branches, kernel 3x3, 5x5, ... (grouped)
    s = avgpool(sum_m U_m)                      fuse:  (B, C)
    z = relu(BN(W s))                           W: d x C,  d = max(C / r, L)
    a = softmax over m of (A_m z)               select: (B, M, C), sums to 1 over the branches
    V = sum_m a_m * U_m

What differs from the paper: nothing in the formula. As in the paper, a k x k kernel (k > 3) is a 3x3
kernel with dilation (k - 1) / 2 unless ``dilate=False``; the per-branch matrices ``A_m`` are one 1x1
convolution to ``M * C`` outputs, split by branch. ``bias`` sets the biases of the two attention layers
(the paper's formula has none; its BN follows ``W``); the branch convolutions never have one (BN follows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .. import hooks
from ._common import LayerLike, check_input, check_positive, global_avg_pool, make_layer, reduced_channels

__all__ = ["SelectiveKernel", "select_branches"]


def select_branches(branches: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    """Fuse ``branches (B, M, C, H, W)`` with ``softmax`` over ``M`` of ``logits (B, M, C)``.

    Returns ``(V (B, C, H, W), weights (B, M, C))``.
    """
    weights = torch.softmax(logits, dim=1)
    return (branches * weights[..., None, None]).sum(dim=1), weights


class SelectiveKernel(nn.Module):
    """SK convolution ``(B, C_in, H, W) -> (B, C_out, H / stride, W / stride)``.

    Args:
        channels: ``C_in``.  out_channels: ``C_out`` (default ``C_in``).
        kernel_sizes: one kernel size per branch (odd; the paper uses ``(3, 5)``).
        stride: of every branch.  groups: of every branch convolution (the paper's ``G``, 32 in SKNet-50).
        reduction: ``r``.  min_hidden_channels: ``L``; the attention's hidden width is ``max(C_out // r, L)``.
        dilate: realise a k x k kernel as a dilated 3x3 (the paper's choice, fewer parameters).
        act_layer: activation of the branches and of ``z``.  norm_layer: norm of the branches and of ``z``.
        bias: biases of the attention layers ``W`` and ``A``.

    Attention: ``(B, M, C_out)`` branch weights, softmax over the ``M`` branches.
    """

    attention_kind = "channel"  #: what qkv.capture_attention records (over branches)

    def __init__(self, channels: int, out_channels: int | None = None, *, kernel_sizes: Sequence[int] = (3, 5),
                 stride: int = 1, groups: int = 1, reduction: int = 16, min_hidden_channels: int = 32,
                 dilate: bool = True, act_layer: LayerLike = nn.ReLU,
                 norm_layer: type[nn.Module] = nn.BatchNorm2d, bias: bool = False, device=None, dtype=None):
        super().__init__()
        out_channels = channels if out_channels is None else out_channels
        check_positive(channels=channels, out_channels=out_channels, stride=stride, groups=groups,
                       min_hidden_channels=min_hidden_channels)
        kernel_sizes = tuple(kernel_sizes)
        if len(kernel_sizes) < 2:
            raise ValueError(f"selective kernel needs at least two branches, got kernel_sizes={kernel_sizes}")
        for k in kernel_sizes:
            check_positive(kernel_size=k)
            if k % 2 == 0:
                raise ValueError(f"kernel sizes must be odd, got {kernel_sizes}")
        if channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide channels={channels} and out_channels={out_channels}")
        hidden = max(reduced_channels(out_channels, reduction), min_hidden_channels)
        kw = {"device": device, "dtype": dtype}
        self.channels, self.out_channels, self.kernel_sizes = channels, out_channels, kernel_sizes
        self.branches = nn.ModuleList()
        for k in kernel_sizes:
            size, dilation = (3, (k - 1) // 2) if dilate and k > 3 else (k, 1)
            pad = dilation * (size - 1) // 2
            self.branches.append(nn.Sequential(
                nn.Conv2d(channels, out_channels, size, stride, pad, dilation=dilation, groups=groups, bias=False,
                          **kw),
                norm_layer(out_channels, **kw), make_layer(act_layer)))
        self.reduce = nn.Sequential(nn.Conv2d(out_channels, hidden, 1, bias=bias, **kw), norm_layer(hidden, **kw),
                                    make_layer(act_layer))
        self.select = nn.Conv2d(hidden, out_channels * len(kernel_sizes), 1, bias=bias, **kw)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        u = torch.stack([branch(x) for branch in self.branches], dim=1)  # (B, M, C, H, W)
        z = self.reduce(global_avg_pool(u.sum(dim=1)))  # (B, d, 1, 1)
        logits = self.select(z).view(x.shape[0], len(self.branches), self.out_channels)
        out, weights = select_branches(u, logits)
        if hooks.active():
            hooks.report_map("channel", weights)
        return (out, weights) if return_attention else out
