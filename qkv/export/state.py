"""Any decoder of qkv's one decoding protocol (``encode`` / ``decode_step``) as two graphs, its decoding state
flattened into named tensors.

- ``encoder``: the model's encoder inputs -> every tensor of the state ``encode`` returns (``memory``, ``keys``,
  ``mask``, an RNN's ``h``/``c``, a location-aware score's ``previous`` weights, a pointer's ``coverage``, CTC
  log-probabilities...), named by their place in the state (``hidden_0``, ``self_cache_1_key``);
- ``decoder_step``: ``tokens (N,)`` and the state -> ``logits`` (or log-probabilities, ``normalized`` in the
  manifest), ``attention (N, S)``, and ``next_<name>`` for every state tensor the step changes (the recurrent
  state, the attention state of location-aware and coverage scores, the keys and values of a Transformer's
  self-attention: ``(N, G, T, D)`` in, ``(N, G, T + 1, D)`` out, ``T = 0`` at the first step). The state tensors
  the step only reads are inputs only. A Transformer's cross-attention keys and values are computed from
  ``memory`` in every step. A pointer-generator's extended vocabulary ``V + X`` is given by the width ``X`` of an
  ``ext_slots (N, X)`` input (``X >= 1``; its values are not read).

Which axes are dynamic is found by encoding a second example of another length: every axis of a state tensor
that changes with it is the ``source`` axis. :mod:`qkv.export.runtime` runs the loop over the two graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..layers import KVCache

__all__ = ["flatten", "rebuild", "StateEncoder", "StateStep", "state_graphs"]


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}_{key}" if prefix else str(key)


def flatten(state: Any, prefix: str = "") -> tuple[dict[str, Tensor | None], Any]:
    """``(tensors by name, template)``: every tensor of a decoding state made of dicts, lists and tuples; a
    self-attention :class:`~qkv.layers.KVCache` is two tensors (``<name>_key``, ``<name>_value``, None while
    empty); a static (cross-attention) cache and every other value are kept in the template as they are."""
    leaves: dict[str, Tensor | None] = {}

    def walk(obj, name):
        if isinstance(obj, Tensor):
            leaves[name] = obj
            return ("tensor", name)
        if isinstance(obj, KVCache):
            if obj.static:
                return ("cross",)
            leaves[f"{name}_key"], leaves[f"{name}_value"] = obj.key, obj.value
            return ("cache", name)
        if isinstance(obj, dict):
            return ("dict", {k: walk(v, _join(name, k)) for k, v in obj.items()})
        if isinstance(obj, list | tuple):
            return ("seq", type(obj), [walk(v, _join(name, i)) for i, v in enumerate(obj)])
        return ("const", obj)

    return leaves, walk(state, prefix)


def rebuild(template: Any, leaves: dict[str, Tensor], constants: dict[str, Any] | None = None) -> Any:
    """The state of ``template`` with its tensors taken from ``leaves`` (and the top-level entries of
    ``constants`` replacing the template's)."""
    kind = template[0]
    if kind == "tensor":
        return leaves[template[1]]
    if kind == "cache":
        return KVCache(leaves[f"{template[1]}_key"], leaves[f"{template[1]}_value"])
    if kind == "cross":
        return KVCache(static=True)
    if kind == "dict":
        out = {k: rebuild(v, leaves) for k, v in template[1].items()}
        return {**out, **(constants or {})}
    if kind == "seq":
        return template[1](rebuild(v, leaves) for v in template[2])
    return template[1]


class StateEncoder(nn.Module):
    """``encode(*inputs)`` -> the state's tensors (those not None), in :attr:`outputs` order."""

    def __init__(self, model: nn.Module, encode: Callable[..., Any], inputs: Sequence[str], outputs: Sequence[str],
                 dynamic: Sequence[dict]):
        super().__init__()
        self.model, self._encode = model, encode
        self.inputs, self.outputs, self.dynamic = tuple(inputs), tuple(outputs), tuple(dynamic)

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        leaves, _ = flatten(self._encode(*inputs))
        # a state tensor that is an encoder input (a mask, the source ids) leaves the graph as its own value
        return tuple(leaves[n] for n in self.outputs)


class StateStep(nn.Module):
    """``(tokens, *state tensors[, ext_slots])`` -> ``(logits, attention, *changed state tensors)``."""

    #: one step: its cell runs once, torch.export traces it (an nn.GRU/nn.LSTM called on one position falls back to
    #: the TorchScript exporter: its decomposition pins the batch size)
    torchscript = "fallback"

    def __init__(self, model: nn.Module, template: Any, names: Sequence[str], carried: Sequence[str],
                 dynamic: Sequence[dict], *, ext_slots: bool = False, constants: dict[str, Any] | None = None):
        super().__init__()
        self.model, self.template, self.names, self.carried = model, template, list(names), list(carried)
        self.ext_slots, self.constants = ext_slots, dict(constants or {})
        self.inputs = ("tokens", *self.names, *(("ext_slots",) if ext_slots else ()))
        self.outputs = ("logits", "attention", *(f"next_{n}" for n in self.carried))
        self.dynamic = tuple(dynamic)

    def forward(self, tokens: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        leaves = dict(zip(self.names, rest[:len(self.names)], strict=True))
        constants = dict(self.constants)
        if self.ext_slots:
            constants["n_ext"] = rest[-1].shape[1]
        state = rebuild(self.template, leaves, constants)
        logits, attention, state = self.model.decode_step(tokens, state)
        new, _ = flatten(state)
        out = (logits.float(), attention.float(), *(new[n] for n in self.carried))
        # an output that is an input (a fixed model's all-zero attention) is a copy: one name per value
        return tuple(o.clone() if any(o is x for x in rest) else o for o in out)


def _changed(a: Tensor, b: Tensor) -> list[int]:
    """The axes after the batch where ``a`` and ``b`` (one state tensor of two examples) differ in size."""
    return [i for i in range(1, a.dim()) if a.shape[i] != b.shape[i]]


def _axes(a: Tensor, b: Tensor, name: str, bound: int | None) -> dict[int, Any]:
    """``{0: batch}`` and every axis of :func:`_changed` (the ``name`` axis, at most ``bound``)."""
    return {0: "batch", **{i: (name, None, bound) for i in _changed(a, b)}}


def state_graphs(model: nn.Module, encode: Callable[..., Any], inputs: Sequence[Tensor], other: Sequence[Tensor],
                 input_names: Sequence[str], input_dynamic: Sequence[dict], *, extra: dict[str, Any],
                 source_bound: int | None = None, past_bound: int | None = None,
                 constants: dict[str, Any] | None = None, step: bool = True):
    """The ``encoder`` (and, with ``step``, ``decoder_step``) graphs of ``model``: ``encode(*inputs)`` gives its
    decoding state; ``other`` are encoder inputs of another source length (to find the dynamic axes);
    ``constants``: state entries set for decoding (a window of frames), baked into the step."""
    from ..data.tokenize import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    with torch.no_grad():
        state = encode(*inputs)
        leaves, _ = flatten(state)
        other_leaves, _ = flatten(encode(*other))
    given = {n: input_names[i] for n, t in leaves.items() for i, x in enumerate(inputs) if t is x}
    outputs = [n for n, t in leaves.items() if t is not None and n not in given]
    enc = StateEncoder(model, encode, input_names, outputs, input_dynamic)
    info = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "unk_id": UNK_ID, **extra,
            "state": {n: {"dtype": str(leaves[n].dtype).removeprefix("torch."),
                          "source_axes": _changed(leaves[n], other_leaves[n])} for n in outputs}}
    graphs = {"encoder": (enc, tuple(inputs), {"kind": "state", "state_inputs": given})}
    if not step:  # an encoder alone (a CTC model): the settings beside it
        graphs["encoder"][2].update(info)
        return graphs
    n_ext = isinstance(state, dict) and "n_ext" in state and bool(getattr(model, "copy", False))
    with torch.no_grad():
        if isinstance(state, dict):
            state = {**state, **(constants or {})}
        if n_ext:
            state["n_ext"] = 2
        for token in (1, 5):  # a past of two positions (a Transformer's caches), made by the model itself
            before, _ = flatten(state)
            _, _, state = model.decode_step(torch.full((2,), token), state)
        after, template = flatten(state)
    names = list(after)
    caches = [n for n in names if n not in leaves or leaves[n] is None]
    carried = [n for n in names if after[n] is not before[n] or n in caches]
    dynamic = [{0: "batch"}]
    for n in names:
        dynamic.append({0: "batch", 2: ("past", None, past_bound)} if n in caches else
                       _axes(leaves[n], other_leaves[n], "source", source_bound))
    args = [torch.full((2,), 6), *(after[n] for n in names)]
    if n_ext:
        args.append(torch.zeros(2, 2, dtype=torch.bool))
        dynamic.append({0: "batch", 1: ("ext", None, None)})
    if caches:
        first = after[caches[0]]
        info["caches"] = {"names": caches, "kv_heads": first.shape[1], "head_dim": first.shape[-1],
                          "dtype": str(first.dtype).removeprefix("torch.")}
    step_module = StateStep(model, template, names, carried, dynamic, ext_slots=n_ext, constants=constants)
    graphs["decoder_step"] = (step_module, tuple(args), {"kind": "state", **info})
    return graphs
