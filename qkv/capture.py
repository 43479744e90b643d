"""Record every attention of a forward pass: ``with qkv.capture_attention(model) as records: model(x)``.

Every call of :func:`qkv.attention` (and of :func:`qkv.weighted_sum`, for models that run the three stages
themselves) made while a model runs inside :func:`capture_attention` is recorded under the name of the innermost
module of ``model`` whose ``forward`` made it (a :class:`~qkv.MultiHeadAttention`, a non-local block, a Hugging Face
attention module, any module of the user's that calls the function), and so is every channel or spatial map of the
vision blocks (SE, ECA, CBAM, SK, BiSeNet's ARM and FFM). The model's outputs are exactly those it gives without
capturing, to float rounding: each attention runs once, asking for its weights (a call that did not ask for them
takes the weights path instead of the fused one; its dropout, if any, is drawn the same way). The recorded weights
are those before dropout, detached. Outside a capture the only cost is one test of a global variable per call.

How it is wired: the core reports to :mod:`qkv.hooks`, and a capture subscribes a recorder there; forward hooks on
``model``'s modules tell the recorder which module is running. The kind of a record comes from the nearest enclosing
module that declares ``attention_kind`` (``"self"``, ``"cross"``, ``"pooling"``, ``"channel"``, ``"spatial"``); a
module that declares None (its kind depends on the call, as :class:`~qkv.MultiHeadAttention`'s) is ``self`` when
called without a key or with the query as key, ``cross`` otherwise; with no declaring module, the call decides
(queries that are keys, or one input and as many queries as keys: ``self``). A module over a feature map gives the
grids of its queries and keys with ``attention_grid(*inputs, **kwargs)`` (:class:`~qkv.vision.NonLocal`).

Example::

    model = nn.Sequential(...)              # any model built from qkv layers
    with qkv.capture_attention(model) as records:
        model(x)
    for r in records:
        print(r.name, r.kind, r.layer, tuple(r.weights.shape))   # e.g. "0.self_attn self 0 (2, 8, 10, 10)"
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from . import hooks
from .hooks import KINDS

__all__ = ["AttentionRecord", "capture_attention", "attention_rollout", "KINDS"]

@dataclass
class AttentionRecord:
    """The weights of one attention module in one forward pass.

    Attributes:
        name: the module's path in the model (``"encoder.layers.0.self_attn"``; the class name for the model
            itself).
        module: the module's class name.
        kind: one of :data:`KINDS`.
        layer: the last number in ``name`` (the layer of a stack), or None.
        weights: detached, float32, on the CPU. ``self``/``cross``/``pooling``: ``(B, H, Tq, Tk)`` (``H`` = 1
            for single-head attention; pooling's queries are its ``Tq``); ``channel``: ``(B, C)``, or
            ``(B, M, C)`` for SK's choice between ``M`` branches; ``spatial``: ``(B, H, W)``.
        calls: how many calls are joined in this record (a decoder's steps, joined along the query axis).
        causal: the call masked future keys (a decoder's self-attention).
        grid: for attention between positions of a feature map, the ``(height, width)`` of the queries' and the
            keys' grids; None otherwise.
    """

    name: str
    module: str
    kind: str
    layer: int | None
    weights: Tensor
    calls: int = 1
    causal: bool = False
    grid: tuple[tuple[int, int], tuple[int, int]] | None = None

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1] if self.kind in ("self", "cross", "pooling") else 1

    def mean_heads(self) -> Tensor:
        """``(B, Tq, Tk)``: the weights averaged over the heads (self, cross and pooling records)."""
        if self.kind not in ("self", "cross", "pooling"):
            raise ValueError(f"{self.name}: a {self.kind} record has no heads")
        return self.weights.mean(dim=1)


@dataclass
class _Frame:
    name: str
    module: nn.Module
    inputs: tuple
    kwargs: dict


def _layer_of(name: str) -> int | None:
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[-1]) if numbers else None


def _declares(module: nn.Module) -> bool:
    """Whether a module says what attention it computes (``attention_kind``, None meaning: it depends on the call)."""
    return hasattr(module, "attention_kind")


def _inferred_kind(frame: _Frame) -> str:
    """self / cross for a module whose kind depends on the call, ``forward(query, key=None, ...)``: self when no
    key is given or the key is the query (by position or by name)."""
    query_in = frame.kwargs.get("query", frame.inputs[0] if frame.inputs else None)
    key_in = frame.kwargs.get("key", frame.inputs[1] if len(frame.inputs) > 1 else None)
    return "self" if key_in is None or key_in is query_in else "cross"


def _as_heads(weights: Tensor) -> Tensor:
    """``(..., Tq, Tk)`` -> ``(B, H, Tq, Tk)``: no batch -> B = 1; no heads -> H = 1; extra axes joined into H."""
    w = weights.detach().float().cpu()
    if w.dim() == 2:
        return w[None, None]
    if w.dim() == 3:
        return w[:, None]
    return w.reshape(w.shape[0], math.prod(w.shape[1:-2]), *w.shape[-2:])  # (sizes given: B, Tq or Tk may be 0)


@dataclass
class _Recorder:
    """The observer of :mod:`qkv.hooks` that :func:`capture_attention` subscribes; the frames are the modules whose
    ``forward`` is running, innermost last."""

    records: list[AttentionRecord] = field(default_factory=list)
    stack: list[_Frame] = field(default_factory=list)
    root: str = "attention"  # the name of calls made outside any module's forward (e.g. a decode_step method)

    def frame(self) -> _Frame | None:
        return self.stack[-1] if self.stack else None

    def declaring(self) -> _Frame | None:
        """The innermost frame of a module that declares ``attention_kind``."""
        return next((f for f in reversed(self.stack) if _declares(f.module)), None)

    # ------------------------------------------------------------------------------------- hooks.Observer
    def on_call(self, fn: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor,
                kwargs: dict[str, Any]) -> Any:
        """Run ``fn(query, key, value, **kwargs)`` (:func:`qkv.attention`) once, asking for its weights, record them
        and return what the call asked for."""
        if kwargs.get("return_weights"):
            result = fn(query, key, value, **kwargs)
            weights = result[1]
        else:
            result, weights = fn(query, key, value, **{**kwargs, "return_weights": True})
        self._append(weights, query is key, bool(kwargs.get("is_causal")))
        return result

    def on_weights(self, weights: Tensor) -> None:
        self._append(weights, False, False)

    def on_map(self, kind: str, weights: Tensor) -> None:
        frame = self.frame()
        name = frame.name if frame is not None else kind
        w = weights.detach().float().cpu()
        if kind == "spatial":
            w = w.reshape(w.shape[0], *w.shape[-2:])  # (B, 1, H, W) -> (B, H, W)
        elif w.dim() == 4:
            w = w.flatten(1)  # (B, C, 1, 1) -> (B, C); SK's (B, M, C) stays
        module = type(frame.module).__name__ if frame is not None else kind
        self.records.append(AttentionRecord(name, module, kind, _layer_of(name), w))

    # -----------------------------------------------------------------------------------------------------
    def _kind(self, frame: _Frame | None, owner: _Frame | None, same: bool, tq: int, tk: int) -> str:
        """From the nearest module that declares its kind; else from the call (``same``: queries are keys)."""
        if owner is not None:
            kind = owner.module.attention_kind
            if kind is not None:
                if kind not in KINDS:
                    raise ValueError(f"{type(owner.module).__name__}.attention_kind must be one of {KINDS} or None, "
                                     f"got {kind!r}")
                return kind
            return _inferred_kind(owner)
        # a function call in a module of the user's: self when the queries and keys are one sequence
        if same:
            return "self"
        one_input = frame is not None and len(frame.inputs) == 1 and not frame.kwargs.get("memory")
        return "self" if one_input and tq == tk else "cross"

    def _append(self, weights: Tensor, same: bool, is_causal: bool) -> None:
        frame, owner = self.frame(), self.declaring()
        name = frame.name if frame is not None else self.root
        module = type(frame.module).__name__ if frame is not None else "function"
        kind = self._kind(frame, owner, same, weights.shape[-2], weights.shape[-1])
        causal = is_causal or any(f is not None and bool(f.kwargs.get("is_causal")) for f in (frame, owner))
        grid = None
        if owner is not None and owner.inputs and hasattr(owner.module, "attention_grid"):
            grid = owner.module.attention_grid(*owner.inputs, **owner.kwargs)
        self.records.append(AttentionRecord(name, module, kind, _layer_of(name), _as_heads(weights), causal=causal,
                                            grid=grid))


def _join(records: list[AttentionRecord]) -> list[AttentionRecord]:
    """Join the calls of one module (a decoder's steps) along the query axis, in order of first call.

    Calls join when they agree on kind, batch and heads; keys of later steps may be more (a growing cache): the
    shorter rows are padded with zero weights on the right, where those keys did not exist yet.
    """
    out: list[AttentionRecord] = []
    last: dict[str, int] = {}
    for r in records:
        i = last.get(r.name)
        prev = out[i] if i is not None else None
        if (prev is not None and r.kind in ("self", "cross", "pooling") and prev.kind == r.kind
                and prev.weights.shape[:2] == r.weights.shape[:2] and prev.grid == r.grid):
            a, b = prev.weights, r.weights
            tk = max(a.shape[-1], b.shape[-1])
            a, b = (nn.functional.pad(t, (0, tk - t.shape[-1])) for t in (a, b))
            out[i] = replace(prev, weights=torch.cat([a, b], dim=-2), calls=prev.calls + r.calls,
                             causal=prev.causal or r.causal)
        else:
            last[r.name] = len(out)
            out.append(r)
    return out


@contextmanager
def capture_attention(model: nn.Module, *, join_steps: bool = True) -> Iterator[list[AttentionRecord]]:
    """Record the attention of every qkv attention module that ``model`` runs inside the ``with`` block.

    Yields a list that is filled when the block ends: one :class:`AttentionRecord` per module (its calls joined
    along the query axis when ``join_steps``; one record per call otherwise), in the order of the first call. The
    hooks that name the modules are removed when the block ends, also after an exception. Captures do not nest.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"capture_attention needs an nn.Module, got {type(model).__name__}")
    if hooks.observer() is not None:
        raise RuntimeError("capture_attention is already active; captures do not nest")
    rec = _Recorder(root=type(model).__name__)
    handles = []

    def enter(name: str):
        def hook(module, args, kwargs):
            rec.stack.append(_Frame(name or type(module).__name__, module, args, kwargs))
        return hook

    def leave(module, args, kwargs, output):
        if rec.stack and rec.stack[-1].module is module:
            rec.stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name), with_kwargs=True))
        handles.append(module.register_forward_hook(leave, with_kwargs=True, always_call=True))
    result: list[AttentionRecord] = []
    hooks.subscribe(rec)
    try:
        yield result
    finally:
        hooks.unsubscribe(rec)
        for h in handles:
            h.remove()
        result.extend(_join(rec.records) if join_steps else rec.records)


def attention_rollout(layers: list[Tensor], *, residual: float = 0.5) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020) through a stack of self-attention layers.

    ``layers``: the weights of each layer, first layer first, ``(B, T, T)`` (averaged over heads) or
    ``(B, H, T, T)`` (averaged here). Each layer's matrix becomes ``residual * I + (1 - residual) * A``
    (the residual connection), its rows renormalised, and the matrices are multiplied from the first layer up:
    ``R = Â_L ... Â_2 Â_1``. Returns ``(B, T, T)``: how much each output position draws on each input token.
    """
    if not layers:
        raise ValueError("attention_rollout needs at least one layer")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    out = None
    for i, a in enumerate(layers):
        a = a.mean(dim=1) if a.dim() == 4 else a
        if a.dim() != 3 or a.shape[-1] != a.shape[-2] or (out is not None and a.shape != out.shape):
            raise ValueError(f"layer {i}: expected (B, T, T) or (B, H, T, T) like the others, got "
                             f"{tuple(layers[i].shape)}")
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = residual * eye + (1.0 - residual) * a
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
        out = a if out is None else a @ out
    return out
