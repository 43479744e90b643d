"""Scores with a state: where the previous steps attended feeds the next step's score.

A sequence generator attends once per output step. Content-only scores (:class:`~qkv.scores.Additive`) see
only the decoder state and the keys, so nothing tells step ``t`` where step ``t - 1`` looked: on speech, where the
alignment should move forward monotonically, they lose their place on utterances longer than the training ones.
A *stateful* score also reads a tensor over the keys that the caller carries from step to step:

- :class:`LocationAware` (Chorowski et al., 2015, "Attention-Based Models for Speech Recognition",
  https://arxiv.org/abs/1506.07503): the state is the previous step's weights ``a_{t-1}``; a 1-D convolution over
  them gives location features ``f = F * a_{t-1}`` (``filters`` channels per key), and
  ``e_tj = w^T tanh(W q_t + V k_j + U f_j + b)``.
- :class:`Coverage` (See et al., 2017, "Get To The Point", https://arxiv.org/abs/1704.04368): the state is the
  coverage ``c_t = sum_{t' < t} a_t'``, the attention every key has had so far, and
  ``e_tj = w^T tanh(W q_t + V k_j + w_c c_tj + b)``.

A stateful score is still one score of the three-stage API: give it its state for one call with
:meth:`StatefulScore.given`, and any path of :func:`qkv.attention` runs it (the reference path: the state makes
every query's scores its own)::

    score = LocationAware(query_dim=256, key_dim=512, hidden_dim=128, filters=10, kernel_size=31)
    keys = score.prepare_key(listener_out)                # V k + b, once per utterance
    weights = torch.zeros(B, T)
    weights[:, 0] = 1                                     # start at the first frame
    for t in range(steps):
        context, weights = qkv.attention(state[:, None], keys, listener_out, score=score.given(weights),
                                         key_prepared=True, mask=frames_mask, return_weights=True)
        weights = weights[:, 0]

Sharpening (Chorowski's ``beta``) is ``scale=beta``; smoothing (``sigmoid(e) / sum sigmoid(e)``) is
``normalize="smooth"`` (:func:`qkv.normalize.smooth`). To give *any* score a state, subclass
:class:`StatefulScore` and write :meth:`StatefulScore.scores` ``(query, key, state)``; calling a stateful score
without its state is an error, never a silent content-only score.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .scores import Score

__all__ = ["StatefulScore", "LocationAware", "Coverage"]


class StatefulScore(Score):
    """A score that also reads a state over the keys: ``(..., Tk)`` (the same for every query) or
    ``(..., Tq, Tk)``. Subclasses define :meth:`scores`; :meth:`given` binds a state for one call."""

    def scores(self, query: Tensor, key: Tensor, state: Tensor, *, key_prepared: bool = False) -> Tensor:
        """Raw scores ``(..., Tq, Tk)`` of ``query`` over ``key`` given ``state`` ``(..., Tq, Tk)`` (broadcast)."""
        raise NotImplementedError

    def given(self, state: Tensor) -> Score:
        """This score with ``state`` bound: what :func:`qkv.attention` (or any stage) takes as ``score=``."""
        return _Given(self, state)

    def forward(self, query, key, *, key_prepared=False):
        raise ValueError(f"{type(self).__name__} is a stateful score: give it its state for this call with "
                         f"score.given(state), e.g. qkv.attention(q, k, v, score=score.given(previous_weights))")

    def check_state(self, query: Tensor, key: Tensor, state: Tensor) -> Tensor:
        """``state`` as ``(..., Tq or 1, Tk)`` in the query's dtype; ``ValueError`` naming the shapes otherwise."""
        if not isinstance(state, Tensor) or not state.is_floating_point():
            got = state.dtype if isinstance(state, Tensor) else type(state).__name__
            raise ValueError(f"{type(self).__name__} state must be a floating-point tensor (..., Tk) or "
                             f"(..., Tq, Tk), got {got}")
        tq, tk, given = query.shape[-2], key.shape[-2], tuple(state.shape)
        if state.dim() == query.dim() - 1:
            state = state.unsqueeze(-2)
        ok = state.dim() == query.dim() and state.shape[-1] == tk and state.shape[-2] in (1, tq)
        if ok:
            try:
                torch.broadcast_shapes(state.shape[:-2], query.shape[:-2], key.shape[:-2])
            except RuntimeError:
                ok = False
        if not ok:
            raise ValueError(f"{type(self).__name__} state {given} does not fit query "
                             f"{tuple(query.shape)} and key {tuple(key.shape)}: expected (..., Tk={tk}) or "
                             f"(..., Tq={tq}, Tk={tk}) with the inputs' batch axes")
        return state.to(query.dtype)


