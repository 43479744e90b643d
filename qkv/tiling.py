"""Pairwise scores (additive, MLP) under a memory bound: the tiles of ``pair(qp_i + kp_j)``.

A pairwise score is ``pair(W_q q_i + W_k k_j + b)``: a small network ``pair`` on the hidden pre-activations of every
``(query, key)`` pair. The textbook formula materialises the ``(..., Tq, Tk, hidden)`` pre-activations. Here they
are computed in tiles of at most ``max_elements`` elements; when gradients are needed each tile is recomputed in the
backward pass instead of stored (activation checkpointing), so memory stays bounded in training too.

Where the rest of the network is one elementwise layer and a dot product (``sum_h w_h act(qp_h + kp_h) + b``: the
*fused form* of ``Additive`` and of a one-layer ``MLP``) and compiling pays (:mod:`qkv.compiled`), a tile is one
fused kernel that never holds the ``(cq, ck, hidden)`` tile, forward or backward; its tiles are then bounded by
``max_elements`` scores (not pre-activations), so there are few of them. ``tanh`` and ``sigmoid`` are computed
there through ``exp(2 qp) * exp(2 kp) = exp(2 (qp + kp))``: a multiply and a division per pair and hidden unit
instead of a transcendental function, and while the values allow, one division per two hidden units
(:func:`_factored`, :func:`_paired_kernel`), in training too, with a backward pass of its own
(:class:`_PairedTraining`).

This module knows tensors and functions only; :class:`qkv.scores.PairwiseScore` projects its inputs and calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import compiled, eager_form
from .background import compiling

__all__ = ["DEFAULT_MAX_ELEMENTS", "GPU_MAX_ELEMENTS", "FUSED_MIN_ELEMENTS", "ACTIVATIONS", "max_elements_for",
           "tile_sizes", "tiles", "tiled_scores", "FUSED", "kernel_for"]

#: default tile bound of the pairwise scores on a CPU: 2**24 elements of the ``(..., Tq, Tk, hidden)`` tensor per
#: tile (64 MiB in float32)
DEFAULT_MAX_ELEMENTS = 1 << 24
#: the bound on a GPU, where tiles of 16 M elements ran ~7x slower than the textbook formula (which is a few large
#: kernels there): 128 M elements (256 MiB in bfloat16), 0.7-0.9x the textbook's speed at a quarter of its memory for
#: B=8, T=512, hidden 256 on an H200 (BENCHMARKS.md)
GPU_MAX_ELEMENTS = 1 << 27
#: pairwise tiles of at least this many ``(query, key, hidden)`` elements may use the compiled fused kernel (smaller
#: ones are cheaper eager than any compilation)
FUSED_MIN_ELEMENTS = 1 << 20

#: elementwise activations the fused kernel knows, by module class name
ACTIVATIONS = {"Tanh": torch.tanh, "ReLU": torch.relu, "GELU": F.gelu, "SiLU": F.silu, "Sigmoid": torch.sigmoid}

#: the form of a fused pairwise score: ``(w (hidden,), b (scalar) or None, activation name)``
FusedForm = tuple[Tensor, Tensor | None, str]

#: the factored kernel is used while every pre-activation lies within +-20 (exp(2 * 20) squared stays finite in
#: float32); beyond, the plain one
FACTOR_LIMIT = 20.0
#: the paired form of the factored tanh (two hidden units per division) while every pre-activation lies within +-10:
#: the product of two denominators, each up to 1 + exp(40), stays finite in float32
PAIRED_LIMIT = 10.0


def _absmax(t: Tensor) -> float:
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t)  # one pass, no temporary
    return max(-lo.item(), hi.item())


def _factored(act: str, qp: Tensor, kp: Tensor) -> tuple[Tensor, Tensor, bool] | None:
    """``(eq, ek, paired)`` with ``act(qp_i + kp_j)`` a cheap function of ``eq_i * ek_j``, or None where that does not
    hold exactly: ``tanh(x) = 1 - 2 / (1 + exp(2x))`` and ``sigmoid(x) = 1 / (1 + exp(-x))``, with ``exp(2 (a + b)) =
    exp(2a) exp(2b)``. Only on the CPU in float32/float64 (a GPU computes ``tanh`` as fast), and only while every
    ``|qp|``, ``|kp|`` is within :data:`FACTOR_LIMIT` (so that no product overflows). ``paired``: the hidden size
    is even and the values within :data:`PAIRED_LIMIT` (tanh), so :func:`_paired_kernel` may add two units per
    division (and :class:`_PairedTraining` differentiate it)."""
    if (act not in ("Tanh", "Sigmoid") or qp.device.type != "cpu" or qp.dtype not in (torch.float32, torch.float64)
            or compiling()):
        return None
    with torch.no_grad():
        bound = max(_absmax(qp), _absmax(kp))
    if bound > FACTOR_LIMIT:
        return None
    paired = qp.shape[-1] % 2 == 0 and bound <= (PAIRED_LIMIT if act == "Tanh" else FACTOR_LIMIT)
    if act == "Tanh":
        return torch.exp(2 * qp), torch.exp(2 * kp), paired
    return torch.exp(-qp), torch.exp(-kp), paired


def _pair_kernel(qp: Tensor, kp: Tensor, w: Tensor, b: Tensor | None, act: str) -> Tensor:
    """``sum_h w_h act(qp[..., i, h] + kp[..., j, h]) (+ b)``: ``(..., cq, H)``, ``(..., ck, H)`` -> ``(..., cq, ck)``.
    Compiled, the broadcast sum, the activation and the reduction are one loop: no ``(cq, ck, H)`` tensor."""
    s = (ACTIVATIONS[act](qp[..., :, None, :] + kp[..., None, :, :]) * w).sum(-1)
    return s if b is None else s + b


def _exp_kernel(eq: Tensor, ek: Tensor, w: Tensor, b: Tensor | None, act: str) -> Tensor:
    """:func:`_pair_kernel` from the factors of :func:`_factored`: ``sum_h w_h / (1 + eq_ih ek_jh)`` and a constant."""
    r = (w / (1 + eq[..., :, None, :] * ek[..., None, :, :])).sum(-1)
    s = w.sum() - 2 * r if act == "Tanh" else r
    return s if b is None else s + b


def _paired_kernel(eqa: Tensor, eqb: Tensor, eka: Tensor, ekb: Tensor, wa: Tensor, wb: Tensor, b: Tensor | None,
                   act: str) -> Tensor:
    """:func:`_exp_kernel` with two hidden units per division: the division bounds that loop (one per pair and hidden
    unit), so unit ``h`` of the first half and unit ``h`` of the second share one, ``w_a / d_a + w_b / d_b =
    (w_a d_b + w_b d_a) / (d_a d_b)``. The halves come as contiguous tensors (sliced inside the kernel, its loads
    ran 1.6x slower); 2x faster than :func:`_exp_kernel` on a CPU, measured."""
    da = 1 + eqa[..., :, None, :] * eka[..., None, :, :]
    db = 1 + eqb[..., :, None, :] * ekb[..., None, :, :]
    r = ((wa * db + wb * da) / (da * db)).sum(-1)
    s = wa.sum() + wb.sum() - 2 * r if act == "Tanh" else r
    return s if b is None else s + b


def _paired_grads(eqa: Tensor, eqb: Tensor, eka: Tensor, ekb: Tensor, g: Tensor, weights: bool) -> tuple[Tensor, ...]:
    """For the backward pass of :func:`_paired_kernel`, sums over the query rows ``i`` (``r = 1 / (1 + eq_ih ek_jh)``,
    one division per two hidden units): ``sum_i g_ij r_ijh^2 eq_ih`` for both halves, and with ``weights`` also
    ``sum_i g_ij r_ijh``; ``(..., ck, h)`` each. The queries' sums are the same with the roles of queries and keys
    swapped and ``g`` transposed. Inductor's loop is sensitive to how this is written: ``g / (da db)`` instead of
    ``g * (1 / (da db))`` ran 15-20x slower, measured."""
    da = 1 + eqa[..., :, None, :] * eka[..., None, :, :]
    db = 1 + eqb[..., :, None, :] * ekb[..., None, :, :]
    inv = 1 / (da * db)
    ra, rb = db * inv, da * inv
    gg = g[..., None]
    factors = (gg * ra * ra * eqa[..., :, None, :]).sum(-3), (gg * rb * rb * eqb[..., :, None, :]).sum(-3)
    if not weights:
        return factors
    return *factors, (gg * db * inv).sum(-3), (gg * da * inv).sum(-3)


PAIR = compiled.Kernel("the pairwise (MLP) kernel", _pair_kernel, cold_seconds=30.0, saving=0.5,
                       options={"dynamic": True})
EXP = compiled.Kernel("the additive kernel", _exp_kernel, cold_seconds=30.0, saving=0.6, options={"dynamic": True})
PAIRED = compiled.Kernel("the additive kernel (two units per division)", _paired_kernel, cold_seconds=30.0,
                         saving=0.8, options={"dynamic": True})
PAIRED_GRADS = compiled.Kernel("the additive kernel's backward", _paired_grads, cold_seconds=30.0,
                              options={"dynamic": True})
#: the compiled kernels of the fused form, by whether the activation factors through exp
FUSED = {False: PAIR, True: EXP}
#: query rows per eager chunk of a backward kernel that could not be compiled: at most this many ``(i, j, h)`` terms
_EAGER_TERMS = 1 << 22


def _grad_sums(signature, eqa: Tensor, eqb: Tensor, eka: Tensor, ekb: Tensor, g: Tensor,
               weights: bool) -> tuple[Tensor, ...]:
    """:func:`_paired_grads`, compiled; if compiling fails, eager in chunks of query rows small enough never to hold
    more than :data:`_EAGER_TERMS` terms."""
    if compiled.available(g.device):
        return PAIRED_GRADS.run(signature, lambda *a: _grad_rows(*a), eqa, eqb, eka, ekb, g, weights,
                                on_fail=_off(PAIRED_GRADS.name))
    return _grad_rows(eqa, eqb, eka, ekb, g, weights)


def _grad_rows(eqa: Tensor, eqb: Tensor, eka: Tensor, ekb: Tensor, g: Tensor, weights: bool) -> tuple[Tensor, ...]:
    lead = math.prod(g.shape[:-2])
    rows = max(1, _EAGER_TERMS // max(1, lead * g.shape[-1] * eqa.shape[-1]))
    sums = [g.new_zeros((*g.shape[:-2], g.shape[-1], eqa.shape[-1])) for _ in range(4 if weights else 2)]
    for i in range(0, g.shape[-2], rows):
        part = _paired_grads(eqa[..., i:i + rows, :], eqb[..., i:i + rows, :], eka, ekb, g[..., i:i + rows, :], weights)
        sums = [s + p for s, p in zip(sums, part, strict=True)]
    return tuple(sums)


class _PairedTraining(torch.autograd.Function):
    """:func:`_paired_kernel` with a backward pass of its own: the gradients of the factors and of the output
    weights in two compiled passes of :func:`_paired_grads` (over the query rows, then over the key rows), each with
    one division per two hidden units, no ``(cq, ck, hidden)`` tensor (inductor's own backward of the paired form ran
    4.7x slower than the single form's, measured). ``c``: ``d score / d r`` per unit weight (-2 for tanh, 1 for
    sigmoid)."""

    @staticmethod
    def forward(ctx, eqa, eqb, eka, ekb, wa, wb, b, act, signature, name="pairwise score"):
        ctx.act, ctx.signature, ctx.b_shape = act, signature, None if b is None else b.shape
        ctx.save_for_backward(eqa, eqb, eka, ekb, wa, wb)
        return PAIRED.run(signature, lambda *a: _eager_rows(PAIRED.fn, a, 2), eqa, eqb, eka, ekb, wa, wb, b, act,
                          on_fail=_off(name))

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        eqa, eqb, eka, ekb, wa, wb = ctx.saved_tensors
        need = ctx.needs_input_grad
        g = g.contiguous()
        c = -2.0 if ctx.act == "Tanh" else 1.0
        grads = [None] * len(need)
        weights = need[4] or need[5]
        if need[2] or need[3] or weights:  # d s / d ek_jh = -c w_h sum_i g_ij r_ijh^2 eq_ih; d s / d w_h = c r_ijh
            sums = _grad_sums(ctx.signature, eqa, eqb, eka, ekb, g, weights)
            grads[2], grads[3] = (-c * wa * sums[0]).sum_to_size(eka.shape), (-c * wb * sums[1]).sum_to_size(ekb.shape)
            if weights:  # (+ 1 for tanh)
                total, hidden = (g.sum() if ctx.act == "Tanh" else 0.0), wa.shape[-1]
                grads[4] = (c * sums[2].reshape(-1, hidden).sum(0) + total).reshape(wa.shape)
                grads[5] = (c * sums[3].reshape(-1, hidden).sum(0) + total).reshape(wb.shape)
        if need[0] or need[1]:  # the same with the queries as keys
            sums = _grad_sums(ctx.signature, eka, ekb, eqa, eqb, g.transpose(-1, -2).contiguous(), False)
            grads[0], grads[1] = (-c * wa * sums[0]).sum_to_size(eqa.shape), (-c * wb * sums[1]).sum_to_size(eqb.shape)
        if need[6]:
            grads[6] = g.sum().reshape(ctx.b_shape)
        return tuple(grads)


def max_elements_for(device: torch.device | str, max_elements: int | None) -> int:
    """``max_elements``, or when None the default bound of ``device``'s kind: :data:`DEFAULT_MAX_ELEMENTS` on a CPU,
    :data:`GPU_MAX_ELEMENTS` elsewhere."""
    if max_elements is not None:
        return max_elements
    return DEFAULT_MAX_ELEMENTS if torch.device(device).type == "cpu" else GPU_MAX_ELEMENTS


def tile_sizes(tq: int, tk: int, lead: int, hidden: int, max_elements: int) -> tuple[int, int]:
    """``(cq, ck)``: query and key rows per tile so that ``lead * cq * ck * hidden <= max_elements`` (at least 1
    each, even for empty axes)."""
    per_pair = max(1, lead * hidden)
    ck = max(1, min(tk, max_elements // (per_pair * max(tq, 1))))
    cq = max(1, min(tq, max_elements // (per_pair * ck)))
    return cq, ck


def _signature(form: FusedForm, qp: Tensor) -> tuple:
    return (form[2], form[1] is None, qp.device.type, qp.dtype, torch.is_grad_enabled() and qp.requires_grad)


def _fusable(form: FusedForm | None, qp: Tensor, elements: int) -> bool:
    """Whether the fused kernel may run: on the CPU (on a GPU, inductor's reduction over the hidden units ran 4x
    slower than the eager tiles, which are memory-bound there: see BENCHMARKS.md), or inside a caller's
    compilation, for tiles large enough."""
    device_ok = qp.device.type == "cpu" or compiling()
    return (form is not None and device_ok and elements >= FUSED_MIN_ELEMENTS and qp.dtype != torch.float16
            and compiled.available(qp.device))


def kernel_for(qp: Tensor, kp: Tensor, form: FusedForm | None, max_elements: int | None, whole: bool = False
               ) -> tuple[compiled.Kernel | None, tuple | None]:
    """The fused kernel :func:`tiles` (``whole``: :func:`tiled_scores`) runs for these projections and its signature,
    or ``(None, None)`` when they run the eager tiles only."""
    tq, tk, hidden = qp.shape[-2], kp.shape[-2], qp.shape[-1]
    lead = math.prod(torch.broadcast_shapes(qp.shape[:-2], kp.shape[:-2]))
    max_elements = max_elements_for(qp.device, max_elements)
    cq, ck = tile_sizes(tq, tk, lead, hidden, max_elements)
    if whole and (compiling() or (((cq >= tq and ck >= tk) or tq == 0 or tk == 0) and (
            lead * tq * tk * hidden < FUSED_MIN_ELEMENTS or form is None))):
        return None, None
    if not _fusable(form, qp, lead * min(cq, tq) * min(ck, tk) * hidden):
        return None, None
    factors = _factored(form[2], qp, kp)
    paired = factors is not None and factors[2]
    return (PAIRED if paired else FUSED[factors is not None]), _signature(form, qp)


def tiles(qp: Tensor, kp: Tensor, pair: Callable[[Tensor], Tensor], form: FusedForm | None, max_elements: int | None,
          name: str = "pairwise score") -> Iterator[tuple[slice, slice, Tensor]]:
    """Yield ``(query_rows, key_rows, scores)`` of ``pair(qp_i + kp_j)`` tile by tile, never holding more than one
    tile: ``qp (..., Tq, H)``, ``kp (..., Tk, H)`` (the projected queries and keys); ``pair`` maps a fresh tile
    ``(..., cq, ck, H)`` (which it may overwrite) to ``(..., cq, ck)``; ``form`` its fused form or None."""
    tq, tk, hidden = qp.shape[-2], kp.shape[-2], qp.shape[-1]
    lead = math.prod(torch.broadcast_shapes(qp.shape[:-2], kp.shape[:-2]))
    max_elements = max_elements_for(qp.device, max_elements)
    cq, ck = tile_sizes(tq, tk, lead, hidden, max_elements)
    fused = _fusable(form, qp, lead * min(cq, tq) * min(ck, tk) * hidden)
    kernel = signature = None
    if fused:
        factors = _factored(form[2], qp, kp)
        paired = factors is not None and factors[2]
        kernel, signature = PAIRED if paired else FUSED[factors is not None], _signature(form, qp)
        fused = kernel.use(signature, qp.device)
        fcq, fck = tile_sizes(tq, tk, lead, 1, max_elements)  # the kernel holds (cq, ck) scores only
        if paired:  # the halves of the hidden units, each contiguous
            h = hidden // 2
            a, b, w = ((t[..., :h].contiguous(), t[..., h:].contiguous()) for t in (factors[0], factors[1], form[0]))
        else:
            a, b, w = ((factors[0],), (factors[1],), (form[0],)) if factors is not None else ((qp,), (kp,), (form[0],))

        def args_of(qi: slice, kj: slice) -> tuple:
            return (*(t[..., qi, :] for t in a), *(t[..., kj, :] for t in b), *w, form[1], form[2])

        def eager(*args):
            return _eager_rows(kernel.fn, args, len(a))

    if fused:
        grad = paired and torch.is_grad_enabled()
        for i in range(0, tq, fcq):
            qi = slice(i, min(i + fcq, tq))
            for j in range(0, tk, fck):
                kj = slice(j, min(j + fck, tk))
                args = args_of(qi, kj)
                yield qi, kj, (_PairedTraining.apply(*args, signature, name) if grad
                               else kernel.run(signature, eager, *args, on_fail=_off(name)))
        return
    remat = torch.is_grad_enabled() and (cq < tq or ck < tk)
    example = (lambda: (args_of(slice(0, min(fcq, tq)), slice(0, min(fck, tk))), {})) if kernel is not None else None
    ctx = kernel.eager(signature, qp.device, example) if kernel is not None else _nothing()
    if eager_form.usable(form, qp, kp):  # inference on the CPU: the fused form in chunks that stay in the cache
        factors = factors if kernel is not None else _factored(form[2], qp, kp)
        left, right = (qp, kp) if factors is None else factors[:2]  # (a, b: what the example's arguments read)
        fcq, fck = tile_sizes(tq, tk, lead, 1, max_elements)
        with ctx:
            for i in range(0, tq, fcq):
                qi = slice(i, min(i + fcq, tq))
                for j in range(0, tk, fck):
                    kj = slice(j, min(j + fck, tk))
                    yield qi, kj, eager_form.scores(left[..., qi, :], right[..., kj, :], form, factors is not None)
        return
    with ctx:
        for i in range(0, tq, cq):
            qi = slice(i, min(i + cq, tq))
            for j in range(0, tk, ck):
                kj = slice(j, min(j + ck, tk))
                if remat:
                    s = checkpoint(_tile, pair, qp[..., qi, :], kp[..., kj, :], use_reentrant=False)
                else:
                    s = _tile(pair, qp[..., qi, :], kp[..., kj, :])
                yield qi, kj, s


def _off(name: str) -> Callable[[BaseException], None]:
    return lambda e: compiled.failed(e, f"the {name}")


def _eager_rows(fn: Callable, args: tuple, per_side: int) -> Tensor:
    """A fused kernel's function run eager on a tile, in chunks of query rows that never hold more than
    :data:`_EAGER_TERMS` ``(i, j, h)`` terms (the function itself holds a ``(cq, ck, hidden)`` tensor)."""
    qs, rest = args[:per_side], args[per_side:]
    cq, ck, hidden = qs[0].shape[-2], rest[0].shape[-2], qs[0].shape[-1] * per_side
    lead = math.prod(torch.broadcast_shapes(qs[0].shape[:-2], rest[0].shape[:-2]))
    rows = max(1, _EAGER_TERMS // max(1, lead * ck * hidden))
    if rows >= cq:
        return fn(*args)
    return torch.cat([fn(*(t[..., i:i + rows, :] for t in qs), *rest) for i in range(0, cq, rows)], dim=-2)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _tile(pair: Callable[[Tensor], Tensor], qp: Tensor, kp: Tensor) -> Tensor:
    return pair(qp[..., :, None, :] + kp[..., None, :, :])


def tiled_scores(qp: Tensor, kp: Tensor, pair: Callable[[Tensor], Tensor], form: FusedForm | None,
                 max_elements: int | None, name: str = "pairwise score") -> Tensor:
    """The raw scores ``(..., Tq, Tk)``: one eager tile when it fits and is too small to fuse, else tile by tile."""
    if compiling():  # traced by torch.compile or torch.export: one tile (its sizes are symbolic)
        return _tile(pair, qp, kp)
    tq, tk, hidden = qp.shape[-2], kp.shape[-2], qp.shape[-1]
    lead = math.prod(torch.broadcast_shapes(qp.shape[:-2], kp.shape[:-2]))
    max_elements = max_elements_for(qp.device, max_elements)
    cq, ck = tile_sizes(tq, tk, lead, hidden, max_elements)
    one = (cq >= tq and ck >= tk) or tq == 0 or tk == 0  # one tile (an empty one holds no elements)
    if one and (lead * tq * tk * hidden < FUSED_MIN_ELEMENTS or form is None):
        return _tile(pair, qp, kp)
    rows, row = [], []
    for _, kj, s in tiles(qp, kp, pair, form, max_elements, name):
        row.append(s)
        if kj.stop == tk:
            rows.append(torch.cat(row, dim=-1))
            row = []
    return torch.cat(rows, dim=-2)
