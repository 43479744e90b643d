"""Stage one of attention: how similar is each query to each key.

Every score maps ``query (..., Tq, Dq)`` and ``key (..., Tk, Dk)`` to raw scores ``(..., Tq, Tk)``.

Two families, which decide the fast path the core can take:

- **Dot-product family** (``Dot``, ``ScaledDot``, ``Cosine``, ``General``): each is a dot product of
  transformed queries and keys, ``s = q' k'^T``; :meth:`Score.dot_form` returns ``(q', k')`` and the core
  hands them to :func:`torch.nn.functional.scaled_dot_product_attention`.
- **Pairwise family** (``Additive``, ``MLP``): a small network applied to every ``(q, k)`` pair. The
  textbook formula materialises a ``(..., Tq, Tk, hidden)`` tensor; here it is computed in tiles whose
  size is bounded by ``max_elements``, checkpointed in training and fused by the compiler where it pays
  (:mod:`qkv.tiling`: this module defines the scores and calls that one, which computes tiles of plain tensors
  under a memory bound and knows nothing of the scores).

Parameter-free scores have names (``dot``, ``scaled_dot``, ``cosine``); parametric ones are modules
built with their sizes, e.g. ``Additive(query_dim, key_dim, hidden_dim)``. Any callable
``(q, k) -> scores`` is a score as well.

References: Luong et al., 2015, "Effective Approaches to Attention-based Neural Machine Translation"
(dot, general, concat), https://arxiv.org/abs/1508.04025; Bahdanau et al., 2015, "Neural Machine
Translation by Jointly Learning to Align and Translate" (additive), https://arxiv.org/abs/1409.0473;
Vaswani et al., 2017, "Attention Is All You Need" (scaled dot product), https://arxiv.org/abs/1706.03762.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import tiling
from .tiling import ACTIVATIONS, DEFAULT_MAX_ELEMENTS, FUSED_MIN_ELEMENTS  # noqa: F401 - (names kept here too)

__all__ = [
    "Score",
    "Dot",
    "ScaledDot",
    "Cosine",
    "General",
    "PairwiseScore",
    "Additive",
    "MLP",
    "FunctionScore",
    "SCORES",
    "get_score",
    "create_score",
]

class Score(nn.Module):
    """Base class of scores: ``forward(query, key) -> (..., Tq, Tk)`` raw (unscaled) scores."""

    #: whether query and key must have the same feature size
    same_dim: bool = False

    def check(self, query: Tensor, key: Tensor, *, key_prepared: bool = False) -> None:
        """Raise ``ValueError`` naming the shapes when this score cannot compare them."""
        if self.same_dim and query.shape[-1] != key.shape[-1]:
            raise ValueError(
                f"score {type(self).__name__} needs query and key of the same size, got query "
                f"{tuple(query.shape)} and key {tuple(key.shape)}; use General or Additive for different sizes"
            )

    def check_built(self, query: Tensor, key: Tensor, key_prepared: bool, prepared_dim: int) -> None:
        """:meth:`check` for a score built for ``self.query_dim`` and ``self.key_dim``, whose prepared keys are
        ``prepared_dim`` wide."""
        key_dim = prepared_dim if key_prepared else self.key_dim
        if query.shape[-1] != self.query_dim or key.shape[-1] != key_dim:
            raise ValueError(
                f"{type(self).__name__} score built for query_dim={self.query_dim}, key_dim={self.key_dim} got "
                f"query {tuple(query.shape)} and {'prepared ' if key_prepared else ''}key {tuple(key.shape)}"
            )

    def prepare_key(self, key: Tensor) -> Tensor:
        """The part of the score that depends on the key alone (a projection, a normalisation).

        Keys attended to many times (a decoder's source memory) can be prepared once and passed with
        ``key_prepared=True`` to the score and to :func:`qkv.attention`.
        """
        return key

    def dot_form(self, query: Tensor, key: Tensor, *, key_prepared: bool = False) -> tuple[Tensor, Tensor] | None:
        """``(q', k')`` with ``forward(query, key) == q' @ k'^T``, or ``None`` outside the dot family."""
        return None

    def default_scale(self, query: Tensor, key: Tensor) -> float:
        """Factor applied to the raw scores when the caller gives no ``scale``."""
        return 1.0

    def factor(self, query: Tensor, key: Tensor, scale: float | None = None) -> float:
        """The factor on the raw scores: ``scale`` when given, else :meth:`default_scale` (the one place every
        path of :func:`qkv.attention` takes it from)."""
        return self.default_scale(query, key) if scale is None else float(scale)

    def forward(self, query: Tensor, key: Tensor, *, key_prepared: bool = False) -> Tensor:
        q, k = self.dot_form(query, key, key_prepared=key_prepared)
        return q @ k.transpose(-2, -1)


class Dot(Score):
    """``s = q . k`` (Luong's "dot")."""

    same_dim = True

    def dot_form(self, query, key, *, key_prepared=False):
        return query, key


class ScaledDot(Dot):
    """``s = q . k / sqrt(d_k)`` (Vaswani et al.); the ``1/sqrt(d_k)`` is the default scale."""

    def default_scale(self, query, key):
        return 1.0 / math.sqrt(key.shape[-1])


class Cosine(Score):
    """``s = (q . k) / (|q| |k|) / temperature``, a similarity in ``[-1, 1]`` before the temperature.

    Args:
        temperature: divides the cosine (default 1; cosine scores are flat under softmax, and values
            around 0.05-0.1 are common). A ``scale`` given to the core replaces ``1 / temperature``.
        eps: guards the norms of zero vectors.
    """

    same_dim = True

    def __init__(self, temperature: float = 1.0, eps: float = 1e-8):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.eps = eps

    def _normalize(self, x: Tensor) -> Tensor:
        # eps at least the dtype's smallest normal number: 1e-8 is 0 in float16, and 0 / 0 is NaN for a zero vector
        return F.normalize(x, dim=-1, eps=max(self.eps, torch.finfo(x.dtype).tiny))

    def prepare_key(self, key):
        return self._normalize(key)

    def dot_form(self, query, key, *, key_prepared=False):
        return self._normalize(query), key if key_prepared else self.prepare_key(key)

    def default_scale(self, query, key):
        return 1.0 / self.temperature

    def extra_repr(self):
        return f"temperature={self.temperature}"


class General(Score):
    """Luong's "general" (bilinear) score ``s = q^T W k``; ``W`` is ``(query_dim, key_dim)``.

    Args:
        query_dim: ``Dq``.  key_dim: ``Dk`` (default ``Dq``).  bias: add a bias to ``W k``.
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, *, bias: bool = False, device=None, dtype=None):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        self.query_dim, self.key_dim = query_dim, key_dim
        self.key_proj = nn.Linear(key_dim, query_dim, bias=bias, device=device, dtype=dtype)

    def check(self, query, key, *, key_prepared=False):
        self.check_built(query, key, key_prepared, self.query_dim)

    def prepare_key(self, key):
        return self.key_proj(key)

    def dot_form(self, query, key, *, key_prepared=False):
        return query, key if key_prepared else self.key_proj(key)


class PairwiseScore(Score):
    """A network on every ``(q, k)`` pair whose first layer is ``W_q q + W_k k + b``.

    Subclasses define ``pair(h)``: the rest of the network, from the hidden pre-activations
    ``h (..., cq, ck, hidden)`` of one tile (a fresh tensor ``pair`` may overwrite) to its scores ``(..., cq, ck)``.

    Args:
        max_elements: bound on the elements of one ``(..., cq, ck, hidden)`` tile; the score is computed
            tile by tile, each tile checkpointed (recomputed in backward) when gradients are needed. None (the
            default): 2**24 on a CPU, 2**27 on a GPU (:func:`qkv.tiling.max_elements_for`).
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, *, bias: bool = True,
                 max_elements: int | None = None, device=None, dtype=None):
        super().__init__()
        if min(query_dim, key_dim, hidden_dim) <= 0:
            raise ValueError(f"sizes must be positive, got query_dim={query_dim}, key_dim={key_dim}, "
                             f"hidden_dim={hidden_dim}")
        if max_elements is not None and max_elements <= 0:
            raise ValueError(f"max_elements must be positive, got {max_elements}")
        self.query_dim, self.key_dim, self.hidden_dim = query_dim, key_dim, hidden_dim
        self.max_elements = max_elements
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False, device=device, dtype=dtype)
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=bias, device=device, dtype=dtype)

    def pair(self, hidden: Tensor) -> Tensor:
        raise NotImplementedError

    def check(self, query, key, *, key_prepared=False):
        self.check_built(query, key, key_prepared, self.hidden_dim)

    def prepare_key(self, key):
        return self.key_proj(key)

    def reference(self, query: Tensor, key: Tensor) -> Tensor:
        """The textbook formula, materialising ``(..., Tq, Tk, hidden)``: for tests and benchmarks."""
        h = self.query_proj(query)[..., :, None, :] + self.key_proj(key)[..., None, :, :]
        return self.pair(h)

    def tile_sizes(self, query: Tensor, key: Tensor) -> tuple[int, int]:
        """``(cq, ck)``: query and key rows per eager tile under ``max_elements`` (:func:`qkv.tiling.tile_sizes`)."""
        lead = math.prod(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
        return tiling.tile_sizes(query.shape[-2], key.shape[-2], lead, self.hidden_dim,
                                 tiling.max_elements_for(query.device, self.max_elements))

    def fused_form(self) -> tuple[Tensor, Tensor | None, str] | None:
        """``(w, b, act)`` when ``pair(h) = sum_h w_h act(h) + b`` (one elementwise layer, then a dot product):
        the form the fused kernel computes; None otherwise."""
        return None

    def tiles(self, query: Tensor, key: Tensor, *, key_prepared: bool = False
              ) -> Iterator[tuple[slice, slice, Tensor]]:
        """Yield ``(query_rows, key_rows, scores)`` tile by tile, never holding more than one tile
        (:func:`qkv.tiling.tiles`)."""
        qp, kp = self.query_proj(query), key if key_prepared else self.key_proj(key)
        return tiling.tiles(qp, kp, self.pair, self.fused_form(), self.max_elements, f"{type(self).__name__} score")

    def forward(self, query, key, *, key_prepared=False):
        qp, kp = self.query_proj(query), key if key_prepared else self.key_proj(key)
        return tiling.tiled_scores(qp, kp, self.pair, self.fused_form(), self.max_elements,
                                   f"{type(self).__name__} score")


class Additive(PairwiseScore):
    """Bahdanau's additive score ``s = w_v^T tanh(W_q q + W_k k + b)``; Luong calls it "concat".

    Args:
        query_dim: ``Dq``.  key_dim: ``Dk`` (may differ from ``Dq``).  hidden_dim: size of ``w_v``.
        bias: the bias ``b`` inside the tanh.  max_elements: tile bound (see :class:`PairwiseScore`).
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, *, bias: bool = True,
                 max_elements: int | None = None, device=None, dtype=None):
        super().__init__(query_dim, key_dim, hidden_dim, bias=bias, max_elements=max_elements,
                         device=device, dtype=dtype)
        self.v = nn.Linear(hidden_dim, 1, bias=False, device=device, dtype=dtype)

    def pair(self, hidden):
        return self.v(torch.tanh_(hidden)).squeeze(-1)  # `hidden` is a fresh tile: tanh in place

    def fused_form(self):
        return self.v.weight[0], None, "Tanh"


class MLP(PairwiseScore):
    """An MLP on the concatenation ``[q; k]``: ``Linear -> act -> ... -> Linear(., 1)``.

    The first layer on ``[q; k]`` is split into ``W_q q + W_k k + b`` so that it is computed once per
    query and once per key, not once per pair.

    Args:
        query_dim, key_dim: input sizes.  hidden_dims: sizes of the hidden layers (one int for one layer).
        act_layer: activation module class (default ``nn.ReLU``).  dropout: between hidden layers.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dims: int | Sequence[int] = 64, *,
                 act_layer: type[nn.Module] = nn.ReLU, dropout: float = 0.0, bias: bool = True,
                 max_elements: int | None = None, device=None, dtype=None):
        dims = [hidden_dims] if isinstance(hidden_dims, int) else list(hidden_dims)
        if not dims:
            raise ValueError("hidden_dims must name at least one hidden layer")
        super().__init__(query_dim, key_dim, dims[0], bias=bias, max_elements=max_elements,
                         device=device, dtype=dtype)
        layers: list[nn.Module] = [act_layer()]
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Dropout(dropout), nn.Linear(a, b, device=device, dtype=dtype), act_layer()]
        layers += [nn.Linear(dims[-1], 1, device=device, dtype=dtype)]
        self.head = nn.Sequential(*layers)

    def pair(self, hidden):
        return self.head(hidden).squeeze(-1)

    def fused_form(self):
        if len(self.head) != 2 or type(self.head[0]).__name__ not in ACTIVATIONS:  # more than one hidden layer
            return None
        act, out = self.head
        if isinstance(act, nn.GELU) and act.approximate != "none":
            return None
        return out.weight[0], None if out.bias is None else out.bias[0], type(act).__name__


