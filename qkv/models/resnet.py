"""ResNet-18/34/50/101 with any :mod:`qkv.vision` block inserted where its paper puts it.

Papers: He, Zhang, Ren and Sun, "Deep Residual Learning for Image Recognition", CVPR 2016,
https://arxiv.org/abs/1512.03385; the placements follow each block's paper:

- ``se``, ``eca``, ``cbam`` (and ``cbam_channel``, ``cbam_spatial``, or a callable ``channels -> module``):
  in every residual block, on the residual branch after its last batch norm, before the addition
  (SENet Fig. 3, ECA-Net Fig. 2, CBAM Fig. 3).
- ``sk``: replaces the 3x3 convolution of every bottleneck (and the first 3x3 of every basic block)
  (SKNet Table 1). SKNet-50 is a ResNeXt-50 (32x4d) with SK units: :func:`sknet50`.
- ``non_local``: after residual blocks, by default the paper's "5 blocks" ResNet-50 setting (3 in res4
  and 2 in res3, every other residual block: block indices 1, 3 of res3 and 1, 3, 5 of res4),
  the same indices for the other depths (Non-local Neural Networks, Sec. 4.1 and Table 2c).
- ``arm``: after the last block of res4 and res5, the two context-path features BiSeNet refines.

What differs from the papers: ResNet-50/101 put the stride of a bottleneck on its 3x3 convolution
("ResNet v1.5", as torchvision and most reimplementations; the paper puts it on the first 1x1 - same
parameter count). Non-local blocks, designed for video, are placed at the corresponding 2-D stages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .. import vision

__all__ = ["ResNet", "BasicBlock", "Bottleneck", "resnet18", "resnet34", "resnet50", "resnet101", "sknet50",
           "create_resnet", "RESNETS", "default_nonlocal_positions"]

#: block type and blocks per stage of each depth (the ResNet paper's Table 1)
RESNETS: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
}

# where each block name goes: inside every residual block, replacing its 3x3 conv, or between blocks
_IN_BLOCK = ("se", "eca", "cbam", "cbam_channel", "cbam_spatial")
_BETWEEN_BLOCKS = ("non_local", "arm")

AttnLike = str | Callable[[int], nn.Module] | None


def default_nonlocal_positions(layers: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """The Non-local paper's 5-block setting: every other block of res3 (at most 2) and res4 (at most 3).

    Keys are stages 1-4 (res2-res5), values block indices after which a non-local block goes.
    """
    return {2: tuple(range(1, layers[1], 2))[:2], 3: tuple(range(1, layers[2], 2))[:3]}


def _call(module: nn.Module, x: Tensor, want: bool) -> tuple[Tensor, object]:
    return module(x, return_attention=True) if want else (module(x), None)


class _ResidualBlock(nn.Module, ABC):
    """What both residual blocks share: the constructor's arguments, the attention block after the last norm of
    the residual branch, the shortcut and the final ReLU. A subclass builds its branch in ``_build_branch``
    and runs it in ``_branch``."""

    expansion: int  #: output channels per ``planes``
    last_norm: str  #: name of the residual branch's last batch norm (zeroed by ``zero_init_residual``)

    def __init__(self, in_channels: int, planes: int, stride: int = 1, *, groups: int = 1, base_width: int = 64,
                 attn: Callable[[int], nn.Module] | None = None, sk: Callable[..., nn.Module] | None = None,
                 device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        out_channels = planes * self.expansion
        self._build_branch(in_channels, planes, stride, groups, base_width, sk, kw)
        self.attn = attn(out_channels) if attn is not None else None
        self.downsample = _shortcut(in_channels, out_channels, stride, **kw)
        self.relu = nn.ReLU(inplace=True)

    @abstractmethod
    def _build_branch(self, in_channels, planes, stride, groups, base_width, sk, kw) -> None:
        """Create the residual branch's layers (before ``attn``, ``downsample`` and ``relu``)."""

    @abstractmethod
    def _branch(self, x: Tensor, maps: dict, return_attention: bool) -> Tensor:
        """The residual branch up to its last norm; an SK unit's attention goes into ``maps["sk"]``."""

    @staticmethod
    def _unit(conv: nn.Module, x: Tensor, maps: dict, return_attention: bool) -> Tensor:
        """The 3x3 convolution or the SK unit that replaces it (with its own norm and activation)."""
        if isinstance(conv, vision.SelectiveKernel):
            out, maps["sk"] = _call(conv, x, return_attention)
            return out
        return conv(x)

    def forward(self, x: Tensor, *, return_attention: bool = False):
        maps = {}
        out = self._branch(x, maps, return_attention)
        if self.attn is not None:
            out, maps["attn"] = _call(self.attn, out, return_attention)
        out = self.relu(out + (x if self.downsample is None else self.downsample(x)))
        return (out, maps) if return_attention else out


