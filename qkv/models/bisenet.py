"""BiSeNet V1 for semantic segmentation, its ablations, and a plain FCN baseline on the same backbone.

Paper: Yu, Wang, Peng, Gao, Yu and Sang, "BiSeNet: Bilateral Segmentation Network for Real-time Semantic
Segmentation", ECCV 2018, https://arxiv.org/abs/1808.00897 (Figure 2); FCN: Long, Shelhamer and Darrell, "Fully
Convolutional Networks for Semantic Segmentation", CVPR 2015, https://arxiv.org/abs/1411.4038.

    spatial path:  three stride-2 conv-BN-ReLU                               -> 1/8, detail
    context path:  ResNet-18-style backbone (qkv.models.resnet.BasicBlock)  -> 1/16, 1/32
                   global pooling of the 1/32 features, added to ARM(1/32); upsampled, added to ARM(1/16)
    fusion:        FFM([spatial; context at 1/8])  (qkv.vision.FeatureFusion)
    heads:         conv-BN-ReLU + 1x1 to classes, upsampled (bilinear) to the input; in training two auxiliary
                   heads on the context path's 1/8 and 1/16 outputs add their losses

Ablations (each removes its block: no module, no parameter): ``arm=False`` (the context features go on unrefined),
``ffm=False`` (the two paths concatenated, straight into the head), ``spatial=False`` (context path only: the head
on the context path's 1/8 output, no spatial path and no fusion). :class:`FCN` is FCN-8s on the same backbone:
class scores from 1/32, 1/16 and 1/8 (each through a conv-BN-ReLU), summed from the coarsest up.

What differs from the paper: every width is an argument (``widths``, ``spatial_widths``, ``dim``), so that a tiny
network trains in seconds; as in the authors' released code, each ARM follows a 3x3 conv-BN-ReLU that brings the
backbone's channels to ``dim``, and the context path's sums pass a 3x3 conv-BN-ReLU after each upsampling; the
spatial path's kernels are 3x3; ``padding="circular"`` (wrap-around padding, as the captioning CNN has on scenes)
is an option. Any input size works: features are upsampled to the size of the level they join,
and the logits to the input's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..vision import AttentionRefinement, FeatureFusion
from .resnet import BasicBlock

__all__ = ["BiSeNet", "FCN", "ResNetBackbone", "ConvBNReLU", "SegmentationHead", "SEGMENTATION_MODELS", "PADDINGS"]


def _ints(name: str, values: Sequence[int], n: int) -> tuple[int, ...]:
    values = tuple(values)
    if len(values) != n or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"{name} must be {n} positive integers, got {values}")
    return values


def _resize(x: Tensor, size) -> Tensor:
    # sizes compared only where that needs no guard: traced with symbolic sizes (torch.export) a comparison would
    # pin them, and bilinear interpolation to the same size gives x itself
    same = all(statically_known_true(a == b) for a, b in zip(x.shape[-2:], size, strict=True))
    return x if same else F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class ConvBNReLU(nn.Sequential):
    """``relu(BN(conv_k(x)))`` with padding ``k // 2``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1):
        super().__init__(nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))


class SegmentationHead(nn.Module):
    """A 3x3 conv-BN-ReLU and a 1x1 convolution to class scores, upsampled to ``size``: ``(B, C, h, w) ->
    (B, num_classes, *size)``."""

    def __init__(self, in_channels: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv = ConvBNReLU(in_channels, hidden, 3)
        self.classify = nn.Conv2d(hidden, num_classes, 1)

    def forward(self, x: Tensor, size) -> Tensor:
        return _resize(self.classify(self.conv(x)), size)


class ResNetBackbone(nn.Module):
    """A ResNet-18-style feature extractor with any widths: a 7x7 stride-2 stem and a 3x3 stride-2 max-pool (1/4),
    then four stages of :class:`~qkv.models.resnet.BasicBlock` (``blocks`` per stage, ``widths`` channels), the
    last three starting with stride 2. ``forward`` returns the features at 1/8, 1/16 and 1/32."""

    def __init__(self, in_channels: int = 3, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2)):
        super().__init__()
        widths, blocks = _ints("widths", widths, 4), _ints("blocks", blocks, 4)
        self.widths = widths
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        channels = widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks, strict=True), start=1):
            layers = []
            for i in range(count):
                layers.append(BasicBlock(channels, width, 2 if stage > 1 and i == 0 else 1))
                channels = width
            self.add_module(f"layer{stage}", nn.Sequential(*layers))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        f4 = self.layer1(self.stem(x))
        f8 = self.layer2(f4)
        f16 = self.layer3(f8)
        return f8, f16, self.layer4(f16)