class _Given(Score):
    """A stateful score with its state bound for one call (it shares the score's parameters, holds none)."""

    def __init__(self, score: StatefulScore, state: Tensor):
        super().__init__()
        object.__setattr__(self, "_score", score)  # not a submodule: the parameters stay the score's own
        self.state = state

    def check(self, query, key, *, key_prepared=False):
        self._score.check(query, key, key_prepared=key_prepared)
        self._score.check_state(query, key, self.state)

    def prepare_key(self, key):
        return self._score.prepare_key(key)

    def forward(self, query, key, *, key_prepared=False):
        state = self._score.check_state(query, key, self.state)
        return self._score.scores(query, key, state, key_prepared=key_prepared)

    def extra_repr(self):
        return f"{type(self._score).__name__} given state {tuple(self.state.shape)}"


class LocationAware(StatefulScore):
    """Location-aware attention (Chorowski et al., 2015): ``e_tj = w^T tanh(W q_t + V k_j + U f_j + b)`` with
    location features ``f = F * a_{t-1}`` from a 1-D convolution over the previous weights.

    Args:
        query_dim: ``Dq``.  key_dim: ``Dk``.  hidden_dim: size of ``w``.
        filters: channels of the convolution ``F`` (the paper: 10).  kernel_size: its width, odd (the paper: 201
            on 10 ms frames; 31 is plenty for a listener that shortens time 4-8x).
        bias: ``b`` inside the tanh.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, *, filters: int = 10, kernel_size: int = 31,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        if min(query_dim, key_dim, hidden_dim) <= 0:
            raise ValueError(f"sizes must be positive, got query_dim={query_dim}, key_dim={key_dim}, "
                             f"hidden_dim={hidden_dim}")
        if filters <= 0 or kernel_size <= 0 or kernel_size % 2 == 0:
            raise ValueError(f"filters must be positive and kernel_size positive and odd, got filters={filters}, "
                             f"kernel_size={kernel_size}")
        self.query_dim, self.key_dim, self.hidden_dim = query_dim, key_dim, hidden_dim
        self.filters, self.kernel_size = filters, kernel_size
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False, device=device, dtype=dtype)  # W
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=bias, device=device, dtype=dtype)  # V, b
        self.v = nn.Linear(hidden_dim, 1, bias=False, device=device, dtype=dtype)  # w
        self._location_layers(device, dtype)

    def _location_layers(self, device, dtype) -> None:
        self.conv = nn.Conv1d(1, self.filters, self.kernel_size, padding=self.kernel_size // 2, bias=False,
                              device=device, dtype=dtype)  # F
        self.location_proj = nn.Linear(self.filters, self.hidden_dim, bias=False, device=device, dtype=dtype)  # U

    def check(self, query, key, *, key_prepared=False):
        self.check_built(query, key, key_prepared, self.hidden_dim)

    def prepare_key(self, key):
        return self.key_proj(key)

    def location(self, state: Tensor) -> Tensor:
        """``U f``: ``(..., Tq, Tk)`` state -> ``(..., Tq, Tk, hidden)`` location term."""
        flat = state.reshape(-1, 1, state.shape[-1])
        features = self.conv(flat).transpose(1, 2)  # (N, Tk, filters)
        return self.location_proj(features).reshape(*state.shape, self.hidden_dim)

    def scores(self, query, key, state, *, key_prepared=False):
        keys = key if key_prepared else self.key_proj(key)
        hidden = self.query_proj(query)[..., :, None, :] + keys[..., None, :, :] + self.location(state)
        return self.v(torch.tanh(hidden)).squeeze(-1)

    def extra_repr(self):
        return f"filters={self.filters}, kernel_size={self.kernel_size}"


class Coverage(LocationAware):
    """Coverage attention (See et al., 2017): ``e_tj = w^T tanh(W q_t + V k_j + w_c c_tj + b)``, the state ``c_t``
    being the sum of the weights of the steps before (zeros at the first step). The coverage loss that goes with it,
    ``sum_j min(a_tj, c_tj)``, is the model's (it needs both)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, *, bias: bool = True, device=None,
                 dtype=None):
        super().__init__(query_dim, key_dim, hidden_dim, filters=1, kernel_size=1, bias=bias, device=device,
                         dtype=dtype)

    def _location_layers(self, device, dtype) -> None:
        self.coverage_proj = nn.Linear(1, self.hidden_dim, bias=False, device=device, dtype=dtype)  # w_c

    def location(self, state):
        return self.coverage_proj(state.unsqueeze(-1))

    def extra_repr(self):
        return ""