class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions and a shortcut; ``attn`` after the second norm, ``sk`` replaces the first conv."""

    expansion = 1
    last_norm = "bn2"

    def _build_branch(self, in_channels, planes, stride, groups, base_width, sk, kw) -> None:
        if groups != 1 or base_width != 64:
            raise ValueError("BasicBlock supports only groups=1 and width_per_group=64 (as in the ResNet paper)")
        if sk is not None:
            self.conv1 = sk(in_channels, planes, stride=stride, groups=1)
            self.bn1, self.relu1 = nn.Identity(), nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, planes, 3, stride, 1, bias=False, **kw)
            self.bn1, self.relu1 = nn.BatchNorm2d(planes, **kw), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False, **kw)
        self.bn2 = nn.BatchNorm2d(planes, **kw)

    def _branch(self, x, maps, return_attention):
        out = self.relu1(self.bn1(self._unit(self.conv1, x, maps, return_attention)))
        return self.bn2(self.conv2(out))


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (or SK), 1x1 expand (x4), and a shortcut; ``attn`` after the last norm."""

    expansion = 4
    last_norm = "bn3"

    def _build_branch(self, in_channels, planes, stride, groups, base_width, sk, kw) -> None:
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False, **kw)
        self.bn1 = nn.BatchNorm2d(width, **kw)
        if sk is not None:
            self.conv2 = sk(width, width, stride=stride, groups=groups)
            self.bn2, self.relu2 = nn.Identity(), nn.Identity()
        else:
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False, **kw)
            self.bn2, self.relu2 = nn.BatchNorm2d(width, **kw), nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False, **kw)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion, **kw)

    def _branch(self, x, maps, return_attention):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self._unit(self.conv2, out, maps, return_attention)))
        return self.bn3(self.conv3(out))


def _shortcut(in_channels: int, out_channels: int, stride: int, **kw) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False, **kw),
                         nn.BatchNorm2d(out_channels, **kw))


