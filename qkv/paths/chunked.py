"""Attention with score and mask modifiers on the CPU, a block of the scores at a time, with or without the weights,
forward and backward.

The reference path builds the whole ``(B, H, Tq, Tk)`` scores and passes over them five or six times (matmul,
score modifier, mask modifier on broadcast indices, masked softmax, weighted sum): each pass a trip through main
memory. Here the scores are made a block at a time (:data:`BLOCK_ELEMENTS` scores: one batch row, a few heads, and
all the query rows unless a head is larger), small enough to stay in the CPU's caches, and each block goes through
three steps:

1. ``s = (factor q) k^T``: a matrix product (BLAS);
2. :func:`block_probs`: the score modifier's arithmetic, the bias, the mask (the mask modifier and ``keep``) and the
   softmax of the block, with its log-sum-exp: one function, which qkv compiles into one fused loop once that pays
   (:data:`BLOCK`, :mod:`qkv.compiled`; until then, and with ``QKV_COMPILE=0``, it runs as eager operations);
3. ``w v``: a matrix product (BLAS).

Only the weights that are returned ever reach main memory.

With gradients, a custom autograd function (:class:`_Blocks`) keeps only the output and the log-sum-exp of every
query row; its backward pass recomputes each block as FlashAttention-2 does (Dao, 2023,
https://arxiv.org/abs/2307.08691): ``s`` and ``dP = dO v^T`` by BLAS, then :func:`block_grads` (compiled like
:func:`block_probs`: :data:`GRADS`) gives the probabilities ``p = exp(mod(s) - lse)`` (masked) and
``dS = p (dP - rowsum(dO o))`` taken back through the score modifier (``torch.func.vjp``), then ``dv += p^T dO``,
``dq = factor dS k``, ``dk += dS^T (factor q)`` by BLAS. Memory holds the inputs, the output and ``(B, H, Tq)``
log-sum-exps, never the ``(Tq, Tk)`` scores. Tensors a score modifier learns (T5's bias table, or any tensor its
closure holds that requires gradients) are found from one call of it on a single score, and get their gradients
from the recomputed blocks.

Dropout, weights that are themselves differentiated and a bias that requires gradients take the stages as separate
eager operations per block, checkpointed (:func:`_checkpointed`).

The modifiers come wrapped by :mod:`qkv.flex` (shifted by ``q_offset`` and checked); this module knows callables
``score_fn(scores, b, h, q_idx, kv_idx)`` and ``mask_fn(b, h, q_idx, kv_idx)`` on broadcast indices.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from .. import compiled
from ..normalize import softmax
from .common import masked_normalize, work_dtype

__all__ = ["chunked", "block_probs", "block_grads", "BLOCK", "GRADS", "BLOCK_ELEMENTS"]

#: scores per block (4 MiB in float32: a block's passes stay in a CPU's L2/L3 caches)
BLOCK_ELEMENTS = 1 << 20
#: query rows per block at least (fewer would make the two matrix products of a block too thin to run fast)
MIN_ROWS = 128
#: query rows per block under a mask (the keys that no row of a block may see are skipped: the finer, the more)
MASKED_ROWS = 128
#: mask entries evaluated at once to find the keys each block needs (16 MiB of booleans)
MASK_ELEMENTS = 1 << 24

_INF = float("inf")


def _indices(shape, at: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The broadcast indices ``b (1,1,1,1)``, ``h (1,hb,1,1)``, ``q_idx (1,1,rows,1)``, ``kv_idx (1,1,1,tk)`` of a
    block of ``shape (1, hb, rows, tk)`` that starts at batch row ``at[0]``, head ``at[1]``, query row ``at[2]`` and key
    ``at[3]``."""
    hb, rows, tk = shape[1], shape[2], shape[3]
    b = at[0].view(1, 1, 1, 1)
    h = (torch.arange(hb, device=at.device) + at[1]).view(1, hb, 1, 1)
    q = (torch.arange(rows, device=at.device) + at[2]).view(1, 1, rows, 1)
    kv = (torch.arange(tk, device=at.device) + at[3]).view(1, 1, 1, tk)
    return b, h, q, kv


