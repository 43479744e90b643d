"""Which path a call of :func:`qkv.attention` takes, and why: one ordered table, one function that reads it.

A call is first described (:class:`Call`, frozen: the checked inputs, the prepared mask, and facts about them);
:func:`choose` then walks :data:`PATHS`, an ordered table of ``(name, supports(call), run(call))`` like
:func:`torch.nn.functional.scaled_dot_product_attention`'s backends, and takes the first path that supports the
call. :func:`qkv.attention` runs that path; :func:`qkv.plan` reports it (:class:`Plan`: the path, the compiled kernel
it runs, whether that kernel is compiled for this call now, and why); :func:`trace_paths` records the name of the path
of every call made inside it. Both read the same :func:`choose`, so what :func:`qkv.plan` says is what runs.

=====================  =====================================================================================
path                   taken when
=====================  =====================================================================================
``sdpa_causal``        dot family, softmax, no weights, ``is_causal`` and no mask, ``Tk <= Tq``: SDPA's causal kernel
``sdpa``               dot family, softmax, no weights: SDPA under the mask
``dot_weights``        dot family, softmax, weights asked for: one matmul, an in-place masked softmax, one matmul
``tiled``              pairwise scores (additive, MLP), softmax, no weights, no gradient: online softmax over tiles
``flex``               modifiers, dot family, softmax, no dropout or weights, FlexAttention compiled for the call
``mod_blocks``         modifiers, dot family, softmax, CPU: a block of the scores at a time (compiled block kernel)
``mod_reference``      modifiers, anything else: the scores whole, the modifiers on broadcast indices
``reference``          anything else: the three stages as written
=====================  =====================================================================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from . import flex, tiling
from .masks import causal_mask
from .paths import chunked
from .paths.common import needs_grad, zero_unseen_keys
from .paths.fast import sdpa, sdpa_causal
from .paths.tiled import online_softmax
from .paths.weights import dot_weights, reference
from .scores import PairwiseScore

__all__ = ["Call", "Path", "Plan", "PATHS", "choose", "plan_of", "trace_paths", "record"]


@dataclass(frozen=True)
class Call:
    """One call of :func:`qkv.attention`, checked and described: what every path's ``supports`` reads."""

    query: Tensor
    key: Tensor
    value: Tensor
    sc: object
    mask: Tensor | None
    allowed: Tensor | None
    bias: Tensor | None
    normalizer: Callable
    dropout: float
    scale: float | None
    is_causal: bool
    return_weights: bool
    key_prepared: bool
    impl: str
    mods: flex.ModCall | None  # the call with score_mod/mask_mod, prepared; None without modifiers
    pair: tuple[Tensor, Tensor] | None  # the dot form (q', k') of the score, None outside the dot family
    fast: bool  # impl "auto", softmax, Tq > 0 and Tk > 0
    use_sdpa: bool  # SDPA may run (the ONNX exporter translates 4-D SDPA only)
    keys_within: bool  # Tk <= Tq as a fact (every key seen by some query under a causal mask)
    traced: bool  # inside torch.compile or torch.export


class Path(NamedTuple):
    name: str
    supports: Callable[[Call], bool]
    run: Callable[[Call], object]
    why: str


@dataclass(frozen=True)
class Plan:
    """What :func:`qkv.attention` does with a call: ``path`` (a name of :data:`PATHS`), ``kernel`` (the compiled
    kernel that path runs, e.g. ``"FLEX"``, ``"BLOCK"``, ``"PAIRED"``; None when it runs none), ``compiled``
    (whether that kernel runs compiled for this call now, rather than its eager code) and ``reason``."""

    path: str
    kernel: str | None
    compiled: bool
    reason: str


def _masked(c: Call) -> tuple[Tensor | None, Tensor, Tensor]:
    """The mask with the causal one folded in, and the keys and values with those no query may see zeroed."""
    allowed, key, value = c.allowed, c.key, c.value
    tq, tk = c.query.shape[-2], key.shape[-2]
    if c.is_causal:
        causal = causal_mask(tq, tk, device=c.query.device)
        allowed = causal if allowed is None else allowed & causal
    if allowed is not None and (c.mask is not None or not c.keys_within):  # causal hides keys only if Tk > Tq
        key, value = zero_unseen_keys(allowed, key, value, c.query.shape[-1])
    return allowed, key, value


def _pair(c: Call, key: Tensor) -> tuple[Tensor, Tensor]:
    return c.pair if key is c.key else c.sc.dot_form(c.query, key, key_prepared=c.key_prepared)


def _run_sdpa(c: Call):
    allowed, key, value = _masked(c)
    q, k = _pair(c, key)
    return sdpa(q, k, value, allowed, c.bias, c.dropout, c.sc.factor(c.query, key, c.scale))


def _run_dot_weights(c: Call):
    allowed, key, value = _masked(c)
    q, k = _pair(c, key)
    return dot_weights(q, k, value, allowed, c.bias, c.normalizer, c.dropout, c.sc.factor(c.query, key, c.scale),
                       c.return_weights, c.query.dtype)


def _run_tiled(c: Call):
    allowed, key, value = _masked(c)
    return online_softmax(c.sc, c.query, key, value, allowed, c.bias, c.sc.factor(c.query, key, c.scale),
                          c.key_prepared)


