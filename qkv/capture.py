"""Record every attention of a forward pass: ``with qkv.capture_attention(model) as records: model(x)``.

Every call of :func:`qkv.attention` (and of :func:`qkv.weighted_sum`, for models that run the three stages
themselves) made while a model runs inside :func:`capture_attention` is recorded under the
name of the module that made it (a :class:`~qkv.MultiHeadAttention`, :class:`~qkv.Attention`,
:class:`~qkv.SelfAttention`, :class:`~qkv.AttentionPooling`, a non-local block, or any module of the user's that
calls the function), and so is every channel or spatial map of the vision blocks (SE, ECA, CBAM, SK, BiSeNet's
ARM and FFM). The model's outputs are exactly those it gives without capturing: a call that did not ask for its
weights is run unchanged, and the weights are computed beside it (without gradient, without dropout). Outside a
capture the only cost is one test of a global variable per call.

Example::

    model = nn.Sequential(...)              # any model built from qkv layers
    with qkv.capture_attention(model) as records:
        model(x)
    for r in records:
        print(r.name, r.kind, r.layer, tuple(r.weights.shape))   # e.g. "0.self_attn self 0 (2, 8, 10, 10)"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["AttentionRecord", "capture_attention", "attention_rollout", "KINDS"]

#: what a record can be: token-to-token attention (self, cross), a learned query over a sequence (pooling), a
#: gate over channels (channel) or over positions of a feature map (spatial)
KINDS = ("self", "cross", "pooling", "channel", "spatial")

#: the active recorder, or None (the only thing the library checks when nobody captures)
ACTIVE: _Recorder | None = None


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


@dataclass
class _Recorder:
    records: list[AttentionRecord] = field(default_factory=list)
    stack: list[_Frame] = field(default_factory=list)
    busy: bool = False  # inside the extra call that computes weights: record nothing
    root: str = "attention"  # the name of calls made outside any module's forward (e.g. a decode_step method)

    def frame(self) -> _Frame | None:
        return self.stack[-1] if self.stack else None


def _layer_of(name: str) -> int | None:
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[-1]) if numbers else None


def _attention_frame(rec: _Recorder) -> _Frame | None:
    """The innermost frame of a qkv attention module, else the innermost frame of any module."""
    from .layers import Attention, AttentionPooling, MultiHeadAttention, SelfAttention
    from .vision import NonLocal

    for f in reversed(rec.stack):
        if isinstance(f.module, (MultiHeadAttention, Attention, SelfAttention, AttentionPooling, NonLocal)):
            return f
    return rec.frame()


def _kind(frame: _Frame | None, same: bool, tq: int, tk: int) -> str:
    """self / cross / pooling, from the module that called, else from the call (``same``: queries are keys)."""
    from .layers import AttentionPooling, MultiHeadAttention, SelfAttention
    from .vision import NonLocal

    module = None if frame is None else frame.module
    if isinstance(module, AttentionPooling):
        return "pooling"
    if isinstance(module, (SelfAttention, NonLocal)):
        return "self"
    if isinstance(module, MultiHeadAttention):  # called as mha(query, key=None, ...), positionally or by name
        query_in = frame.kwargs.get("query", frame.inputs[0] if frame.inputs else None)
        key_in = frame.kwargs.get("key", frame.inputs[1] if len(frame.inputs) > 1 else None)
        return "self" if key_in is None or key_in is query_in else "cross"
    # a function call in a module of the user's: self when the queries and keys are one sequence
    if same:
        return "self"
    one_input = frame is not None and len(frame.inputs) == 1 and not frame.kwargs.get("memory")
    return "self" if one_input and tq == tk else "cross"


def _grid(frame: _Frame | None) -> tuple[tuple[int, int], tuple[int, int]] | None:
    from .vision import NonLocal

    if frame is None or not isinstance(frame.module, NonLocal) or not frame.inputs:
        return None
    h, w = frame.inputs[0].shape[-2:]
    keys = (h // 2, w // 2) if frame.module.subsample else (h, w)
    return (int(h), int(w)), (int(keys[0]), int(keys[1]))


def _as_heads(weights: Tensor) -> Tensor:
    """``(..., Tq, Tk)`` -> ``(B, H, Tq, Tk)``: no batch -> B = 1; no heads -> H = 1; extra axes joined into H."""
    w = weights.detach().float().cpu()
    if w.dim() == 2:
        return w[None, None]
    if w.dim() == 3:
        return w[:, None]
    return w.reshape(w.shape[0], -1, *w.shape[-2:])


def record_call(fn: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor, kwargs: dict[str, Any]) -> Any:
    """Run ``fn(query, key, value, **kwargs)`` (:func:`qkv.attention`) unchanged and record its weights."""
    rec = ACTIVE
    assert rec is not None
    rec.busy = True
    try:
        result = fn(query, key, value, **kwargs)
        if kwargs.get("return_weights"):
            weights = result[1]
        else:
            with torch.no_grad():
                _, weights = fn(query, key, value, **{**kwargs, "return_weights": True, "dropout": 0.0})
    finally:
        rec.busy = False
    _append(rec, weights, query is key, bool(kwargs.get("is_causal")))
    return result


def _append(rec: _Recorder, weights: Tensor, same: bool, is_causal: bool) -> None:
    frame = _attention_frame(rec)
    name = frame.name if frame is not None else rec.root
    module = type(frame.module).__name__ if frame is not None else "function"
    kind = _kind(frame, same, weights.shape[-2], weights.shape[-1])
    causal = is_causal or bool(frame is not None and frame.kwargs.get("is_causal"))
    rec.records.append(AttentionRecord(name, module, kind, _layer_of(name), _as_heads(weights), causal=causal,
                                       grid=_grid(frame)))


def record_weights(weights: Tensor) -> None:
    """Record the weights given to :func:`qkv.functional.weighted_sum` by a model that runs the stages itself."""
    rec = ACTIVE
    if rec is not None and not rec.busy:
        _append(rec, weights, False, False)


def record_map(kind: str, weights: Tensor) -> None:
    """Record a vision block's map (``channel`` ``(B, C, 1, 1)`` / ``(B, M, C)``, ``spatial`` ``(B, 1, H, W)``)."""
    rec = ACTIVE
    if rec is None or rec.busy:
        return
    frame = rec.frame()
    name = frame.name if frame is not None else kind
    w = weights.detach().float().cpu()
    if kind == "spatial":
        w = w.reshape(w.shape[0], *w.shape[-2:])  # (B, 1, H, W) -> (B, H, W)
    elif w.dim() == 4:
        w = w.flatten(1)  # (B, C, 1, 1) -> (B, C); SK's (B, M, C) stays
    module = type(frame.module).__name__ if frame is not None else kind
    rec.records.append(AttentionRecord(name, module, kind, _layer_of(name), w))


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
    global ACTIVE
    if not isinstance(model, nn.Module):
        raise TypeError(f"capture_attention needs an nn.Module, got {type(model).__name__}")
    if ACTIVE is not None:
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
    ACTIVE = rec
    try:
        yield result
    finally:
        ACTIVE = None
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
