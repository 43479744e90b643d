"""Helpers shared by the vision blocks: layer lookup, reduced widths, input checks, global pooling."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

LayerLike = str | type[nn.Module] | Callable[[], nn.Module]

#: activation and gate layers by name, so that configs and the CLI can name them
LAYERS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "hard_sigmoid": nn.Hardsigmoid,
    "identity": nn.Identity,
}


def make_layer(layer: LayerLike) -> nn.Module:
    """Build an activation or gate: a name from :data:`LAYERS`, a module class or a factory."""
    if isinstance(layer, str):
        if layer not in LAYERS:
            raise ValueError(f"unknown layer {layer!r}; expected one of {sorted(LAYERS)}, a module class or a factory")
        return LAYERS[layer]()
    if callable(layer):
        module = layer()
        if not isinstance(module, nn.Module):
            raise ValueError(f"layer factory {layer!r} must return an nn.Module, got {type(module).__name__}")
        return module
    raise ValueError(f"layer must be a name, a module class or a factory, got {type(layer).__name__}")


def check_positive(**sizes: int) -> None:
    """Raise ``ValueError`` unless every given size is a positive int."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def reduced_channels(channels: int, reduction: int, *, min_channels: int = 1) -> int:
    """``max(channels // reduction, min_channels)``, the hidden width of a squeeze-excite style MLP.

    Raises ``ValueError`` when ``reduction`` is not in ``[1, channels]``.
    """
    check_positive(channels=channels, reduction=reduction)
    if reduction > channels:
        raise ValueError(f"reduction={reduction} is larger than channels={channels}: the hidden layer would have "
                         f"no units; use a reduction between 1 and {channels}")
    return max(channels // reduction, min_channels)


def check_input(x: Tensor, channels: int, block: str) -> None:
    """Raise ``ValueError`` naming the shape unless ``x`` is ``(B, channels, H, W)``."""
    if x.dim() != 4 or x.shape[1] != channels:
        raise ValueError(f"{block} built for {channels} channels expects input (B, {channels}, H, W), "
                         f"got {tuple(x.shape)}")


def global_avg_pool(x: Tensor) -> Tensor:
    """``(B, C, H, W) -> (B, C, 1, 1)``: the mean of each feature map (the "squeeze")."""
    return x.mean(dim=(2, 3), keepdim=True)


def global_max_pool(x: Tensor) -> Tensor:
    """``(B, C, H, W) -> (B, C, 1, 1)``: the maximum of each feature map."""
    return x.amax(dim=(2, 3), keepdim=True)
