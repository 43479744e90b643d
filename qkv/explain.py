"""The worked example of self-attention (3 inputs of size 4), stage by stage.

Its inputs are ``[1,0,1,0]``, ``[0,2,0,2]``, ``[1,1,1,1]`` and its keys ``[0,1,1]``, ``[4,4,0]``,
``[2,3,1]``. The projection matrices are those of the article the example follows (Raimi Karim, "Illustrated:
Self-Attention", 2019), which give exactly those keys; biases are zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .functional import compute_scores, normalize_scores, weighted_sum
from .layers import SelfAttention
from .scores import Score, get_score

__all__ = ["EXAMPLE_INPUTS", "EXAMPLE_W_QUERY", "EXAMPLE_W_KEY", "EXAMPLE_W_VALUE", "example_self_attention",
           "Walkthrough", "walkthrough"]

EXAMPLE_INPUTS = [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]]
# (in_dim, out_dim) matrices, used as x @ W as in the example
EXAMPLE_W_KEY = [[0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
EXAMPLE_W_QUERY = [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
EXAMPLE_W_VALUE = [[0.0, 2.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 3.0], [1.0, 1.0, 0.0]]


def example_self_attention(*, scale: float | None = None, dtype: torch.dtype = torch.float64) -> SelfAttention:
    """A :class:`~qkv.layers.SelfAttention` (4 -> 3, 3) holding the example's matrices and zero biases.

    ``scale`` is the layer's factor on the scores: ``None`` for ``1/sqrt(3)``, ``1.0`` for the plain dot product.
    """
    layer = SelfAttention(4, 3, 3, scale=scale, dtype=dtype)
    with torch.no_grad():
        for lin, w in ((layer.q_proj, EXAMPLE_W_QUERY), (layer.k_proj, EXAMPLE_W_KEY),
                       (layer.v_proj, EXAMPLE_W_VALUE)):
            lin.weight.copy_(torch.tensor(w, dtype=dtype).T)
            lin.bias.zero_()
    return layer


@dataclass
class Walkthrough:
    """Every intermediate of one attention computation. ``T = 3`` inputs."""

    inputs: Tensor  #: (T, 4)
    queries: Tensor  #: (T, 3)
    keys: Tensor  #: (T, 3)
    values: Tensor  #: (T, 3)
    scores: Tensor  #: (T, T) after the scale
    weights: Tensor  #: (T, T)
    outputs: Tensor  #: (T, 3)
    scale: float


def walkthrough(score: str | Score | Callable = "dot", *, scale: float | None = None,
                normalize: str | Callable = "softmax", dtype: torch.dtype = torch.float64) -> Walkthrough:
    """Run the three stages on the worked example with ``score`` and return every intermediate.

    ``scale`` multiplies the scores; ``score="scaled_dot"`` defaults it to ``1/sqrt(3)``.
    """
    layer = example_self_attention(dtype=dtype)
    sc = get_score(score)
    x = torch.tensor(EXAMPLE_INPUTS, dtype=dtype)
    with torch.no_grad():
        q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
        factor = sc.factor(q, k, scale)
        s = compute_scores(q, k, sc, scale=factor)
        w = normalize_scores(s, normalize=normalize)
        out = weighted_sum(w, v)
    return Walkthrough(x, q, k, v, s, w, out, factor)
