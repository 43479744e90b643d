"""qkv.layers.transformer: the pre-norm layer against torch.nn.TransformerEncoderLayer and a float64 reference
written out here, decoding with caches against the parallel pass, the positions against their formula, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.layers import FeedForward, KVCache, PositionalEncoding, TransformerLayer, sinusoidal_positions

DT = torch.float64
B, T, S, E, H = 3, 6, 5, 16, 4


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (LayerNorm scales and biases too), so that no init hides a mistake."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return module.eval()


def layer(**kw) -> TransformerLayer:
    return randomize(TransformerLayer(E, H, 24, **kw).to(DT))


def lengths_mask(lengths, n):
    return torch.arange(n)[None] < torch.tensor(lengths)[:, None]


# ----------------------------------------------------------------------------- the reference, by the formulas


def ref_norm(x, ln: nn.LayerNorm):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def ref_attention(mha, q_in, kv_in, allowed):
    """Multi-head attention head by head; ``allowed (B, Tq, Tk)`` bool. Returns the output and the mean weights."""
    d = mha.head_dim
    outs, weights = [], []
    for h in range(mha.num_heads):
        rows = slice(h * d, (h + 1) * d)
        q = q_in @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
        k = kv_in @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
        v = kv_in @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
        s = (q @ k.transpose(1, 2) / math.sqrt(d)).masked_fill(~allowed, -math.inf)
        w = torch.softmax(s, -1)
        outs.append(w @ v)
        weights.append(w)
    out = torch.cat(outs, -1) @ mha.out_proj.weight.T + mha.out_proj.bias
    return out, torch.stack(weights).mean(0)


def ref_ffn(ffn: FeedForward, x, activation):
    act = torch.relu if activation == "relu" else F.gelu
    return act(x @ ffn.fc1.weight.T + ffn.fc1.bias) @ ffn.fc2.weight.T + ffn.fc2.bias


def ref_layer(m: TransformerLayer, x, activation="relu", allowed=None, context=None, memory=None, memory_allowed=None):
    ctx = x if context is None else context
    allowed = torch.ones(x.shape[0], x.shape[1], ctx.shape[1], dtype=torch.bool) if allowed is None else allowed
    out, w = ref_attention(m.self_attn, ref_norm(x, m.attn_norm), ref_norm(ctx, m.attn_norm), allowed)
    x = x + out
    if memory is not None:
        out, w = ref_attention(m.cross_attn, ref_norm(x, m.cross_norm), memory, memory_allowed)
        x = x + out
    return x + ref_ffn(m.ffn, ref_norm(x, m.ffn_norm), activation), w


# ----------------------------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_torch_encoder_layer_with_copied_weights(activation, gen):
    ours = layer(activation=activation)
    theirs = nn.TransformerEncoderLayer(E, H, 24, dropout=0.0, activation=activation, batch_first=True,
                                        norm_first=True, dtype=DT).eval()
    with torch.no_grad():
        a = ours.self_attn
        theirs.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        theirs.self_attn.out_proj.load_state_dict(a.out_proj.state_dict())
        theirs.linear1.load_state_dict(ours.ffn.fc1.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.fc2.state_dict())
        theirs.norm1.load_state_dict(ours.attn_norm.state_dict())
        theirs.norm2.load_state_dict(ours.ffn_norm.state_dict())
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    mask = lengths_mask([T, 3, 1], T)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, key_mask=mask), theirs(x, src_key_padding_mask=~mask))
        causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=DT)
        torch.testing.assert_close(ours(x, is_causal=True), theirs(x, src_mask=causal, is_causal=True))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_self_attention_layer_matches_reference(activation, gen):
    m = layer(activation=activation, score="scaled_dot")
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    mask = lengths_mask([T, 4, 2], T)
    allowed = mask[:, None, :].expand(B, T, T) & torch.ones(T, T, dtype=torch.bool).tril()
    with torch.no_grad():
        out, w = m(x, key_mask=mask, is_causal=True, return_weights=True)
    want, want_w = ref_layer(m, x, activation, allowed)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


def test_cross_attention_layer_matches_reference_and_returns_cross_weights(gen):
    m = layer(cross_attention=True)
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    memory = torch.randn(B, S, E, generator=gen, dtype=DT)
    memory_mask = lengths_mask([S, 2, 4], S)
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    with torch.no_grad():
        out, w = m(x, is_causal=True, memory=memory, memory_mask=memory_mask, return_weights=True)
    want, want_w = ref_layer(m, x, allowed=causal, memory=memory,
                             memory_allowed=memory_mask[:, None, :].expand(B, T, S))
    assert w.shape == (B, T, S)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


def test_context_queries_attend_over_the_whole_sequence(gen):
    """A subset of rows with ``context=`` gives those rows of the full pass (a [CLS] query reads every token)."""
    m = layer()
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    mask = lengths_mask([T, 3, 5], T)
    with torch.no_grad():
        full, w_full = m(x, key_mask=mask, return_weights=True)
        first, w = m(x[:, :2], context=x, key_mask=mask, return_weights=True)
    torch.testing.assert_close(first, full[:, :2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w, w_full[:, :2], rtol=1e-12, atol=1e-12)
    want, _ = ref_layer(m, x[:, :1], allowed=mask[:, None, :], context=x)
    torch.testing.assert_close(first[:, :1], want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cross", [False, True])
def test_causal_decoding_with_caches_equals_the_parallel_pass(cross, gen):
    m = layer(cross_attention=cross, kv_heads=2)
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    kw = {}
    if cross:
        kw = {"memory": torch.randn(B, S, E, generator=gen, dtype=DT), "memory_mask": lengths_mask([S, 1, 3], S)}
    with torch.no_grad():
        full, w_full = m(x, is_causal=True, return_weights=True, **kw)
        cache, cross_cache = KVCache(), (KVCache(static=True) if cross else None)
        steps = [m(x[:, t:t + 1], is_causal=True, cache=cache, cross_cache=cross_cache, return_weights=True, **kw)
                 for t in range(T)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1), full, rtol=1e-12, atol=1e-12)
    if cross:
        torch.testing.assert_close(torch.cat([s[1] for s in steps], 1), w_full, rtol=1e-12, atol=1e-12)
    assert len(cache) == T


def test_submodule_names_and_defaults():
    m = TransformerLayer(E, H)
    assert [n for n, _ in m.named_children()] == ["attn_norm", "self_attn", "ffn_norm", "ffn", "dropout"]
    assert m.ffn.fc1.out_features == 4 * E and isinstance(m.ffn.act, nn.ReLU)
    c = TransformerLayer(E, H, 8, cross_attention=True, activation="gelu", score="cosine", dropout=0.1)
    assert [n for n, _ in c.named_children()] == ["attn_norm", "self_attn", "cross_norm", "cross_attn", "ffn_norm",
                                                  "ffn", "dropout"]
    assert isinstance(c.ffn.act, nn.GELU) and c.cross_attn.dropout == 0.1 and c.ffn.dropout.p == 0.1
    assert type(c.self_attn.score).__name__ == "Cosine"


def test_feed_forward_dropout_is_between_the_layers(gen):
    ffn = randomize(FeedForward(E, 24, dropout=0.5).to(DT)).train()
    x = torch.randn(B, T, E, generator=gen, dtype=DT)
    torch.manual_seed(0)
    out = ffn(x)
    torch.manual_seed(0)
    hidden = F.dropout(torch.relu(x @ ffn.fc1.weight.T + ffn.fc1.bias), 0.5)
    torch.testing.assert_close(out, hidden @ ffn.fc2.weight.T + ffn.fc2.bias)


@pytest.mark.parametrize("args, kwargs, match", [
    ((30, 4), {}, "dim"),
    ((16, 0), {}, "num_heads"),
    ((16, 4), {"activation": "tanh"}, "activation"),
    ((16, 4), {"dropout": 1.0}, "dropout"),
    ((16, 4, 0), {}, "ffn_dim"),
    ((16, 4), {"kv_heads": 3}, "kv_heads"),
])
def test_bad_layer_arguments_raise(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerLayer(*args, **kwargs)


def test_bad_forward_arguments_raise():
    enc, dec = TransformerLayer(E, H), TransformerLayer(E, H, cross_attention=True)
    x, mem = torch.randn(2, 3, E), torch.randn(2, 4, E)
    with pytest.raises(ValueError, match="x must be"):
        enc(torch.randn(2, 3, E + 1))
    with pytest.raises(ValueError, match="context must be"):
        enc(x, context=torch.randn(1, 3, E))
    with pytest.raises(ValueError, match="memory"):
        enc(x, memory=mem)
    with pytest.raises(ValueError, match="memory"):
        dec(x)
    with pytest.raises(ValueError, match="key_mask"):
        enc(x, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="activation"):
        FeedForward(E, 8, activation="swish")


# ----------------------------------------------------------------------------------------------- positions


@pytest.mark.parametrize("dim", [16, 7])
def test_sinusoidal_positions_formula(dim):
    pe = sinusoidal_positions(40, dim, dtype=DT)
    assert pe.shape == (40, dim) and pe.dtype == DT
    want = torch.empty(40, dim, dtype=DT)
    for p in range(40):
        for i in range(dim):
            angle = p / 10000 ** (2 * (i // 2) / dim)
            want[p, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(pe, want, rtol=0, atol=1e-12)
    single = sinusoidal_positions(40, dim)
    assert single.dtype == torch.get_default_dtype()
    torch.testing.assert_close(single, want.to(single.dtype), rtol=0, atol=0)  # cast once, from float64


def test_positional_encoding_sinusoidal_and_learned(gen):
    x = torch.randn(2, 5, E, generator=gen)
    sin = PositionalEncoding(E, max_len=12)
    torch.testing.assert_close(sin(x, start=3), x + sinusoidal_positions(12, E)[3:8])
    assert "sinusoids" not in sin.state_dict() and list(sin.state_dict()) == []
    torch.manual_seed(0)
    learned = PositionalEncoding(E, max_len=4000, kind="learned")
    assert isinstance(learned.table, nn.Embedding) and list(learned.state_dict()) == ["table.weight"]
    assert abs(learned.table.weight.std().item() - 0.02) < 0.002
    torch.testing.assert_close(learned(x, 7), x + learned.table.weight[7:12])
    assert learned(x.double()).dtype == DT


def test_positional_encoding_errors():
    pe = PositionalEncoding(E, max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.randn(1, 5, E), start=4)
    with pytest.raises(ValueError, match="max_len"):
        PositionalEncoding(E, max_len=8, kind="learned")(torch.randn(1, 9, E))
    with pytest.raises(ValueError, match="x must be"):
        pe(torch.randn(1, 5, E + 2))
    with pytest.raises(ValueError, match="kind"):
        PositionalEncoding(E, kind="rotary")
    with pytest.raises(ValueError, match="even dim"):
        PositionalEncoding(7)
    with pytest.raises(ValueError, match="max_len"):
        PositionalEncoding(E, max_len=0)
