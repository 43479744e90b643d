"""The weights of a recording rebuilt from the fused path's log-sum-exp: one more ``q·k`` per recorded layer and
no second softmax.

A recording (:func:`qkv.integrations.transformers.recording`) needs the weights of the heads it asks for while the
model runs on the fused path, which returns none. PyTorch's fused CPU kernel also returns each query row's
log-sum-exp ``L_i = log sum_j exp(s_ij)`` of the scaled scores; then ``w_ij = exp(s_ij - L_i)`` needs the scores
``s = scale q·k`` (+ the additive mask) of the recorded heads only: no maximum, no sum, no weighted sum a second
time. The rows are rebuilt :data:`ROWS` at a time straight into the recorder, so the memory beyond the kept weights
is one block.

Taken for softmax over scaled dot products without modifiers or dropout, on the CPU, with every query row seeing
at least one key (rows that see none are all-zero weights in qkv, NaN in the kernel); any other call returns None
and the backend records the weights its usual way (recomputed beside the fused path).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["fused_and_record", "ROWS"]

#: query rows whose weights are rebuilt at once
ROWS = 256


def _kernel():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def fused_and_record(recorder: Any, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     mask: Tensor | None, scale: float | None, is_causal: bool, heads: list[int]) -> Tensor | None:
    """The attention output ``(B, H, Tq, D)`` of the fused kernel, with the weights of ``heads`` given to
    ``recorder.add(module, first_row, weights (B, h, rows, Tk'), Tq)`` block by block (``Tk' = Tk`` but for the
    causal blocks after the first, which stop at their last query's key: the keys after it are 0); None when this
    call is not one the kernel takes (see the module's docstring).

    Args:
        query: ``(B, H, Tq, D)``.  key, value: ``(B, H, Tk, D)`` (heads already repeated for grouped queries).
        mask: None, boolean (True: may attend) or additive float, broadcastable to ``(B, H, Tq, Tk)``.
        is_causal: the queries are the ``Tk`` positions themselves (``Tq == Tk`` is required).
    """
    kernel = _kernel()
    tq, tk = query.shape[-2], key.shape[-2]
    if (kernel is None or query.device.type != "cpu" or torch.is_grad_enabled() and query.requires_grad
            or query.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
            or (is_causal and tq != tk) or tq == 0 or tk == 0):
        return None
    bias = None
    if mask is not None:
        if mask.dtype == torch.bool:
            if mask.dim() < 2 or not bool(mask.any(-1).all()):
                return None
            bias = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, -math.inf)
        elif mask.is_floating_point():
            bias = mask.to(query.dtype)
            if not bool((bias > -math.inf).any(-1).all()):
                return None
        else:
            return None
    factor = 1 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    out, lse = kernel(query, key, value, 0.0, is_causal, attn_mask=bias, scale=factor)
    h = query.shape[1]
    sel = slice(None) if len(heads) == h else heads
    q, k, lse = query[:, sel], key[:, sel], lse[:, sel]
    for i in range(0, tq, ROWS):
        n = min(ROWS, tq - i)
        seen = i + n if is_causal else tk  # a causal block's rows see no key after its last query
        s = torch.matmul(q[:, :, i:i + n], k[:, :, :seen].transpose(-1, -2)).float().mul_(factor)
        if bias is not None:
            b = bias[..., i:i + n, :] if bias.shape[-2] == tq else bias
            if b.dim() == 4 and b.shape[1] == h and len(heads) < h:
                b = b[:, heads]
            s = s + b.float()
        if is_causal:  # only the block's last n keys can lie after a query
            s[..., i:].masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu_(1), -math.inf)
        w = s.sub_(lse[:, :, i:i + n, None].float()).exp_()
        if i == 0 and seen < tk:  # the first block sets the record's width: written whole
            w = nn.functional.pad(w, (0, tk - seen))
        recorder.add(module, i, w, tq)
    return out
