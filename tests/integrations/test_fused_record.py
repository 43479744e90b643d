"""Weights rebuilt from the fused kernel's log-sum-exp against qkv's weights path (float64), for causal calls,
boolean and additive masks and a subset of heads; calls the kernel does not take are left to the usual path."""

from __future__ import annotations

import pytest
import torch

from qkv import attention
from qkv.integrations import fused_record
from qkv.integrations.fused_record import fused_and_record


class Keep:
    def __init__(self):
        self.rows = {}

    def add(self, module, first, weights, rows):
        self.rows[first] = weights
        self.width = getattr(self, "width", weights.shape[-1])


def _joined(keep: Keep) -> torch.Tensor:  # the blocks written into a zeroed record, as the recorder does
    first = keep.rows[0]
    out = first.new_zeros(*first.shape[:-2], sum(w.shape[-2] for w in keep.rows.values()), keep.width)
    for i, w in keep.rows.items():
        out[..., i:i + w.shape[-2], :w.shape[-1]] = w
    return out


def _qkv(b=2, h=4, tq=300, tk=300, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, dtype=dtype) for t in (tq, tk, tk)]


@pytest.mark.parametrize("case", ["causal", "bool", "bias", "none"])
@pytest.mark.parametrize("heads", [[0, 1, 2, 3], [1, 3]])
def test_rebuilt_weights_equal_the_weights_path(case, heads, monkeypatch):
    monkeypatch.setattr(fused_record, "ROWS", 128)  # several row blocks
    q, k, v = _qkv(tk=300 if case == "causal" else 257)
    g = torch.Generator().manual_seed(1)
    mask = None
    if case == "bool":
        mask = torch.rand(2, 1, q.shape[2], k.shape[2], generator=g) > 0.3
        mask[..., 0] = True
    elif case == "bias":
        mask = torch.randn(2, 4, q.shape[2], k.shape[2], generator=g, dtype=torch.float64)
    keep = Keep()
    out = fused_and_record(keep, None, q, k, v, mask, 0.3, case == "causal", heads)
    want_out, want = attention(q, k, v, mask=mask, scale=0.3, is_causal=case == "causal", return_weights=True)
    torch.testing.assert_close(out, want_out)
    got = _joined(keep)
    assert sorted(keep.rows) == [0, 128, 256]
    if case == "causal":  # the keys after a block's last query are not computed
        assert [keep.rows[i].shape[-1] for i in (0, 128, 256)] == [300, 256, 300]
    torch.testing.assert_close(got.double(), want[:, heads], atol=2e-6, rtol=1e-5)  # float32 rebuild


def test_calls_the_kernel_does_not_take_return_none():
    q, k, v = _qkv(tq=5, tk=7)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, 0, 2] = False  # a query that sees no key: qkv gives zeros, the kernel NaN
    assert fused_and_record(Keep(), None, q, k, v, mask, None, False, [0]) is None
    assert fused_and_record(Keep(), None, q, k, v, None, None, True, [0]) is None  # causal with Tk > Tq
    assert fused_and_record(Keep(), None, q.requires_grad_(), k, v, None, None, False, [0]) is None
