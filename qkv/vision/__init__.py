"""Channel and spatial attention blocks for images, channels first ``(B, C, H, W)``.

Every block takes the channel count first and shares one argument vocabulary (``reduction``, ``act_layer``,
``gate_layer``, ``bias``, ``device``, ``dtype``); ``forward(x, return_attention=True)`` also returns its
attention map from the same pass. :func:`create` builds any of them by name::

    block = qkv.vision.create("cbam", 64, reduction=8)
    out, maps = block(x, return_attention=True)   # maps.channel (B, 64, 1, 1), maps.spatial (B, 1, H, W)

=================  ===========================================  ==================================
name               block                                        attention map
=================  ===========================================  ==================================
``se``             :class:`SqueezeExcite`                       ``(B, C, 1, 1)`` in [0, 1]
``eca``            :class:`ECA`                                 ``(B, C, 1, 1)`` in [0, 1]
``cbam``           :class:`CBAM`                                ``(channel, spatial)``
``cbam_channel``   :class:`ChannelAttention`                    ``(B, C, 1, 1)`` in [0, 1]
``cbam_spatial``   :class:`SpatialAttention`                    ``(B, 1, H, W)`` in [0, 1]
``sk``             :class:`SelectiveKernel`                     ``(B, M, C)``, sums to 1 over M
``non_local``      :class:`NonLocal` (``mode=...``)             ``(B, HW, HW')``
``arm``            :class:`AttentionRefinement` (BiSeNet)       ``(B, C, 1, 1)`` in [0, 1]
``ffm``            :class:`FeatureFusion` (BiSeNet)             ``(B, C, 1, 1)`` in [0, 1]
=================  ===========================================  ==================================
"""

from __future__ import annotations

from torch import nn

from .bisenet import AttentionRefinement, FeatureFusion
from .cbam import CBAM, CBAMAttention, ChannelAttention, SpatialAttention
from .eca import ECA, eca_kernel_size
from .non_local import NonLocal
from .selective_kernel import SelectiveKernel
from .squeeze_excite import SqueezeExcite

__all__ = [
    "BLOCKS",
    "create",
    "list_blocks",
    "SqueezeExcite",
    "ECA",
    "eca_kernel_size",
    "CBAM",
    "CBAMAttention",
    "ChannelAttention",
    "SpatialAttention",
    "SelectiveKernel",
    "NonLocal",
    "AttentionRefinement",
    "FeatureFusion",
]

#: every block by its factory name
BLOCKS: dict[str, type[nn.Module]] = {
    "se": SqueezeExcite,
    "eca": ECA,
    "cbam": CBAM,
    "cbam_channel": ChannelAttention,
    "cbam_spatial": SpatialAttention,
    "sk": SelectiveKernel,
    "non_local": NonLocal,
    "arm": AttentionRefinement,
    "ffm": FeatureFusion,
}

_ALIASES = {
    "squeeze_excite": "se",
    "selective_kernel": "sk",
    "nonlocal": "non_local",
    "attention_refinement": "arm",
    "feature_fusion": "ffm",
}


def canonical_name(name: str) -> str:
    """The factory name of ``name`` (case, ``-`` and aliases such as ``non-local`` are accepted)."""
    if not isinstance(name, str):
        raise ValueError(f"block name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in BLOCKS:
        raise ValueError(f"unknown vision block {name!r}; expected one of {list_blocks()}")
    return key


def list_blocks() -> list[str]:
    """The factory names, in the order of :data:`BLOCKS`."""
    return list(BLOCKS)


def create(name: str, channels: int, **kwargs) -> nn.Module:
    """Build the block ``name`` for ``channels`` input channels; ``kwargs`` go to its constructor.

    Raises ``ValueError`` for an unknown name or an argument the block does not take.
    """
    cls = BLOCKS[canonical_name(name)]
    try:
        return cls(channels, **kwargs)
    except TypeError as e:
        raise ValueError(f"{cls.__name__} ({name!r}) does not take these arguments {sorted(kwargs)}: {e}") from None