def _allowed(idx, keep: Tensor | None, mask_mod: Callable | None) -> Tensor | None:
    if mask_mod is None:
        return keep
    m = mask_mod(*idx)
    return m if keep is None else keep & m


def block_probs(s: Tensor, at: Tensor, keep: Tensor | None, bias: Tensor | None, score_mod: Callable | None,
                mask_mod: Callable | None, dest: Tensor) -> Tensor:
    """The weights of a block of scaled scores ``s (1, hb, rows, tk)``, written into ``dest`` (which may be ``s``
    itself: a compiled kernel then overwrites the scores where they lie, in one loop), and the log-sum-exp of its
    rows ``(1, hb, rows, 1)``, returned: ``softmax(score_mod(s) + bias)`` over the keys that ``keep`` and
    ``mask_mod`` allow. A row with no allowed key (or only scores of ``-inf``) gets zero weights and a log-sum-exp of
    ``+inf`` (so that ``exp(s - lse)`` is zero there too)."""
    idx = _indices(s.shape, at)
    if score_mod is not None:
        s = score_mod(s, *idx)
    if bias is not None:
        s = s + bias
    allowed = _allowed(idx, keep, mask_mod)
    if allowed is not None:
        s = torch.where(allowed, s, -_INF)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(m == -_INF, 0.0, m)
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    dest.copy_(_flushed(p / torch.where(total > 0, total, 1.0)))
    return torch.where(total > 0, m + torch.log(total), _INF)


def _flushed(p: Tensor) -> Tensor:
    """Probabilities below the smallest normal number of their dtype set to zero (a change of less than 1.2e-38 in
    float32). Subnormal numbers make the CPU's matrix products that read the weights several times slower (measured:
    4x for ``w v`` under ALiBi, whose far keys get weights of 1e-40); they arise wherever a score sits about 87
    below its row's maximum."""
    return torch.where(p >= torch.finfo(p.dtype).tiny, p, 0.0)


def block_grads(s: Tensor, at: Tensor, keep: Tensor | None, bias: Tensor | None, score_mod: Callable | None,
                mask_mod: Callable | None, lse: Tensor, dp: Tensor, delta: Tensor, modified: bool) -> Tensor | None:
    """The backward pass of a block: from the scaled scores ``s``, the log-sum-exp ``lse`` of the forward pass,
    ``dp = dO v^T`` and ``delta = rowsum(dO o)``: the probabilities ``p``, written over ``s``, and ``ds``, the gradient
    of the loss with respect to ``s`` (through ``score_mod``), written over ``dp``; with ``modified``, the gradient
    with respect to the modified scores is returned (for the tensors the modifier learns)."""
    idx = _indices(s.shape, at)
    if score_mod is not None:
        sm, back = torch.func.vjp(lambda x: score_mod(x, *idx), s)
    else:
        sm = s
    if bias is not None:
        sm = sm + bias
    p = _flushed(torch.exp(sm - lse))
    allowed = _allowed(idx, keep, mask_mod)
    if allowed is not None:
        p = torch.where(allowed, p, 0.0)
    dsm = p * (dp - delta)
    ds = back(dsm)[0] if score_mod is not None else dsm
    s.copy_(p)
    dp.copy_(ds)
    return dsm if modified else None


#: :func:`block_probs` compiled (one kernel per pair of modifiers, any block size)
BLOCK = compiled.Kernel("the modifier block kernel", block_probs, cold_seconds=20.0, saving=0.6,
                        options={"dynamic": True})
#: :func:`block_grads` compiled
GRADS = compiled.Kernel("the modifier block kernel (backward)", block_grads, cold_seconds=25.0, saving=0.6,
                        options={"dynamic": True})


def _pick(t: Tensor | None, bi: int, h0: int, h1: int, i0: int, i1: int, j0: int = 0, j1: int | None = None
          ) -> Tensor | None:
    """The block ``[bi, h0:h1, i0:i1, j0:j1]`` of a 4-D tensor broadcastable to the scores (size-1 axes kept)."""
    if t is None:
        return None
    b = slice(bi, bi + 1) if t.shape[0] > 1 else slice(None)
    h = slice(h0, h1) if t.shape[1] > 1 else slice(None)
    r = slice(i0, i1) if t.shape[2] > 1 else slice(None)
    c = slice(j0, j1) if t.shape[3] > 1 else slice(None)
    return t[b, h, r, c]