PADDINGS = ("zeros", "circular")


def _set_padding(model: nn.Module, padding: str) -> None:
    """``circular``: every padded convolution wraps around, and the stem's max-pool too (its own circular pad),
    so that shifting the input by a multiple of 32 pixels (the backbone's stride) shifts every feature map alike:
    no feature can tell where on the canvas it is."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
    if padding == "zeros":
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and any(m.padding):
            m.padding_mode = "circular"
        elif isinstance(m, ResNetBackbone):
            m.stem[3] = nn.Sequential(nn.CircularPad2d(1), nn.MaxPool2d(3, 2, 0))


def _init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class BiSeNet(nn.Module):
    """BiSeNet V1 (see the module docstring).

    Args:
        num_classes: ``K``.  in_channels: of the images.  widths, blocks: the backbone's (:class:`ResNetBackbone`).
        spatial_widths: the spatial path's three convolutions.  dim: the context path's channels.
        fuse_dim: the FFM's output channels (default: spatial + context channels).  head_dim: the heads' hidden
        channels.  arm, ffm, spatial: keep the ARMs, the FFM, the spatial path (``spatial=False`` needs
        ``ffm=True``, which then means nothing).  aux: the two auxiliary heads.  padding: ``zeros`` or
        ``circular`` (every convolution's, see :data:`PADDINGS`).

    Shapes: ``x (B, C_in, H, W) -> logits (B, K, H, W)`` for any ``H, W``. ``return_aux=True`` adds the auxiliary
    heads' logits (a list, ``(B, K, H, W)`` each; empty without them); ``return_attention=True`` adds
    ``{"arm16": (B, dim, 1, 1), "arm32": ..., "ffm": (B, fuse_dim, 1, 1)}`` (the blocks that exist), in that
    order: ``(logits, aux, maps)``.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, *, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2), spatial_widths: Sequence[int] = (64, 64, 128), dim: int = 128,
                 fuse_dim: int | None = None, head_dim: int = 64, arm: bool = True, ffm: bool = True,
                 spatial: bool = True, aux: bool = True, padding: str = "zeros"):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer of at least 2, got {num_classes!r}")
        if not spatial and not ffm:
            raise ValueError("ffm=False (concatenate the two paths) needs the spatial path (spatial=True)")
        spatial_widths = _ints("spatial_widths", spatial_widths, 3)
        self.num_classes, self.dim = num_classes, dim
        self.backbone = ResNetBackbone(in_channels, widths, blocks)
        c8, c16, c32 = self.backbone.widths[1:]
        # context path: global pooling, the two refinements, the convolutions after each upsampling
        self.global_context = ConvBNReLU(c32, dim, 1)
        self.refine32, self.refine16 = ConvBNReLU(c32, dim, 3), ConvBNReLU(c16, dim, 3)
        self.arm32 = AttentionRefinement(dim) if arm else None
        self.arm16 = AttentionRefinement(dim) if arm else None
        self.up32, self.up16 = ConvBNReLU(dim, dim, 3), ConvBNReLU(dim, dim, 3)
        if spatial:
            layers, channels = [], in_channels
            for width in spatial_widths:
                layers.append(ConvBNReLU(channels, width, 3, stride=2))
                channels = width
            self.spatial_path = nn.Sequential(*layers)
            joined = spatial_widths[-1] + dim
            fuse_dim = joined if fuse_dim is None else fuse_dim
            self.ffm = FeatureFusion(joined, fuse_dim) if ffm else None
            head_in = fuse_dim if ffm else joined
        else:
            self.spatial_path, self.ffm, head_in = None, None, dim
        self.head = SegmentationHead(head_in, head_dim, num_classes)
        self.aux8 = SegmentationHead(dim, head_dim, num_classes) if aux else None
        self.aux16 = SegmentationHead(dim, head_dim, num_classes) if aux else None
        _set_padding(self, padding)
        _init(self)

    def _refine(self, x: Tensor, conv: nn.Module, arm: nn.Module | None, maps: dict, name: str) -> Tensor:
        x = conv(x)
        if arm is None:
            return x
        x, maps[name] = arm(x, return_attention=True)
        return x

    def context_path(self, x: Tensor, maps: dict | None = None) -> tuple[Tensor, Tensor]:
        """The context path's outputs at 1/8 and 1/16 (``(B, dim, ...)``); the ARMs' weights into ``maps``."""
        maps = {} if maps is None else maps
        f8, f16, f32 = self.backbone(x)
        pooled = self.global_context(f32.mean(dim=(2, 3), keepdim=True))
        r32 = self._refine(f32, self.refine32, self.arm32, maps, "arm32") + pooled
        c16 = self.up32(_resize(r32, f16.shape[-2:]))
        r16 = self._refine(f16, self.refine16, self.arm16, maps, "arm16") + c16
        c8 = self.up16(_resize(r16, f8.shape[-2:]))
        return c8, c16

    def forward(self, x: Tensor, *, return_aux: bool = False, return_attention: bool = False):
        if x.dim() != 4:
            raise ValueError(f"BiSeNet expects images (B, C, H, W), got {tuple(x.shape)}")
        size = x.shape[-2:]
        maps: dict[str, Tensor] = {}
        c8, c16 = self.context_path(x, maps)
        if self.spatial_path is None:
            features = c8
        else:
            s = self.spatial_path(x)
            c8 = _resize(c8, s.shape[-2:])
            if self.ffm is not None:
                features, maps["ffm"] = self.ffm(s, c8, return_attention=True)
            else:
                features = torch.cat([s, c8], dim=1)
        logits = self.head(features, size)
        out: list = [logits]
        if return_aux:
            out.append([h(f, size) for h, f in ((self.aux8, c8), (self.aux16, c16)) if h is not None])
        if return_attention:
            out.append({k: maps[k] for k in ("arm16", "arm32", "ffm") if k in maps})
        return out[0] if len(out) == 1 else tuple(out)