class ResNet(nn.Module):
    """ResNet with optional attention.

    Args:
        block: ``"basic"`` or ``"bottleneck"``.  layers: blocks per stage (4 stages).
        num_classes: outputs of the classifier.  in_channels: image channels.
        attn: a :mod:`qkv.vision` name (see the module docstring for where each goes), a callable
            ``channels -> nn.Module`` inserted in every residual block, or ``None``.
        attn_kwargs: keyword arguments for every attention block (e.g. ``{"reduction": 8}``).
        attn_positions: for ``non_local`` and ``arm``: ``{stage (1-4): block indices}`` after which a block
            goes (negative indices count from the end); defaults as in their papers.
        groups, width_per_group: ResNeXt widths of the bottleneck's 3x3 convolution (``32, 4`` for ResNeXt-50).
        zero_init_residual: start every residual branch at zero (its last norm's scale is 0).
        stem: ``"imagenet"`` (a 7x7 stride-2 convolution and a 3x3 stride-2 max-pool: features at 1/32 of the
            input) or ``"cifar"`` (one 3x3 stride-1 convolution and no max-pool, as He et al.'s CIFAR-10 networks:
            features at 1/8, for small images).

    ``forward(x, return_attention=True)`` returns ``(logits, maps)`` where ``maps`` maps a module path
    (e.g. ``"layer1.0.attn"``, ``"layer3.2"``) to that block's attention.
    """

    def __init__(self, block: str, layers: Sequence[int], *, num_classes: int = 1000, in_channels: int = 3,
                 attn: AttnLike = None, attn_kwargs: Mapping | None = None,
                 attn_positions: Mapping[int, Sequence[int]] | None = None, groups: int = 1,
                 width_per_group: int = 64, zero_init_residual: bool = False, stem: str = "imagenet", device=None,
                 dtype=None):
        super().__init__()
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        if block not in ("basic", "bottleneck"):
            raise ValueError(f"block must be 'basic' or 'bottleneck', got {block!r}")
        layers = tuple(layers)
        if len(layers) != 4 or any(not isinstance(n, int) or n < 1 for n in layers):
            raise ValueError(f"layers must be 4 positive block counts, got {layers}")
        kw = {"device": device, "dtype": dtype}
        block_cls = BasicBlock if block == "basic" else Bottleneck
        attn_kwargs = dict(attn_kwargs or {})
        in_block, sk, between, positions = self._placement(attn, attn_kwargs, attn_positions, layers, kw)
        self.attn_name = attn if isinstance(attn, str) or attn is None else getattr(attn, "__name__", "custom")

        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False, **kw)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False, **kw)
        self.bn1 = nn.BatchNorm2d(64, **kw)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if stem == "imagenet" else nn.Identity()
        channels = 64
        for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), layers, strict=True), start=1):
            blocks: list[tuple[str, nn.Module]] = []
            for i in range(count):
                stride = 2 if stage > 1 and i == 0 else 1
                blocks.append((str(len(blocks)), block_cls(channels, planes, stride, groups=groups,
                                                           base_width=width_per_group, attn=in_block, sk=sk, **kw)))
                channels = planes * block_cls.expansion
                if i in positions.get(stage, ()):
                    blocks.append((str(len(blocks)), between(channels)))
            self.add_module(f"layer{stage}", nn.Sequential(OrderedDict(blocks)))
        self.num_features = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes, **kw)
        self._init_weights(zero_init_residual)

    @staticmethod
    def _placement(attn, attn_kwargs, attn_positions, layers, kw):
        """Resolve ``attn`` into (in-block factory, SK factory, between-block factory, positions)."""
        if attn is None:
            if attn_kwargs or attn_positions:
                raise ValueError("attn_kwargs and attn_positions need an attn block")
            return None, None, None, {}
        if callable(attn) and not isinstance(attn, str):
            if attn_positions:
                raise ValueError("attn_positions is only for 'non_local' and 'arm'")
            return (lambda c: attn(c, **attn_kwargs)), None, None, {}
        name = vision.canonical_name(attn)
        if name in _IN_BLOCK or name == "sk":
            if attn_positions:
                raise ValueError(f"attn_positions is only for 'non_local' and 'arm', not {name!r}")
            if name == "sk":
                def sk(cin, cout, *, stride, groups):
                    return vision.SelectiveKernel(cin, cout, stride=stride, groups=groups, **attn_kwargs, **kw)
                return None, sk, None, {}
            return (lambda c: vision.create(name, c, **attn_kwargs, **kw)), None, None, {}
        if name in _BETWEEN_BLOCKS:
            if attn_positions is None:
                attn_positions = default_nonlocal_positions(layers) if name == "non_local" else {3: (-1,), 4: (-1,)}
            positions = {}
            for stage, idx in attn_positions.items():
                if stage not in (1, 2, 3, 4):
                    raise ValueError(f"attn_positions stages are 1-4 (res2-res5), got {stage}")
                n = layers[stage - 1]
                bad = [i for i in idx if not -n <= i < n]
                if bad:
                    raise ValueError(f"attn_positions[{stage}] has block indices {bad} outside stage {stage}'s "
                                     f"{n} blocks")
                positions[stage] = tuple(sorted({i % n for i in idx}))
            return None, None, (lambda c: vision.create(name, c, **attn_kwargs, **kw)), positions
        raise ValueError(f"vision block {name!r} has no place in a ResNet classifier (BiSeNet's FFM fuses two "
                         f"paths); use one of {list(_IN_BLOCK) + ['sk'] + list(_BETWEEN_BLOCKS)}")

    def _init_weights(self, zero_init_residual: bool) -> None:
        # He init for the ResNet's own convolutions; attention blocks keep their own initialisation
        owned = {id(m) for b in self.modules() if isinstance(b, tuple(vision.BLOCKS.values())) for m in b.modules()}
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and id(m) not in owned:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, _ResidualBlock):
                    nn.init.zeros_(getattr(m, m.last_norm).weight)

    def forward_features(self, x: Tensor, *, return_attention: bool = False):
        """``(B, C_in, H, W) -> (B, num_features, H/32, W/32)`` (``H/8, W/8`` with the CIFAR stem), and the maps."""
        maps: dict[str, object] = {}
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            for name, module in getattr(self, f"layer{stage}").named_children():
                if not return_attention:
                    x = module(x)
                    continue
                x, m = module(x, return_attention=True)
                prefix = f"layer{stage}.{name}"
                if isinstance(m, dict):
                    maps.update({f"{prefix}.{k}": v for k, v in m.items()})
                else:
                    maps[prefix] = m
        return (x, maps) if return_attention else x

    def forward(self, x: Tensor, *, return_attention: bool = False):
        """``(B, C_in, H, W) -> logits (B, num_classes)``; with ``return_attention``, ``(logits, maps)``."""
        feats = self.forward_features(x, return_attention=return_attention)
        feats, maps = feats if return_attention else (feats, None)
        logits = self.fc(torch.flatten(self.avgpool(feats), 1))
        return (logits, maps) if return_attention else logits