def _grad_leaves(score_fn: Callable | None, work: torch.dtype, device) -> list[Tensor] | None:
    """The tensors requiring gradients that ``score_fn`` depends on (the leaves of its autograd graph, from one call
    on a single score), or None when it depends on none."""
    if score_fn is None:
        return None
    zero = torch.zeros((1, 1, 1, 1), dtype=torch.long, device=device)
    with torch.enable_grad():
        probe = score_fn(torch.zeros((1, 1, 1, 1), dtype=work, device=device), zero, zero, zero, zero)
    if not probe.requires_grad:
        return None
    leaves, seen, todo = [], set(), [probe.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if var is not None:
            leaves.append(var)
        todo.extend(n for n, _ in node.next_functions)
    return leaves


class _Plan:
    """One call's blocks: the block spans (with the range of keys that the masks leave to each), and which kernels
    run them."""

    def __init__(self, q, k, v, factor, score_fn, mask_fn, keep, bias, out_dtype, mods, key, on_fail, grad,
                 mask_axes=None):
        self.work = work_dtype(q)
        # the batch/head axes the mask depends on: the keys of each block are found once for the others
        axes = frozenset({"b", "h"}) if mask_axes is None or mask_fn is None else frozenset(mask_axes)
        self.by_b = "b" in axes or (keep is not None and keep.shape[0] > 1)
        self.by_h = "h" in axes or (keep is not None and keep.shape[1] > 1)
        self._found: dict[tuple, list[tuple[int, int]]] = {}
        self.b, self.h = max(q.shape[0], k.shape[0], v.shape[0]), max(q.shape[1], k.shape[1], v.shape[1])
        self.tq, self.tk, self.dv = q.shape[-2], k.shape[-2], v.shape[-1]
        self.factor, self.out_dtype = factor, out_dtype
        self.score_fn, self.mask_fn, self.keep, self.bias = score_fn, mask_fn, keep, bias
        self.mods, self.on_fail = mods, on_fail
        elements = BLOCK_ELEMENTS // (2 if grad else 1)  # the backward pass holds four blocks at once
        masked = mask_fn is not None or keep is not None
        # with a mask, blocks of few rows: the keys no row of a block may see are skipped (half of them when causal)
        rows = MASKED_ROWS if masked else max(MIN_ROWS, elements // max(1, self.tk))
        self.rows = rows = min(self.tq, rows)
        heads = max(1, min(self.h, elements // max(1, rows * self.tk)))
        self.spans = []
        for bi in range(self.b):
            for h0 in range(0, self.h, heads):
                h1 = min(h0 + heads, self.h)
                starts = range(0, self.tq, rows)
                keys = self._keys(bi, h0, h1, len(starts)) if masked else [(0, self.tk)] * len(starts)
                self.spans += [(bi, h0, h1, i0, min(i0 + rows, self.tq), *jj) for i0, jj in zip(starts, keys,
                                                                                                  strict=True)]
        self.signature = (key, keep is not None, keep is not None and keep.shape, bias is not None,
                          bias is not None and bias.shape, self.work, out_dtype, q.device.type)

    def _keys(self, bi: int, h0: int, h1: int, blocks: int) -> list[tuple[int, int]]:
        """For each block of rows of batch row ``bi`` and heads ``h0:h1``: ``(j0, j1)``, the keys from the first to the
        last that some query of the block may see (``(0, 0)``: none). Found once for every batch row (and on one head
        for all heads) when the mask does not depend on that axis (a causal mask, a window)."""
        memo = (bi if self.by_b else 0, (h0, h1) if self.by_h else None, blocks)
        found = self._found.get(memo)
        if found is None:
            found = self._found[memo] = self._find_keys(bi, h0, h1 if self.by_h else h0 + 1, blocks)
        return found

    def _find_keys(self, bi: int, h0: int, h1: int, blocks: int) -> list[tuple[int, int]]:
        """:meth:`_keys`, the mask evaluated for many blocks at once (at most :data:`MASK_ELEMENTS` entries a
        head)."""
        per = max(1, MASK_ELEMENTS // max(1, self.rows * self.tk))
        out = []
        for first_block in range(0, blocks, per):
            n = min(per, blocks - first_block)
            i0 = first_block * self.rows
            i1 = min(i0 + n * self.rows, self.tq)
            idx = _indices((1, h1 - h0, i1 - i0, self.tk), self.at(bi, h0, i0, 0))
            allowed = _allowed(idx, _pick(self.keep, bi, h0, h1, i0, i1), self.mask_fn)
            allowed = allowed.reshape(-1, *allowed.shape[-2:]).any(dim=0)  # (rows or 1, Tk or 1)
            if allowed.shape[0] == 1:
                allowed = allowed.expand(n, allowed.shape[1])
            else:
                allowed = F.pad(allowed, (0, 0, 0, n * self.rows - (i1 - i0))).view(n, self.rows, -1).any(dim=1)
            if allowed.shape[1] == 1:  # the same for every key
                out += [(0, self.tk) if a else (0, 0) for a in allowed[:, 0].tolist()]
                continue
            seen = allowed.any(dim=1)
            j0 = allowed.to(torch.uint8).argmax(dim=1)
            j1 = self.tk - allowed.flip(1).to(torch.uint8).argmax(dim=1)
            out += [(a, b) if any_ else (0, 0) for any_, a, b in zip(seen.tolist(), j0.tolist(), j1.tolist(),
                                                                     strict=True)]
        return out

    def run(self, kernel: compiled.Kernel, blocks, body) -> None:
        """``body(fn, span)`` for every span, ``fn`` running the block through :meth:`compiled.Kernel.run`: compiled
        (with the raw modifiers) where it is ready, else the eager function (with the checked ones, timed for the
        ``auto`` rule)."""
        def eager(*a, score_mod=None, mask_mod=None, **kw):
            return kernel.fn(*a, score_mod=self.score_fn, mask_mod=self.mask_fn, **kw)

        if self.mods is None:  # modifiers the compiler could not take: eager, untimed
            for span in blocks:
                body(eager, span)
            return
        smod, mmod = self.mods
        device = torch.device("cpu")
        if not kernel.use(self.signature, device):  # one call's blocks eager, timed together (the rule counts calls)
            first: list = []

            def timed(*a, **kw):
                if not first:
                    first.append((a, {**kw, "score_mod": smod, "mask_mod": mmod}))
                return eager(*a, **kw)

            with kernel.eager(self.signature, device, lambda: first[0] if first else None):
                for span in blocks:
                    body(timed, span)
            return
        on_fail = self.on_fail or (lambda err: compiled.failed(err, "attention with score_mod/mask_mod"))
        for span in blocks:
            body(lambda *a, **kw: kernel.run(self.signature, eager, *a, score_mod=smod, mask_mod=mmod,
                                             on_fail=on_fail, **kw), span)

    @staticmethod
    def at(bi: int, h0: int, i0: int, j0: int) -> Tensor:
        return torch.tensor([bi, h0, i0, j0])


def _scratch(plan: _Plan, n: int, width: int) -> list[Tensor]:
    """``n`` buffers as large as the largest block: every block's scores are made in them (no allocation, and no
    fresh pages to fault in, per block)."""
    hb = max(span[2] - span[1] for span in plan.spans)
    return [torch.empty(hb * plan.rows * width, dtype=plan.work) for _ in range(n)]


def _view(buf: Tensor, hb: int, rows: int, cols: int) -> Tensor:
    return buf[:hb * rows * cols].view(1, hb, rows, cols)


def _forward(plan: _Plan, q: Tensor, k: Tensor, v: Tensor, weights: Tensor | None, keep_lse: bool):
    """The output (and the weights into ``weights``, the log-sum-exps when ``keep_lse``) a block at a time."""
    b, h, tq, tk = plan.b, plan.h, plan.tq, plan.tk
    qs = (q.to(plan.work) * plan.factor).expand(b, h, tq, q.shape[-1])
    kt = k.to(plan.work).expand(b, h, tk, k.shape[-1]).transpose(-2, -1)
    vw = v.to(plan.work).expand(b, h, tk, plan.dv)
    out = q.new_empty(b, h, tq, plan.dv, dtype=plan.work)
    lse = q.new_empty(b, h, tq, 1, dtype=plan.work) if keep_lse else None
    empty = [span for span in plan.spans if span[6] <= span[5]]
    for bi, h0, h1, i0, i1, _, _ in empty:  # no key to see: zero output and weights
        out[bi, h0:h1, i0:i1] = 0
        if weights is not None:
            weights[bi, h0:h1, i0:i1] = 0
        if lse is not None:
            lse[bi, h0:h1, i0:i1] = _INF
    (buf,) = _scratch(plan, 1, tk)
    direct = weights is not None and weights.dtype == plan.work  # the kernel writes the weights where they go

    def body(fn, span):
        bi, h0, h1, i0, i1, j0, j1 = span
        s = _view(buf, h1 - h0, i1 - i0, j1 - j0)
        torch.matmul(qs[bi:bi + 1, h0:h1, i0:i1], kt[bi:bi + 1, h0:h1, :, j0:j1], out=s)
        w = weights[bi:bi + 1, h0:h1, i0:i1, j0:j1] if direct else s
        m = fn(s, plan.at(bi, h0, i0, j0), _pick(plan.keep, bi, h0, h1, i0, i1, j0, j1),
               _pick(plan.bias, bi, h0, h1, i0, i1, j0, j1), dest=w)
        torch.matmul(w, vw[bi:bi + 1, h0:h1, j0:j1], out=out[bi:bi + 1, h0:h1, i0:i1])
        if weights is not None:
            if not direct:
                weights[bi, h0:h1, i0:i1, j0:j1] = s[0]
            weights[bi, h0:h1, i0:i1, :j0] = 0
            weights[bi, h0:h1, i0:i1, j1:] = 0
        if lse is not None:
            lse[bi:bi + 1, h0:h1, i0:i1] = m

    plan.run(BLOCK, [span for span in plan.spans if span[6] > span[5]], body)
    return out.to(plan.out_dtype), lse


def _backward(plan: _Plan, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
              leaves: list[Tensor]):
    b, h, tq, tk, work = plan.b, plan.h, plan.tq, plan.tk, plan.work
    qs = (q.to(work) * plan.factor).expand(b, h, tq, q.shape[-1])
    kw = k.to(work).expand(b, h, tk, k.shape[-1])
    vw = v.to(work).expand(b, h, tk, plan.dv)
    do = dout.to(work).expand(b, h, tq, plan.dv)
    delta = (do * out.to(work)).sum(dim=-1, keepdim=True)
    dq = torch.zeros(b, h, tq, q.shape[-1], dtype=work)
    dk = torch.zeros(b, h, tk, k.shape[-1], dtype=work)
    dv = torch.zeros(b, h, tk, plan.dv, dtype=work)
    dleaves = [torch.zeros_like(t) for t in leaves]
    sbuf, dbuf = _scratch(plan, 2, tk)

    def body(fn, span):
        bi, h0, h1, i0, i1, j0, j1 = span
        rows, cols = (slice(bi, bi + 1), slice(h0, h1), slice(i0, i1)), (slice(bi, bi + 1), slice(h0, h1),
                                                                          slice(j0, j1))
        qc, kc, vc, doc = qs[rows], kw[cols], vw[cols], do[rows]
        s, dp = _view(sbuf, h1 - h0, i1 - i0, j1 - j0), _view(dbuf, h1 - h0, i1 - i0, j1 - j0)
        torch.matmul(qc, kc.transpose(-2, -1), out=s)
        torch.matmul(doc, vc.transpose(-2, -1), out=dp)
        at = plan.at(bi, h0, i0, j0)
        keep, bias = _pick(plan.keep, bi, h0, h1, i0, i1, j0, j1), _pick(plan.bias, bi, h0, h1, i0, i1, j0, j1)
        if leaves:
            with torch.enable_grad():
                sm = plan.score_fn(s.clone(), *_indices(s.shape, at))
        dsm = fn(s, at, keep, bias, lse=lse[rows], dp=dp, delta=delta[rows], modified=bool(leaves))
        p, ds = s, dp
        dv[cols] += p.transpose(-2, -1) @ doc
        dq[rows] += ds @ kc
        dk[cols] += ds.transpose(-2, -1) @ qc
        if leaves:
            for acc, g in zip(dleaves, torch.autograd.grad(sm, leaves, dsm, retain_graph=True,
                                                                allow_unused=True), strict=True):
                if g is not None:
                    acc += g

    plan.run(GRADS, [span for span in plan.spans if span[6] > span[5]], body)
    dq.mul_(plan.factor)
    return (dq.sum_to_size(q.shape).to(q.dtype), dk.sum_to_size(k.shape).to(k.dtype),
            dv.sum_to_size(v.shape).to(v.dtype), dleaves)


class _Blocks(torch.autograd.Function):
    """Attention over blocks that keeps the output and the log-sum-exps only; the backward pass recomputes."""

    @staticmethod
    def forward(ctx, plan: _Plan, q: Tensor, k: Tensor, v: Tensor, *leaves: Tensor) -> Tensor:
        out, lse = _forward(plan, q, k, v, None, keep_lse=True)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, lse, *leaves)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, *leaves = ctx.saved_tensors
        dq, dk, dv, dleaves = _backward(ctx.plan, q, k, v, out, lse, dout, leaves)
        return (None, dq, dk, dv, *dleaves)


def chunked(q: Tensor, k: Tensor, v: Tensor, factor: float, score_fn: Callable | None, mask_fn: Callable | None,
            keep: Tensor | None, bias: Tensor | None, dropout: float, return_weights: bool, out_dtype: torch.dtype,
            grad: bool, *, mods: tuple[Callable | None, Callable | None] | None = None, key: Hashable = None,
            on_fail: Callable[[BaseException], None] | None = None, mask_axes: frozenset[str] | None = None):
    """``softmax(mods(factor * q k^T))`` (masked) ``@ v`` on 4-D ``q (B, H, Tq, D)``, ``k (B, H, Tk, D)``,
    ``v (B, H, Tk, Dv)`` (batch and head axes broadcast); ``keep``/``bias`` 4-D, broadcastable to the scores.
    ``grad``: a backward pass may follow. Returns the output, and the weights when ``return_weights``.

    ``mods``: the modifiers as the compiled kernels take them (traceable; None: never compile), ``key`` what tells
    their code apart (part of the kernels' signature), ``on_fail`` what to do when compiling fails (by default,
    compiled kernels are turned off), ``mask_axes`` the batch/head axes (``"b"``, ``"h"``) ``mask_fn`` depends on
    (:func:`qkv.mods.uses`; None: both)."""
    if dropout > 0 or (grad and return_weights) or (bias is not None and bias.requires_grad):
        return _checkpointed(q, k, v, factor, score_fn, mask_fn, keep, bias, dropout, return_weights, out_dtype, grad)
    plan = _Plan(q, k, v, factor, score_fn, mask_fn, keep, bias, out_dtype, mods, key, on_fail, grad, mask_axes)
    if grad:
        leaves = _grad_leaves(score_fn, plan.work, q.device) or []
        return _Blocks.apply(plan, q, k, v, *leaves)
    weights = q.new_empty(plan.b, plan.h, plan.tq, plan.tk, dtype=out_dtype) if return_weights else None
    out, _ = _forward(plan, q, k, v, weights, keep_lse=False)
    return (out, weights) if return_weights else out


def _checkpointed(q: Tensor, k: Tensor, v: Tensor, factor: float, score_fn: Callable | None, mask_fn: Callable | None,
            keep: Tensor | None, bias: Tensor | None, dropout: float, return_weights: bool, out_dtype: torch.dtype,
            grad: bool):
    """The stages of a block as separate eager operations, checkpointed when ``grad``: for what the fused blocks do
    not cover (dropout, weights that are differentiated, a bias that requires gradients).

    ``softmax(mods(factor * q k^T))`` (masked) ``@ v`` on 4-D ``q (B, H, Tq, D)``, ``k (B, H, Tk, D)``,
    ``v (B, H, Tk, Dv)`` (batch and head axes broadcast); ``keep``/``bias`` 4-D, broadcastable to the scores.
    ``grad``: a backward pass may follow (blocks are checkpointed). Returns the output, and the weights when
    ``return_weights``.

    A block is one batch row, some heads and some query rows (all of them unless one head's scores exceed
    :data:`BLOCK_ELEMENTS`), so that its matrix products stay wide."""
    work = work_dtype(q)
    b, h = max(q.shape[0], k.shape[0], v.shape[0]), max(q.shape[1], k.shape[1], v.shape[1])
    tq, tk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    rows = min(tq, max(MIN_ROWS, BLOCK_ELEMENTS // max(1, tk)))
    heads = max(1, min(h, BLOCK_ELEMENTS // max(1, rows * tk)))
    qs = (q.to(work) * factor).expand(b, h, tq, q.shape[-1])
    kt = k.to(work).expand(b, h, tk, k.shape[-1]).transpose(-2, -1)
    vw = v.to(out_dtype).expand(b, h, tk, dv)
    dev = q.device
    ki = torch.arange(tk, device=dev).view(1, 1, 1, tk)

    def block(bi: int, h0: int, h1: int, i0: int, i1: int, qc: Tensor, kc: Tensor, vc: Tensor
              ) -> tuple[Tensor, Tensor]:
        s = qc @ kc
        bix = torch.full((1, 1, 1, 1), bi, device=dev)
        hix = torch.arange(h0, h1, device=dev).view(1, h1 - h0, 1, 1)
        qix = torch.arange(i0, i1, device=dev).view(1, 1, i1 - i0, 1)
        fresh = s
        if score_fn is not None:
            s = score_fn(s, bix, hix, qix, ki)
        m = _pick(keep, bi, h0, h1, i0, i1)
        if mask_fn is not None:
            mm = mask_fn(bix, hix, qix, ki)
            m = mm if m is None else m & mm
        own = s is fresh or (s.shape == fresh.shape and s._base is None)
        w = masked_normalize(s, m, _pick(bias, bi, h0, h1, i0, i1), softmax, inplace=own).to(out_dtype)
        w = w.expand(1, h1 - h0, i1 - i0, tk)
        used = F.dropout(w, dropout) if dropout > 0 else w
        return used @ vc, w

    spans = [(bi, h0, min(h0 + heads, h), i0, min(i0 + rows, tq))
             for bi in range(b) for h0 in range(0, h, heads) for i0 in range(0, tq, rows)]
    if grad:
        outs, ws = {}, {}
        for bi, h0, h1, i0, i1 in spans:
            o, w = checkpoint(block, bi, h0, h1, i0, i1, qs[bi:bi + 1, h0:h1, i0:i1], kt[bi:bi + 1, h0:h1],
                              vw[bi:bi + 1, h0:h1], use_reentrant=False)
            outs[bi, h0, i0], ws[bi, h0, i0] = o, w

        def join(parts: dict) -> Tensor:
            return torch.cat([torch.cat([torch.cat([parts[bi, h0, i0] for i0 in range(0, tq, rows)], dim=-2)
                                         for h0 in range(0, h, heads)], dim=1) for bi in range(b)], dim=0)

        out = join(outs)
        return (out, join(ws)) if return_weights else out
    out = q.new_empty(b, h, tq, dv, dtype=out_dtype)
    weights = q.new_empty(b, h, tq, tk, dtype=out_dtype) if return_weights else None
    for bi, h0, h1, i0, i1 in spans:
        o, w = block(bi, h0, h1, i0, i1, qs[bi:bi + 1, h0:h1, i0:i1], kt[bi:bi + 1, h0:h1], vw[bi:bi + 1, h0:h1])
        out[bi:bi + 1, h0:h1, i0:i1] = o
        if return_weights:
            weights[bi:bi + 1, h0:h1, i0:i1] = w
    return (out, weights) if return_weights else out
