"""Attention pooling: learned queries summarise a sequence into a few vectors.

One query is the word attention of Yang et al., 2016, "Hierarchical Attention Networks for Document
Classification" (https://aclanthology.org/N16-1174): ``u_t = tanh(W h_t + b)``, ``a = softmax(u_t . u_w)``,
``s = sum_t a_t h_t``. Several queries ("hops") are the structured self-attention of Lin et al., 2017,
"A Structured Self-attentive Sentence Embedding" (https://arxiv.org/abs/1703.03130): the rows of its
``W_s2`` are the queries, with the penalty ``||A A^T - I||_F^2`` available from :meth:`penalty`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..functional import attention
from ..scores import Score

__all__ = ["AttentionPooling"]


class AttentionPooling(nn.Module):
    """Pool ``(B, T, D)`` into ``(B, D)`` (one query) or ``(B, R, D)`` (``num_queries=R``).

    Args:
        dim: ``D``, the features of each position.  hidden_dim: the hidden size of the scoring, that of the keys
            ``tanh(W h + b)`` and of the learned queries (default ``D``; like the additive score's ``hidden_dim``,
            and what the RNN models call ``attn_dim``).  num_queries: ``R`` hops.
        score: score between the learned queries and the keys (default ``dot``, as in both papers).
        dropout: on the weights, in training only.
    """

    attention_kind = "pooling"  #: learned queries over a sequence

    def __init__(self, dim: int, hidden_dim: int | None = None, *, num_queries: int = 1,
                 score: str | Score | Callable = "dot", bias: bool = True, dropout: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        if num_queries < 1:
            raise ValueError(f"num_queries must be at least 1, got {num_queries}")
        hidden_dim = dim if hidden_dim is None else hidden_dim
        self.dim, self.num_queries, self.score, self.dropout = dim, num_queries, score, dropout
        self.key_proj = nn.Linear(dim, hidden_dim, bias=bias, device=device, dtype=dtype)
        self.queries = nn.Parameter(torch.empty(num_queries, hidden_dim, device=device, dtype=dtype))
        nn.init.normal_(self.queries, std=hidden_dim ** -0.5)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x (B, T, D)``, ``mask (B, T)`` bool (True = real token) -> ``(pooled, weights)``.

        ``pooled`` is ``(B, D)`` for one query, ``(B, R, D)`` for several; ``weights`` is ``(B, T)`` or
        ``(B, R, T)``, summing to 1 over the real tokens and exactly 0 on padding.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (B, T, D={self.dim}), got {tuple(x.shape)}")
        if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:2]):
            raise ValueError(f"mask must be a bool (B, T) = {tuple(x.shape[:2])} tensor, got "
                             f"{tuple(mask.shape)} {mask.dtype}")
        keys = torch.tanh(self.key_proj(x))
        queries = self.queries.expand(x.shape[0], -1, -1)
        pooled, weights = attention(queries, keys, x, score=self.score,
                                    mask=None if mask is None else mask[:, None, :],
                                    dropout=self.dropout if self.training else 0.0, return_weights=True)
        if self.num_queries == 1:
            return pooled[:, 0], weights[:, 0]
        return pooled, weights

    @staticmethod
    def penalty(weights: Tensor) -> Tensor:
        """Lin et al.'s redundancy penalty ``||A A^T - I||_F^2`` per example, for ``weights (B, R, T)``."""
        gram = weights @ weights.transpose(-2, -1)
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        return ((gram - eye) ** 2).sum(dim=(-2, -1))