class FCN(nn.Module):
    """FCN-8s on :class:`ResNetBackbone`: class scores at 1/32, 1/16 and 1/8 (each a conv-BN-ReLU of ``head_dim``
    channels and a 1x1 convolution), the coarser upsampled and added to the finer, then to the input's size.
    ``x (B, C_in, H, W) -> (B, K, H, W)``; ``return_aux`` / ``return_attention`` add an empty list / dict (it has
    neither)."""

    def __init__(self, num_classes: int, in_channels: int = 3, *, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2), head_dim: int = 128, padding: str = "zeros"):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer of at least 2, got {num_classes!r}")
        self.num_classes = num_classes
        self.backbone = ResNetBackbone(in_channels, widths, blocks)
        c8, c16, c32 = self.backbone.widths[1:]
        self.score32, self.score16, self.score8 = (SegmentationHead(c, head_dim, num_classes) for c in (c32, c16, c8))
        _set_padding(self, padding)
        _init(self)

    def forward(self, x: Tensor, *, return_aux: bool = False, return_attention: bool = False):
        if x.dim() != 4:
            raise ValueError(f"FCN expects images (B, C, H, W), got {tuple(x.shape)}")
        f8, f16, f32 = self.backbone(x)
        s16 = self.score32(f32, f16.shape[-2:]) + self.score16(f16, f16.shape[-2:])
        s8 = _resize(s16, f8.shape[-2:]) + self.score8(f8, f8.shape[-2:])
        logits = _resize(s8, x.shape[-2:])
        out: list = [logits] + ([[]] if return_aux else []) + ([{}] if return_attention else [])
        return out[0] if len(out) == 1 else tuple(out)


#: the registry's names of the segmentation models
SEGMENTATION_MODELS = {"bisenet": BiSeNet, "fcn": FCN}
