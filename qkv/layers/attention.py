"""Single-head attention layers: generic :class:`Attention` and the :class:`SelfAttention` of the worked example.

They hold parameters (a parametric score, projections) and call :func:`qkv.functional.attention`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..functional import attention
from ..location import StatefulScore
from ..scores import Score, create_score

__all__ = ["Attention", "SelfAttention"]


def _check_scale(scale) -> None:
    if isinstance(scale, bool) or not (scale is None or isinstance(scale, int | float)):
        raise ValueError(f"scale must be a number or None (the score's default), got {scale!r}; use scale=1.0 for "
                         "the unscaled dot product")


class Attention(nn.Module):
    """Attention with a pluggable score: ``softmax(score(q, k)) @ v``.

    Args:
        score: a name (``dot``, ``scaled_dot``, ``cosine``, ``general``, ``additive``, ``mlp``), a
            :class:`qkv.scores.Score` or a callable ``(q, k) -> scores``. Parametric names need
            ``query_dim`` (and ``key_dim``/``hidden_dim`` where they differ): the features of the queries and keys
            given to ``forward``, and the score's hidden size.
        normalize: ``softmax``, ``sparsemax`` or a callable.  dropout: on the weights, in training only.
        scale: factor on the scores (default ``1/sqrt(Dk)`` for ``scaled_dot``, else 1).

    Example:
        >>> att = Attention("additive", query_dim=8, key_dim=6, hidden_dim=16)
        >>> out, w = att(torch.randn(2, 3, 8), torch.randn(2, 5, 6), return_weights=True)
    """

    attention_kind = None  #: self or cross, from the call (key is query or not)

    def __init__(self, score: str | Score | Callable = "scaled_dot", *, normalize: str | Callable = "softmax",
                 dropout: float = 0.0, scale: float | None = None, query_dim: int | None = None,
                 key_dim: int | None = None, hidden_dim: int | None = None, device=None, dtype=None):
        super().__init__()
        _check_scale(scale)
        self.score = create_score(score, query_dim, key_dim, hidden_dim, device=device, dtype=dtype)
        self.normalize = normalize
        self.dropout = dropout
        self.scale = scale

    def forward(self, query: Tensor, key: Tensor, value: Tensor | None = None, *, mask: Tensor | None = None,
                is_causal: bool = False, return_weights: bool = False, state: Tensor | None = None):
        """``query (..., Tq, Dq)``, ``key (..., Tk, Dk)``, ``value (..., Tk, Dv)`` (default: ``key``); ``state``
        ``(..., Tk)`` or ``(..., Tq, Tk)``: what a stateful score reads (:mod:`qkv.location`: the previous weights
        of ``LocationAware``, the coverage of ``Coverage``).

        Returns ``(..., Tq, Dv)``, or ``(output, weights (..., Tq, Tk))`` when ``return_weights``.
        """
        score = self.score
        if state is not None:
            if not isinstance(score, StatefulScore):
                raise ValueError(f"state given to an attention whose score ({type(score).__name__}) reads none")
            score = score.given(state)
        return attention(query, key, key if value is None else value, score=score, mask=mask,
                         normalize=self.normalize, dropout=self.dropout if self.training else 0.0,
                         scale=self.scale, is_causal=is_causal, return_weights=return_weights)


class SelfAttention(nn.Module):
    """Self-attention as the worked example walks through it: every input yields a query, key and value.

    ``Q = X W_q + b_q``, ``K = X W_k + b_k``, ``V = X W_v + b_v`` (shared across positions), then
    ``softmax(Q K^T / sqrt(d_k)) V``. The value size may differ from the query/key size.

    Args:
        dim: features of each input.  key_dim: size of the queries and keys it makes.  value_dim: size of the
            values (default ``key_dim``).  bias: biases on the projections.
        scale: factor on the scores: ``None`` for ``1/sqrt(key_dim)``, a number otherwise (``1.0`` is the plain
            dot product).
        dropout: on the weights, in training only.
    """

    attention_kind = "self"  #: what qkv.capture_attention records

    def __init__(self, dim: int, key_dim: int, value_dim: int | None = None, *, bias: bool = True,
                 scale: float | None = None, dropout: float = 0.0, device=None, dtype=None):
        super().__init__()
        _check_scale(scale)
        value_dim = key_dim if value_dim is None else value_dim
        self.dim, self.key_dim, self.value_dim = dim, key_dim, value_dim
        fk = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(dim, key_dim, bias=bias, **fk)
        self.k_proj = nn.Linear(dim, key_dim, bias=bias, **fk)
        self.v_proj = nn.Linear(dim, value_dim, bias=bias, **fk)
        self.scale = scale
        self.dropout = dropout

    def forward(self, x: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
                return_weights: bool = False):
        """``x (..., T, dim)`` -> ``(..., T, value_dim)`` (and weights ``(..., T, T)``)."""
        return attention(self.q_proj(x), self.k_proj(x), self.v_proj(x),
                         score="scaled_dot", scale=self.scale, mask=mask,
                         dropout=self.dropout if self.training else 0.0, is_causal=is_causal,
                         return_weights=return_weights)