def create_resnet(name: str, *, num_classes: int = 1000, in_channels: int = 3, attn: AttnLike = None,
                  attn_kwargs: Mapping | None = None, stem: str = "imagenet", **kwargs) -> ResNet:
    """Build ``resnet18``, ``resnet34``, ``resnet50`` or ``resnet101``.

    ``num_classes``, ``in_channels``, ``attn``, ``attn_kwargs``, ``stem`` and the other ``kwargs``
    (``attn_positions``, ``groups``, ``width_per_group``, ``zero_init_residual``, ``device``, ``dtype``) are
    :class:`ResNet`'s.
    """
    if name not in RESNETS:
        raise ValueError(f"unknown ResNet {name!r}; expected one of {sorted(RESNETS)}")
    block, layers = RESNETS[name]
    return ResNet(block, layers, num_classes=num_classes, in_channels=in_channels, attn=attn, attn_kwargs=attn_kwargs,
                  stem=stem, **kwargs)


def _depth(name: str, summary: str) -> Callable[..., ResNet]:
    """The builder of one depth: ``name(**kwargs)`` is ``create_resnet(name, **kwargs)``."""

    def build(**kwargs) -> ResNet:
        return create_resnet(name, **kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"{summary} Keyword arguments as :func:`create_resnet` (``num_classes``, ``in_channels``, "
                     "``attn``, ``attn_kwargs``, ``stem``, ...).")
    return build


resnet18 = _depth("resnet18", "ResNet-18 (11.69M parameters with 1000 classes).")
resnet34 = _depth("resnet34", "ResNet-34 (21.80M parameters with 1000 classes).")
resnet50 = _depth("resnet50", "ResNet-50 (25.56M parameters with 1000 classes; SE-ResNet-50 28.09M).")
resnet101 = _depth("resnet101", "ResNet-101 (44.55M parameters with 1000 classes).")


def sknet50(**kwargs) -> ResNet:
    """SKNet-50: ResNeXt-50 (32x4d) with SK units, ``M = 2``, ``G = 32``, ``r = 16``, ``L = 32`` (27.5M).

    Keyword arguments as :func:`create_resnet` (``num_classes``, ``in_channels``, ``attn_kwargs``, ``stem``, ...).
    """
    kwargs = {"groups": 32, "width_per_group": 4, **kwargs}
    return create_resnet("resnet50", attn="sk", **kwargs)
