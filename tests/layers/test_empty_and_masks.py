"""The layers and capture take empty batches and sequences as ``qkv.attention`` does (shapes kept, zeros where
there is nothing to attend to), and a floating mask holding NaN or ``+inf`` is a ``ValueError`` naming it wherever
a mask enters: ``qkv.attention`` (every score, both paths), ``normalize_scores`` and every layer."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.layers import Attention, AttentionPooling, MultiHeadAttention, SelfAttention
from qkv.layers.transformer import TransformerLayer

SHAPES = [(0, 5), (2, 0), (0, 0)]  # (B, T)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("bt", SHAPES)
def test_multihead_attention_takes_empty_batches_and_sequences(kv_heads, bt):
    b, t = bt
    layer = MultiHeadAttention(16, 4, kv_heads=kv_heads)
    x = torch.randn(b, t, 16, requires_grad=True)
    out, w = layer(x, return_weights=True, average_weights=False)
    assert out.shape == (b, t, 16) and w.shape == (b, 4, t, t)
    out.sum().backward()
    assert x.grad.shape == x.shape
    with qkv.capture_attention(layer) as records:
        layer(x, is_causal=True)
    assert [r.weights.shape for r in records] == [(b, 4, t, t)]
    # cross-attention to no key at all: zero weights, zero attention output
    if b:
        out, w = layer(torch.randn(b, 3, 16), torch.randn(b, 0, 16), return_weights=True)
        assert out.shape == (b, 3, 16) and w.shape == (b, 3, 0)


@pytest.mark.parametrize("bt", SHAPES)
def test_every_layer_and_capture_take_empty_inputs(bt):
    b, t = bt
    x = torch.randn(b, t, 8)
    layers = [(SelfAttention(8, 8), lambda m: m(x)),
              (Attention(), lambda m: m(x, x)),
              (TransformerLayer(8, 2, kv_heads=1), lambda m: m(x)),
              (AttentionPooling(8), lambda m: m(x))]
    for layer, call in layers:
        with qkv.capture_attention(layer) as records:
            out = call(layer)
        out = out[0] if isinstance(out, tuple) else out
        assert out.shape[0] == b, type(layer).__name__
        assert all(r.weights.shape[0] == b for r in records), type(layer).__name__
    with qkv.capture_attention(torch.nn.Module()) as records:  # a bare call of any rank
        for shape in [(b, t, 8), (b, 3, t, 8), (t, 8)]:
            qkv.attention(torch.randn(*shape), torch.randn(*shape), torch.randn(*shape))
    assert len(records) == 3


BAD = {"NaN": float("nan"), "+inf": float("inf")}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("impl", ["auto", "reference"])
@pytest.mark.parametrize("score", ["scaled_dot", "dot", "cosine"])
def test_a_float_mask_holding_nan_or_plus_inf_is_an_error_naming_it(bad, impl, score):
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = torch.zeros(3, 5)
    mask[1, 2] = BAD[bad]
    with pytest.raises(ValueError, match=rf"mask \(3, 5\) holds 1 \{bad}" if bad == "+inf" else r"holds 1 NaN"):
        qkv.attention(q, k, v, score=score, mask=mask, impl=impl)
    with pytest.raises(ValueError, match="floating mask is an additive bias"):
        qkv.normalize_scores(torch.randn(2, 3, 5), mask)
    # -inf forbids, finite values are a bias: both fine, even together
    mask[1, 2] = float("-inf")
    mask[0, 0] = 3.0
    out, w = qkv.attention(q, k, v, score=score, mask=mask, impl=impl, return_weights=True)
    assert torch.isfinite(out).all() and w[:, 1, 2].eq(0).all()


@pytest.mark.parametrize("bad", list(BAD))
def test_every_layer_refuses_a_nan_or_plus_inf_mask(bad):
    x = torch.randn(2, 5, 8)
    mask = torch.zeros(5, 5)
    mask[0, 4] = BAD[bad]
    calls = [lambda: MultiHeadAttention(8, 2)(x, mask=mask),
             lambda: MultiHeadAttention(8, 2, kv_heads=1)(x, mask=mask[None].expand(2, 5, 5)),
             lambda: SelfAttention(8, 8)(x, mask=mask),
             lambda: Attention()(x, x, mask=mask)]
    for call in calls:
        with pytest.raises(ValueError, match=r"holds \d+ (NaN|\+inf)"):
            call()
