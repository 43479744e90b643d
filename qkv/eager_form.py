"""The fused form of a pairwise score (``sum_h w_h act(qp_ih + kp_jh) + b``, :mod:`qkv.tiling`) without a compiler:
eager operations on chunks of the ``(rows, keys, hidden)`` pre-activations small enough to stay in the CPU's cache.

The textbook formula makes the whole ``(..., Tq, Tk, hidden)`` tensor and reads and writes it several times from
memory: the sum, the activation, the product with ``w``. Here one buffer of :data:`CHUNK` elements is written by
one fused operation, changed in place by the activation and reduced by a matrix-vector product while it is still in
the cache; no autograd state is kept (inference only). ``tanh`` and ``sigmoid`` come from the factors
``exp(2 qp)``, ``exp(2 kp)`` of :func:`qkv.tiling._factored` where they apply: ``1 + eq_ih ek_jh`` in one
``addcmul`` and a reciprocal in place, no transcendental function per pair (on a CPU ``tanh`` costs about 20 times
a multiply-add per element).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CHUNK", "usable", "scores"]

#: elements of the ``(rows, keys, hidden)`` buffer per chunk: 8 MiB in float32, within a CPU's L3 cache. On one
#: thread chunks of 2**17 (L2) were 7% faster, but each operation is a parallel region of the intra-op threads, and
#: on a loaded machine two threads took 6x longer with the 16x more regions of the small chunks (measured, B=8,
#: T=512, hidden 256)
CHUNK = 1 << 21

_IN_PLACE = {"Tanh": torch.tanh_, "ReLU": torch.relu_, "Sigmoid": torch.sigmoid_,
             "SiLU": lambda t: F.silu(t, inplace=True), "GELU": F.gelu}


def usable(form, qp: Tensor, kp: Tensor) -> bool:
    """Whether :func:`scores` may compute these tiles: a fused form, on the CPU, in float32 or float64, with no
    gradient to record."""
    if form is None or form[2] not in _IN_PLACE or qp.device.type != "cpu":
        return False
    if qp.dtype not in (torch.float32, torch.float64) or kp.dtype != qp.dtype or form[0].dtype != qp.dtype:
        return False
    tensors = [qp, kp, form[0]] + ([form[1]] if isinstance(form[1], Tensor) else [])
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def scores(a: Tensor, c: Tensor, form, factored: bool) -> Tensor:
    """``sum_h w_h act(qp_ih + kp_jh) (+ b)``: ``(..., cq, H)``, ``(..., ck, H)`` -> ``(..., cq, ck)``. ``a``, ``c``:
    the projections ``qp``, ``kp``, or with ``factored`` their factors of :func:`qkv.tiling._factored`."""
    w, b, act = form
    lead = torch.broadcast_shapes(a.shape[:-2], c.shape[:-2])
    tq, tk, hidden = a.shape[-2], c.shape[-2], a.shape[-1]
    n = math.prod(lead)
    a3 = a.expand(*lead, tq, hidden).reshape(n, tq, hidden)
    c3 = c.expand(*lead, tk, hidden).reshape(n, tk, hidden)
    out = a.new_empty(n, tq, tk)
    ck = max(1, min(tk, CHUNK // hidden))
    cq = max(1, min(tq, CHUNK // (hidden * ck)))
    buf = a.new_empty(cq * ck * hidden)
    one = a.new_ones(())
    whole = ck == tk
    with torch.no_grad():
        for x in range(n):
            for i in range(0, tq, cq):
                r = min(cq, tq - i)
                for j in range(0, tk, ck):
                    s = min(ck, tk - j)
                    t = buf[:r * s * hidden].view(r, s, hidden)
                    qi, kj = a3[x, i:i + r, None, :], c3[x, None, j:j + s, :]
                    if factored:  # 1 / (1 + eq ek)
                        torch.addcmul(one, qi, kj, out=t)
                        t.reciprocal_()
                    else:
                        torch.add(qi, kj, out=t)
                        t = _IN_PLACE[act](t)
                    if whole:
                        torch.mv(t.view(r * s, hidden), w, out=out[x, i:i + r].view(-1))
                    else:
                        out[x, i:i + r, j:j + s] = t @ w
        if factored and act == "Tanh":  # tanh(x) = 1 - 2 / (1 + exp(2x))
            out.mul_(-2).add_(w.sum())
        if b is not None:
            out.add_(b)
    return out.view(*lead, tq, tk)