class FunctionScore(Score):
    """Wrap a callable ``fn(query, key) -> (..., Tq, Tk)`` as a score."""

    def __init__(self, fn: Callable[[Tensor, Tensor], Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, query, key, *, key_prepared=False):
        s = self.fn(query, key)
        tq, tk = query.shape[-2], key.shape[-2]
        if not isinstance(s, Tensor) or s.dim() < 2 or s.shape[-2:] != (tq, tk):
            shape = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
            raise ValueError(f"custom score must return (..., Tq, Tk) = (..., {tq}, {tk}) scores, got {shape}")
        return s

    def extra_repr(self):
        return getattr(self.fn, "__name__", repr(self.fn))


#: parameter-free scores by name
SCORES: dict[str, Callable[[], Score]] = {"dot": Dot, "scaled_dot": ScaledDot, "cosine": Cosine}
_PARAMETRIC = {"general": General, "additive": Additive, "mlp": MLP}


#: one shared instance of each score that holds nothing (building a module costs more than a small attention call)
_SHARED: dict[str, Score] = {}


def get_score(score: str | Score | Callable[[Tensor, Tensor], Tensor]) -> Score:
    """Resolve a parameter-free score name, a :class:`Score` module or a callable into a :class:`Score` (``dot``
    and ``scaled_dot``, which hold nothing, are one shared instance each; :func:`create_score` builds new ones)."""
    if isinstance(score, Score):
        return score
    if isinstance(score, str):
        if score in ("dot", "scaled_dot"):
            if score not in _SHARED:
                _SHARED[score] = SCORES[score]()
            return _SHARED[score]
        if score in SCORES:
            return SCORES[score]()
        if score in _PARAMETRIC:
            raise ValueError(
                f"score {score!r} has learned parameters: build it with its sizes, e.g. "
                f"qkv.scores.create_score({score!r}, query_dim, key_dim), and pass the module"
            )
        raise ValueError(f"unknown score {score!r}; expected one of {sorted(SCORES) + sorted(_PARAMETRIC)}, "
                         "a qkv.scores.Score or a callable (q, k) -> scores")
    if callable(score):
        return FunctionScore(score)
    raise ValueError(f"score must be a name, a qkv.scores.Score or a callable, got {type(score).__name__}")


def create_score(name: str | Score | Callable, query_dim: int | None = None, key_dim: int | None = None,
                 hidden_dim: int | None = None, *, device=None, dtype=None, **kwargs) -> Score:
    """Build any score by name, giving sizes to the parametric ones.

    ``key_dim`` defaults to ``query_dim``, ``hidden_dim`` to ``key_dim`` (``additive``, ``mlp``);
    ``device``/``dtype`` place the parameters of parametric scores. Names, modules and callables that
    need no sizes are resolved as by :func:`get_score`; ``kwargs`` go to the score's constructor.
    """
    if isinstance(name, str) and name in _PARAMETRIC:
        if query_dim is None:
            raise ValueError(f"score {name!r} needs query_dim (and key_dim when it differs)")
        key_dim = query_dim if key_dim is None else key_dim
        if name == "general":
            return General(query_dim, key_dim, device=device, dtype=dtype, **kwargs)
        hidden = key_dim if hidden_dim is None else hidden_dim
        return _PARAMETRIC[name](query_dim, key_dim, hidden, device=device, dtype=dtype, **kwargs)
    if isinstance(name, str) and name in SCORES:
        return SCORES[name](**kwargs)
    if kwargs:
        raise ValueError(f"score options {sorted(kwargs)} apply only to a score given by name")
    return get_score(name)


def score_names() -> list[str]:
    """All score names, parameter-free and parametric."""
    return sorted(SCORES) + sorted(_PARAMETRIC)
