"""Non-local block: every position attends to every (sub-sampled) position, through the core ``attention``.

Paper: Wang, Girshick, Gupta and He, "Non-local Neural Networks", CVPR 2018, https://arxiv.org/abs/1711.07971.

    y_i = 1 / C(x) * sum_j f(x_i, x_j) g(x_j)       g(x) = W_g x (1x1 conv to C' = C / 2)
    z_i = BN(W_z y_i) + x_i                         BN's scale starts at zero: the block starts as identity

    mode                 f(x_i, x_j)                        normalisation
    embedded_gaussian    exp(theta(x_i)^T phi(x_j))         softmax over j     (the default)
    gaussian             exp(x_i^T x_j)                     softmax over j
    dot                  theta(x_i)^T phi(x_j)              1 / N
    concat               relu(w^T [theta(x_i); phi(x_j)])   1 / N

Queries are ``theta(x)`` flattened to ``(B, HW, C')``, keys ``phi(x)`` and values ``g(x)`` to ``(B, HW', C')``;
:func:`qkv.attention` computes ``y`` (SDPA for the softmax modes, the tiled pairwise path for ``concat``).

What differs from the paper: the paper's experiments are on video (space-time positions); here positions
are ``H x W``. ``subsample=True`` max-pools ``phi(x)`` and ``g(x)`` by 2x2 after the 1x1 convolutions, as the
paper's text says (its released code pools ``x`` before them); ``N`` is then the number of keys ``HW'``.
The concatenation score has no bias (the paper's ``w^T [.;.]``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import attention
from ..scores import PairwiseScore
from ._common import check_input, check_positive, reduced_channels

__all__ = ["NonLocal", "NonLocalConcatScore", "divide_by_count", "MODES"]

MODES = ("embedded_gaussian", "gaussian", "dot", "concat")
_ALIASES = {"dot_product": "dot", "concatenation": "concat", "embedded": "embedded_gaussian"}


def divide_by_count(scores: Tensor) -> Tensor:
    """The dot-product and concatenation versions' normalisation: divide by the number of keys ``N``."""
    return scores / scores.shape[-1]


class NonLocalConcatScore(PairwiseScore):
    """``f(q, k) = relu(w_q^T q + w_k^T k)``: the paper's ``relu(w^T [theta_i; phi_j])``, pair by pair."""

    def __init__(self, dim: int, *, device=None, dtype=None):
        super().__init__(dim, dim, 1, bias=False, device=device, dtype=dtype)

    def pair(self, hidden: Tensor) -> Tensor:
        return F.relu(hidden.squeeze(-1))


class NonLocal(nn.Module):
    """Non-local block ``(B, C, H, W) -> (B, C, H, W)`` with a residual connection.

    Args:
        channels: ``C``.
        reduction: the embeddings have ``C' = C // reduction`` channels (the paper halves: 2).
        mode: ``embedded_gaussian``, ``gaussian``, ``dot`` or ``concat`` (see the module docstring).
        subsample: max-pool the keys and values 2x2 (``HW' = HW / 4``).
        norm_layer: after ``W_z`` (``None``: no norm).  zero_init: start as the identity (the norm's scale,
            or ``W_z`` when there is no norm, is zero).
        bias: biases of the 1x1 convolutions.

    Attention: ``(B, HW, HW')``, row ``i`` over the keys ``j`` (positions flattened row-major).
    """

    attention_kind = "self"  #: attention between the positions of one feature map

    def __init__(self, channels: int, reduction: int = 2, *, mode: str = "embedded_gaussian",
                 subsample: bool = False, norm_layer: type[nn.Module] | None = nn.BatchNorm2d,
                 zero_init: bool = True, bias: bool = True, device=None, dtype=None):
        super().__init__()
        mode = _ALIASES.get(mode, mode)
        if mode not in MODES:
            raise ValueError(f"unknown non-local mode {mode!r}; expected one of {list(MODES)} "
                             f"(or aliases {sorted(_ALIASES)})")
        inner = reduced_channels(channels, reduction)
        check_positive(channels=channels)
        kw = {"device": device, "dtype": dtype}
        self.channels, self.inner_channels, self.mode, self.subsample = channels, inner, mode, subsample
        if mode != "gaussian":
            self.theta = nn.Conv2d(channels, inner, 1, bias=bias, **kw)
            self.phi = nn.Conv2d(channels, inner, 1, bias=bias, **kw)
        self.g = nn.Conv2d(channels, inner, 1, bias=bias, **kw)
        self.out = nn.Conv2d(inner, channels, 1, bias=bias, **kw)
        self.norm = norm_layer(channels, **kw) if norm_layer is not None else nn.Identity()
        self.score = NonLocalConcatScore(inner, **kw) if mode == "concat" else "dot"
        self.normalize = "softmax" if mode in ("embedded_gaussian", "gaussian") else divide_by_count
        if zero_init:
            last = self.norm if norm_layer is not None and getattr(self.norm, "weight", None) is not None \
                else self.out
            nn.init.zeros_(last.weight)
            if last.bias is not None:
                nn.init.zeros_(last.bias)

    def embed(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries ``(B, HW, C')``, keys and values ``(B, HW', C')`` (``C``-wide for the gaussian keys)."""
        if self.mode == "gaussian":
            q, k = x, x
        else:
            q, k = self.theta(x), self.phi(x)
        v = self.g(x)
        if self.subsample:
            k, v = F.max_pool2d(k, 2), F.max_pool2d(v, 2)
        return tuple(t.flatten(2).transpose(1, 2) for t in (q, k, v))  # (B, C, H, W) -> (B, HW, C)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        if self.subsample and min(x.shape[-2:]) < 2:
            raise ValueError(f"subsample pools 2x2 and needs H, W >= 2, got input {tuple(x.shape)}")
        q, k, v = self.embed(x)
        result = attention(q, k, v, score=self.score, normalize=self.normalize, return_weights=return_attention)
        y, weights = result if return_attention else (result, None)
        y = y.transpose(1, 2).reshape(x.shape[0], -1, *x.shape[-2:])  # (B, HW, C') -> (B, C', H, W)
        out = self.norm(self.out(y)) + x
        return (out, weights) if return_attention else out

    def attention_grid(self, x: Tensor, **forward_kwargs) -> tuple[tuple[int, int], tuple[int, int]]:
        """The ``(height, width)`` of the queries' and the keys' grids for the input ``x (B, C, H, W)`` (for
        :func:`qkv.capture_attention`: the attention ``(B, HW, HW')`` is between positions of these grids)."""
        h, w = x.shape[-2:]  # (ints; symbolic under torch.export, where int() would pin them)
        return (h, w), ((h // 2, w // 2) if self.subsample else (h, w))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, inner_channels={self.inner_channels}, mode={self.mode!r}, " \
               f"subsample={self.subsample}"
