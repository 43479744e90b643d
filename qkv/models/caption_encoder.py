"""The captioners' image encoder: a small conv stack from images to a grid of annotation vectors, and the grid's
coordinates. Part of :mod:`qkv.models.captioning` (which re-exports both)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["GridEncoder", "grid_coords", "PADDINGS"]


def grid_coords(h: int, w: int, *, device=None, dtype=None) -> Tensor:
    """``(h * w, 2)``: the ``(y, x)`` of each grid position in [-1, 1], row-major (the order of ``L``)."""
    ys = torch.linspace(-1, 1, h, device=device, dtype=dtype) if h > 1 else torch.zeros(1, device=device, dtype=dtype)
    xs = torch.linspace(-1, 1, w, device=device, dtype=dtype) if w > 1 else torch.zeros(1, device=device, dtype=dtype)
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), -1).reshape(h * w, 2)


PADDINGS = ("zeros", "circular", "replicate", "reflect")


def _conv(cin: int, cout: int, padding: str = "zeros") -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False, padding_mode=padding), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class GridEncoder(nn.Module):
    """``(B, C, H, W) -> a (B, L, D)``: a 3x3 conv (+BN+ReLU) per width, a 2x2 max-pool after each of the first
    three (stride 8, so ``L = (H/8) * (W/8)``), one more conv at the last width; ``D = widths[-1]``.

    Args:
        in_channels: image channels.  widths: channels of the stages (at least 4).  coords: append the
            pixels' ``y, x`` in [-1, 1] as two input channels.  padding: the convolutions' padding mode
            (``zeros``, ``circular``, ``replicate``, ``reflect``); ``circular`` makes the stack exactly
            equivariant to circular shifts by multiples of 8 pixels (no border tells a cell from another).
    """

    def __init__(self, in_channels: int = 1, widths: Sequence[int] = (16, 32, 64, 128), *, coords: bool = True,
                 padding: str = "zeros"):
        super().__init__()
        widths = tuple(widths)
        if len(widths) < 4 or any(w < 1 for w in widths) or in_channels < 1:
            raise ValueError(f"widths must be at least 4 positive channel counts and in_channels positive, got "
                             f"{widths} and {in_channels}")
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
        self.coords, self.padding = coords, padding
        layers: list[nn.Module] = []
        cin = in_channels + (2 if coords else 0)
        for i, w in enumerate(widths):
            layers.append(_conv(cin, w, padding))
            if i < 3:
                layers.append(nn.MaxPool2d(2))
            cin = w
        layers.append(_conv(cin, cin, padding))
        self.net = nn.Sequential(*layers)
        self.dim = cin

    def forward(self, images: Tensor, *, with_local: bool = False, with_items: bool = False, with_mid: bool = False):
        """``images (B, C, H, W)`` -> ``(a (B, L, D), (h, w))``, then with ``with_local`` the second stage's
        features averaged onto the grid, ``(B, L, widths[1])``: what each grid position holds itself (they see
        14 pixels), with ``with_items`` the third stage's features pooled onto the grid, ``(B, L, widths[2])``
        (they see 22 pixels, less than an item of the scenes; the grid features ``a`` see 54), and with
        ``with_mid`` the first convolution after them, ``(B, L, widths[3])`` (38 pixels: about an item)."""
        x = images
        if self.coords:
            b, _, hh, ww = x.shape
            ys = torch.linspace(-1, 1, hh, device=x.device, dtype=x.dtype)[:, None].expand(hh, ww)
            xs = torch.linspace(-1, 1, ww, device=x.device, dtype=x.dtype)[None, :].expand(hh, ww)
            x = torch.cat([x, torch.stack([ys, xs]).expand(b, 2, hh, ww)], dim=1)
        local = self.net[:4](x)  # conv, pool, conv, pool: stride 4
        items = self.net[4:6](local)  # conv, pool: stride 8, the grid
        mid = self.net[6](items)
        f = self.net[7:](mid)
        grid = (f.shape[-2], f.shape[-1])
        out = [f.flatten(2).transpose(1, 2), grid]
        if with_local:
            out.append(torch.nn.functional.adaptive_avg_pool2d(local, grid).flatten(2).transpose(1, 2))
        if with_items:
            out.append(items.flatten(2).transpose(1, 2))
        if with_mid:
            out.append(mid.flatten(2).transpose(1, 2))
        return tuple(out)
