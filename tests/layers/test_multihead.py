"""MultiHeadAttention: against torch.nn.MultiheadAttention, per-head references, and the KV cache."""

import pytest
import torch
from torch import nn

import qkv
import qkv.path_table
from qkv.masks import from_torch_mask
from tests.reference import attention_ref


def torch_pair(e=32, h=4, **kw):
    ref = nn.MultiheadAttention(e, h, batch_first=True, **kw).eval()
    with torch.no_grad():  # non-zero biases so that copying them is tested
        for p in ref.parameters():
            if p.dim() == 1:
                p.normal_()
    return ref, qkv.MultiHeadAttention.from_torch(ref).eval()


@pytest.mark.parametrize("average", [True, False])
def test_from_torch_self_attention_with_masks(average, gen):
    ref, ours = torch_pair()
    x = torch.randn(3, 6, 32, generator=gen)
    kpm = torch.rand(3, 6, generator=gen) > 0.7
    kpm[:, 0] = False
    attn = torch.rand(6, 6, generator=gen) > 0.8
    attn.fill_diagonal_(False)
    want, want_w = ref(x, x, x, key_padding_mask=kpm, attn_mask=attn, average_attn_weights=average)
    got, got_w = ours(x, mask=from_torch_mask(attn, kpm), return_weights=True, average_weights=average)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)
    got2 = ours(x, mask=~attn, key_mask=~kpm)  # fast path, qkv's own mask convention
    torch.testing.assert_close(got2, want, atol=1e-5, rtol=1e-5)


def test_from_torch_cross_attention_kdim_vdim_float_mask(gen):
    ref, ours = torch_pair(24, 3, kdim=10, vdim=7)
    q = torch.randn(2, 5, 24, generator=gen)
    k = torch.randn(2, 8, 10, generator=gen)
    v = torch.randn(2, 8, 7, generator=gen)
    bias = torch.randn(5, 8, generator=gen)
    want, want_w = ref(q, k, v, attn_mask=bias)
    got, got_w = ours(q, k, v, mask=bias, return_weights=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)


def test_from_torch_rejects_unsupported():
    with pytest.raises(ValueError, match="add_bias_kv"):
        qkv.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def per_head_reference(mha, x, mem, score, mask=None):
    """Heads by hand in float64: split, repeat the kv heads, attend per head, concatenate."""
    b, tq, _ = x.shape
    h, g, d = mha.num_heads, mha.kv_heads, mha.head_dim
    q = mha.q_proj(x).view(b, tq, h, d)
    k = mha.k_proj(mem).view(b, -1, g, d)
    v = mha.v_proj(mem).view(b, -1, g, d)
    outs, ws = [], []
    for i in range(h):
        j = i // (h // g)
        o, w = attention_ref(q[:, :, i], k[:, :, j], v[:, :, j], score, mask)
        outs.append(o)
        ws.append(w)
    return mha.out_proj(torch.cat(outs, -1)), torch.stack(ws, 1)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("score", ["scaled_dot", "cosine", "additive", "general"])
