"""qkv's attention on a CUDA GPU against the float64 formula on the CPU: the paths a GPU takes (SDPA's kernels, the
key-padding copies, compiled FlexAttention, the additive tiles) give what the CPU's reference gives. Skipped
without a GPU (CI has none): run ``pytest tests/core/test_cuda.py`` where one is present."""

from __future__ import annotations

import math

import pytest
import torch

import qkv
from qkv import compiled, mods
from qkv.scores import Additive

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2}  # against the float64 formula, on outputs of size ~1


def formula(q, k, v, allowed=None, bias=None):
    """softmax(q k^T / sqrt(D) + bias, masked) v in float64 on the CPU; rows with no key give zeros."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias.double().cpu()
    if allowed is not None:
        allowed = allowed.cpu()
        s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w


def inputs(dtype, b=2, h=3, t=96, d=32, grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=gen).to("cuda", dtype).requires_grad_(grad) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_and_weights_equal_the_formula(dtype):
    q, k, v = inputs(dtype)
    want, w_want = formula(q, k, v)
    out = qkv.attention(q, k, v)
    out2, w = qkv.attention(q, k, v, return_weights=True)
    assert out.device.type == "cuda" and out.dtype == dtype
    torch.testing.assert_close(out.double().cpu(), want, atol=TOL[dtype], rtol=0)
    torch.testing.assert_close(out2.double().cpu(), want, atol=TOL[dtype], rtol=0)
    torch.testing.assert_close(w.double().cpu(), w_want, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_padding_ignores_nan_in_the_padding_forward_and_backward(dtype):
    b, h, t, d = 3, 2, 80, 16
    q, k, v = inputs(dtype, b, h, t, d)
    lengths = torch.tensor([80, 41, 7])
    pad = (torch.arange(t)[None] < lengths[:, None])[:, None, None].cuda()  # (B, 1, 1, T)
    want, _ = formula(q, k, v, pad)
    k = k.masked_fill(~pad.transpose(-2, -1), float("nan")).requires_grad_(True)
    v = v.masked_fill(~pad.transpose(-2, -1), float("nan")).requires_grad_(True)
    q = q.detach().requires_grad_(True)
    out = qkv.attention(q, k, v, mask=pad)
    torch.testing.assert_close(out.double().cpu(), want, atol=TOL[dtype], rtol=0)
    out.float().sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert (k.grad.masked_select(~pad.transpose(-2, -1).expand_as(k)) == 0).all()


def test_without_zeroing_finite_padding_equals_the_formula_and_an_empty_row_is_zero():
    b, h, t, d = 3, 2, 80, 16
    q, k, v = inputs(torch.float32, b, h, t, d)
    pad = (torch.arange(t)[None] < torch.tensor([80, 41, 0])[:, None])[:, None, None].cuda()
    want, _ = formula(q, k, v, pad)
    qkv.set_zero_unseen_keys(False)
    try:
        out = qkv.attention(q, k, v, mask=pad)
    finally:
        qkv.set_zero_unseen_keys(True)
    torch.testing.assert_close(out.double().cpu(), want, atol=TOL[torch.float32], rtol=0)
    assert (out[2] == 0).all()


def test_a_query_with_no_key_gives_zeros():
    q, k, v = inputs(torch.float32, 1, 1, 8, 4)
    allowed = torch.ones(8, 8, dtype=torch.bool, device="cuda")
    allowed[3] = False
    out = qkv.attention(q, k, v, mask=allowed)
    want, _ = formula(q, k, v, allowed)
    assert (out[0, 0, 3] == 0).all()
    torch.testing.assert_close(out.double().cpu(), want, atol=TOL[torch.float32], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_modifiers_equal_the_formula_with_their_bias(dtype):
    compiled.set_compile("1")
    try:
        b, h, t, d = 2, 4, 256, 32
        q, k, v = inputs(dtype, b, h, t, d, grad=True)
        rows = torch.arange(t)
        bias = -(mods.alibi_slopes(h)[:, None, None] * (rows[:, None] - rows[None, :]).double())
        allowed = rows[None, :] <= rows[:, None]
        want, w_want = formula(q, k, v, allowed, bias)
        out = qkv.attention(q, k, v, score_mod=mods.alibi(h), mask_mod=mods.causal)
        torch.testing.assert_close(out.double().cpu(), want, atol=TOL[dtype], rtol=0)
        _, w = qkv.attention(q, k, v, score_mod=mods.alibi(h), mask_mod=mods.causal, return_weights=True)
        torch.testing.assert_close(w.double().cpu(), w_want, atol=TOL[dtype], rtol=0)
        # gradients: the fused kernel's against the reference path's, on the same GPU
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
        fused = torch.autograd.grad(out, (q, k, v), g)
        ref = qkv.attention(q, k, v, score_mod=mods.alibi(h), mask_mod=mods.causal, impl="reference")
        expect = torch.autograd.grad(ref, (q, k, v), g)
        for a, e in zip(fused, expect, strict=True):
            torch.testing.assert_close(a.float(), e.float(), atol=4 * TOL[dtype], rtol=0)
    finally:
        compiled.set_compile(None)


def test_additive_score_equals_its_textbook_formula_with_gradients():
    torch.manual_seed(0)
    sc = Additive(16, 16, 32).cuda().double()
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 40, 16, generator=gen, dtype=torch.float64).cuda().requires_grad_(True)
               for _ in range(3))
    out = qkv.attention(q, k, v, score=sc)
    want = torch.softmax(sc.reference(q, k), dim=-1) @ v
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    got = torch.autograd.grad(out.sum(), (q, k, v, *sc.parameters()))
    exp = torch.autograd.grad(want.sum(), (q, k, v, *sc.parameters()))
    for a, e in zip(got, exp, strict=True):
        torch.testing.assert_close(a, e, atol=1e-9, rtol=0)


def test_multi_head_attention_equals_torch_module_with_key_padding():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=True).cuda().eval()
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 1:
                p.normal_()
    ours = qkv.MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(3, 20, 32, device="cuda")
    padded = torch.arange(20, device="cuda")[None] >= torch.tensor([20, 11, 3], device="cuda")[:, None]
    with torch.no_grad():
        want, want_w = ref(x, x, x, key_padding_mask=padded)
        got, got_w = ours(x, key_mask=~padded, return_weights=True)
        fast = ours(x, key_mask=~padded)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=1e-4)