def _run_reference(c: Call):
    allowed, key, value = _masked(c)
    return reference(c.sc, c.query, key, value, allowed, c.bias, c.normalizer, c.dropout, c.scale, c.key_prepared,
                     c.return_weights)


#: the paths, in the order they are tried: the first whose ``supports`` holds runs
PATHS: tuple[Path, ...] = (
    Path("sdpa_causal", lambda c: (c.mods is None and c.fast and c.pair is not None and c.use_sdpa
                                   and not c.return_weights and c.is_causal and c.mask is None and c.keys_within),
         lambda c: sdpa_causal(c.pair[0], c.pair[1], c.value, c.dropout, c.sc.factor(c.query, c.key, c.scale)),
         "a causal call of the dot family with Tk <= Tq and no mask: SDPA's own causal kernel"),
    Path("sdpa", lambda c: c.mods is None and c.fast and c.pair is not None and not c.return_weights and c.use_sdpa,
         _run_sdpa, "the dot family with softmax and no weights asked for: SDPA on (q', k')"),
    Path("dot_weights", lambda c: c.mods is None and c.fast and c.pair is not None, _run_dot_weights,
         "the dot family with softmax and the weights asked for: one matmul, an in-place softmax, one matmul"),
    Path("tiled", lambda c: (c.mods is None and c.fast and isinstance(c.sc, PairwiseScore) and not c.return_weights
                             and not c.traced and not needs_grad(c.sc, c.query, c.key, c.value)),
         _run_tiled, "a pairwise score in inference: an online softmax over tiles of the scores"),
    Path("flex", lambda c: c.mods is not None and c.mods.fused_ready(), lambda c: flex.run_fused(c.mods),
         "modifiers on the dot family with softmax, no dropout, no weights: FlexAttention, compiled for the call"),
    Path("mod_blocks", lambda c: c.mods is not None and c.mods.blocks(), lambda c: flex.run_reference(c.mods),
         "modifiers on the dot family with softmax on the CPU: a block of the scores at a time"),
    Path("mod_reference", lambda c: c.mods is not None, lambda c: flex.run_reference(c.mods),
         "modifiers: the scores whole, the modifiers on broadcast indices, the masked normalisation"),
    Path("reference", lambda c: True, _run_reference, "any score and normaliser: the three stages as written"),
)


def choose(call: Call) -> Path:
    """The first path of :data:`PATHS` that supports ``call``."""
    for path in PATHS:
        if path.supports(call):
            return path
    raise AssertionError("the reference path supports every call")  # pragma: no cover


def plan_of(call: Call) -> Plan:
    """:class:`Plan` of ``call``: the path :func:`choose` takes, its kernel and whether it is compiled, and why."""
    path = choose(call)
    kernel, signature = _kernel(path.name, call)
    reason = path.why
    if call.mods is not None and call.mods.signature is not None and path.name != "flex":
        reason += ("; FlexAttention could take it and is not compiled for it yet (compiled in the background once "
                   "it pays; QKV_COMPILE=1 compiles it now)")
    if kernel is None:
        return Plan(path.name, None, False, reason)
    on = kernel.use(signature, call.query.device) and (kernel is not flex.FLEX or path.name == "flex")
    return Plan(path.name, _LABELS[id(kernel)], on, reason)


_LABELS = {id(k): n for n, k in (("FLEX", flex.FLEX), ("BLOCK", chunked.BLOCK), ("GRADS", chunked.GRADS),
                                 ("PAIR", tiling.PAIR), ("EXP", tiling.EXP), ("PAIRED", tiling.PAIRED),
                                 ("PAIRED_GRADS", tiling.PAIRED_GRADS))}


def _kernel(name: str, c: Call):
    """The compiled kernel a path runs for ``c`` and its signature, or ``(None, None)``."""
    if name == "flex":
        return flex.FLEX, c.mods.signature
    if name == "mod_blocks":
        m = c.mods
        if m.dropout > 0 or (m.grad and m.return_weights) or (m.bias is not None and m.bias.requires_grad):
            return None, None  # the checkpointed stages: no compiled kernel
        return (chunked.GRADS if m.grad else chunked.BLOCK), m.block_signature()
    if name in ("tiled", "reference") and isinstance(c.sc, PairwiseScore) and not c.traced:
        qp = c.sc.query_proj(c.query)
        kp = c.key if c.key_prepared else c.sc.key_proj(c.key)
        return tiling.kernel_for(qp, kp, c.sc.fused_form(), c.sc.max_elements, whole=name == "reference")
    return None, None


# ------------------------------------------------------------------------------------------------ tracing

_tracers = threading.local()


def record(name: str) -> None:
    """Add ``name`` to every :func:`trace_paths` open in this thread."""
    for taken in getattr(_tracers, "open", ()):
        taken.append(name)


@contextmanager
def trace_paths():
    """``with qkv.trace_paths() as taken:``: ``taken`` is the list of the path names (:data:`PATHS`) of the calls of
    :func:`qkv.attention` made inside, in order, in this thread."""
    taken: list[str] = []
    stack = _tracers.__dict__.setdefault("open", [])
    stack.append(taken)
    try:
        yield taken
    finally:
        stack.remove(taken)