def test_heads_scores_and_gqa_against_reference(kv_heads, score, gen):
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4, kv_heads=kv_heads, score=score, dtype=torch.float64).eval()
    x = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    mem = torch.randn(2, 7, 16, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    ref_score = mha.score if isinstance(score, str) and score in ("additive", "general") else score
    want, want_w = per_head_reference(mha, x, mem, ref_score, mask[:, 0])
    got, got_w = mha(x, mem, mask=mask, return_weights=True, average_weights=False)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    assert mha.k_proj.out_features == kv_heads * 4


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_kv_cache_decoding_equals_full_causal(kv_heads, score, gen):
    torch.manual_seed(1)
    mha = qkv.MultiHeadAttention(16, 4, kv_heads=kv_heads, score=score).eval()
    x = torch.randn(2, 9, 16, generator=gen)
    full = mha(x, is_causal=True)
    cache = qkv.KVCache()
    steps = [mha(x[:, :4], is_causal=True, cache=cache)]  # a prompt, then one token at a time
    steps += [mha(x[:, t:t + 1], is_causal=True, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 9


def test_one_new_query_after_the_cache_builds_no_mask(gen, monkeypatch):
    """Decoding one token after a cache: its query sees every key, so no causal mask is built for it (the mask
    costs more than the step's attention on a small model), and the step still equals the full causal pass."""
    import qkv.layers.multihead as multihead

    mha = qkv.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16, generator=gen)
    full = mha(x, is_causal=True)
    cache = qkv.KVCache()
    steps = [mha(x[:, :5], is_causal=True, cache=cache)]

    def refused(*args, **kw):
        raise AssertionError("a causal mask was built for one query")

    monkeypatch.setattr(multihead, "causal_mask", refused)
    monkeypatch.setattr(qkv.path_table, "causal_mask", refused)  # where qkv.attention builds one
    steps.append(mha(x[:, 5:], is_causal=True, cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_static_cache_for_cross_attention(gen):
    mha = qkv.MultiHeadAttention(16, 2).eval()
    mem = torch.randn(2, 7, 16, generator=gen)
    y = torch.randn(2, 3, 16, generator=gen)
    cache = qkv.KVCache(static=True)
    first = mha(y[:, :1], mem, cache=cache)
    again = mha(y[:, 1:], cache=cache)  # memory not passed again
    torch.testing.assert_close(torch.cat([first, again], 1), mha(y, mem))
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.key[0], cache.key[1])


def test_dropout_only_in_training(gen):
    mha = qkv.MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(2, 5, 16, generator=gen)
    torch.manual_seed(0)
    a = mha(x)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    assert not torch.allclose(a, mha(x))


def test_bad_construction_and_input():
    with pytest.raises(ValueError, match=r"dim \(10\) must be a positive multiple of num_heads"):
        qkv.MultiHeadAttention(10, 3)
    named = qkv.MultiHeadAttention(dim=12, num_heads=4, kv_heads=2)
    assert named.dim == 12 and named.head_dim == 3 and "dim=12, num_heads=4, kv_heads=2" in repr(named)
    with pytest.raises(ValueError, match="kv_heads"):
        qkv.MultiHeadAttention(12, 4, kv_heads=3)
    mha = qkv.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must be \(B, Tq, E=8\)"):
        mha(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="key must be"):
        mha(torch.randn(2, 5, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match="key_mask must be"):
        mha(torch.randn(2, 5, 8), key_mask=torch.ones(2, 4, dtype=torch.bool))


def test_attention_layer_and_self_attention(gen):
    att = qkv.Attention("additive", query_dim=8, key_dim=6, hidden_dim=5, dtype=torch.float64)
    q = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    out, w = att(q, k, return_weights=True)
    want, want_w = attention_ref(q, k, k, att.score)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w, want_w)
    sa = qkv.SelfAttention(4, 3, 2, dtype=torch.float64)
    x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    want = attention_ref(sa.q_proj(x), sa.k_proj(x), sa.v_proj(x))[0]
    torch.testing.assert_close(sa(x), want)
    assert sa(x).shape == (5, 2)


def test_attention_pooling(gen):
    pool = qkv.AttentionPooling(6, 4, num_queries=3, dtype=torch.float64)
    x = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pooled, w = pool(x, mask)
    assert pooled.shape == (2, 3, 6) and w.shape == (2, 3, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert torch.all(w[1, :, 3:] == 0)
    keys = torch.tanh(pool.key_proj(x))
    want = torch.softmax((pool.queries @ keys.transpose(1, 2)).masked_fill(~mask[:, None], -torch.inf), -1)
    torch.testing.assert_close(w, want)
    # padding content does not change the result
    x2 = x.clone()
    x2[1, 3:] = 100.0
    torch.testing.assert_close(pool(x2, mask)[0][1], pooled[1])
    pen = qkv.AttentionPooling.penalty(w)
    torch.testing.assert_close(pen, ((w @ w.transpose(1, 2) - torch.eye(3, dtype=w.dtype)) ** 2).sum((1, 2)))
    single, w1 = qkv.AttentionPooling(6)(x.float())
    assert single.shape == (2, 6) and w1.shape == (2, 5)


def test_torch_compile_matches_eager(gen):
    mha = qkv.MultiHeadAttention(16, 4, kv_heads=2).eval()
    x = torch.randn(2, 6, 16, generator=gen)
    compiled = torch.compile(mha, backend="inductor")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, is_causal=True), mha(x, is_causal=True), atol=1e-5, rtol=1e-5)


def test_one_spelling_per_size(gen):
    """dim / key_dim / value_dim everywhere in qkv.layers (the spellings before 0.2.0, SelfAttention's
    in_dim/qk_dim/v_dim and MultiHeadAttention's kdim/vdim, are gone); kdim/vdim stay readable as torch names them."""
    sa = qkv.SelfAttention(dim=4, key_dim=3, value_dim=5)
    assert (sa.dim, sa.key_dim, sa.value_dim) == (4, 3, 5)
    for name, old in (("in_dim", {"in_dim": 4, "key_dim": 3}), ("qk_dim", {"dim": 4, "qk_dim": 3}),
                      ("v_dim", {"dim": 4, "key_dim": 3, "v_dim": 5})):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            qkv.SelfAttention(**old)
    mha = qkv.MultiHeadAttention(24, 3, key_dim=10, value_dim=7)
    assert (mha.key_dim, mha.value_dim, mha.kdim, mha.vdim) == (10, 7, 10, 7)
    for name in ("kdim", "vdim", "kdims"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            qkv.MultiHeadAttention(24, 3, **{name: 10})
    with pytest.raises(TypeError, match="dim"):
        qkv.SelfAttention(key_dim=3)
