"""qkv.capture_attention: every attention of a forward pass, the model's outputs untouched; attention rollout."""

import pytest
import torch
from torch import nn

import qkv
from qkv.layers import TransformerLayer
from qkv.models import BahdanauSeq2Seq, RNNConfig, TransformerConfig, TransformerSeq2Seq
from qkv.vision import CBAM, ECA, NonLocal, SelectiveKernel, SqueezeExcite
from qkv.vision.bisenet import AttentionRefinement, FeatureFusion


class UserModel(nn.Module):
    """A model of a user's own, built from qkv layers: 2 self-attention layers, a cross layer, pooling."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.embed = nn.Embedding(20, dim)
        self.layers = nn.ModuleList([TransformerLayer(dim, heads, dropout=0.1) for _ in range(2)])
        self.cross = TransformerLayer(dim, heads, cross_attention=True)
        self.pool = qkv.AttentionPooling(dim, hidden_dim=8)
        self.mix = qkv.Attention("general", query_dim=dim, key_dim=dim)
        self.out = nn.Linear(dim, 3)

    def forward(self, ids, memory, key_mask):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, key_mask=key_mask)
        x = self.cross(x, memory=memory)
        x = x + self.mix(x, memory)
        pooled, _ = self.pool(x, key_mask)
        return self.out(pooled)


def _inputs(gen, b=3, t=7, s=5, dim=16):
    ids = torch.randint(0, 20, (b, t), generator=gen)
    key_mask = torch.arange(t)[None] < torch.tensor([7, 4, 6])[:b, None]
    return ids, torch.randn(b, s, dim, generator=gen), key_mask


def test_records_match_each_module_called_with_weights(gen):
    torch.manual_seed(0)
    model = UserModel().eval()
    ids, memory, key_mask = _inputs(gen)
    plain = model(ids, memory, key_mask)
    with qkv.capture_attention(model) as records:
        captured = model(ids, memory, key_mask)
    torch.testing.assert_close(captured, plain)  # the weights path, to float rounding of the fused one
    names = [(r.name, r.kind, r.layer) for r in records]
    assert names == [("layers.0.self_attn", "self", 0), ("layers.1.self_attn", "self", 1),
                     ("cross.self_attn", "self", None), ("cross.cross_attn", "cross", None),
                     ("mix", "cross", None), ("pool", "pooling", None)]
    # by hand: each module with return_weights=True, per head
    with torch.no_grad():
        x = model.embed(ids)
        for i, layer in enumerate(model.layers):
            h = layer.attn_norm(x)
            _, w = layer.self_attn(h, key_mask=key_mask, return_weights=True, average_weights=False)
            torch.testing.assert_close(records[i].weights, w)
            assert records[i].weights.shape == (3, 4, 7, 7) and records[i].num_heads == 4
            x = layer(x, key_mask=key_mask)
        y = model.cross(x, memory=memory)
        h = model.cross.attn_norm(x)
        x1 = x + model.cross.self_attn(h)
        _, w = model.cross.cross_attn(model.cross.cross_norm(x1), memory, return_weights=True, average_weights=False)
        torch.testing.assert_close(records[3].weights, w)
        _, w = model.mix(y, memory, return_weights=True)
        torch.testing.assert_close(records[4].weights, w[:, None])
        _, w = model.pool(y + model.mix(y, memory), key_mask)
        torch.testing.assert_close(records[5].weights, w[:, None, None])
        assert records[5].weights[1, 0, 0, 4:].abs().max() == 0  # padding gets nothing


def test_training_outputs_and_gradients_unchanged(gen):
    """Dropout draws the same numbers with and without capturing; outputs and gradients are the same (to float
    rounding: the weights path runs instead of the fused one)."""
    torch.manual_seed(0)
    model = UserModel().train()
    ids, memory, key_mask = _inputs(gen)
    torch.manual_seed(5)
    a = model(ids, memory, key_mask)
    ga = torch.autograd.grad(a.square().sum(), model.layers[0].self_attn.q_proj.weight)[0]
    torch.manual_seed(5)
    with qkv.capture_attention(model) as records:
        b = model(ids, memory, key_mask)
    gb = torch.autograd.grad(b.square().sum(), model.layers[0].self_attn.q_proj.weight)[0]
    torch.testing.assert_close(b, a)
    torch.testing.assert_close(gb, ga)
    assert all(not r.weights.requires_grad for r in records)
    assert torch.allclose(records[0].weights.sum(-1)[key_mask[:, None].expand(-1, 4, -1)], torch.tensor(1.0))


def test_hooks_removed_and_nothing_recorded_outside(gen):
    model = UserModel().eval()
    ids, memory, key_mask = _inputs(gen)
    with pytest.raises(RuntimeError, match="boom"), qkv.capture_attention(model):
        raise RuntimeError("boom")
    assert qkv.hooks.observer() is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with qkv.capture_attention(model) as records:
        pass
    model(ids, memory, key_mask)
    assert records == []
    with qkv.capture_attention(model), pytest.raises(RuntimeError, match="do not nest"), \
            qkv.capture_attention(model):
        pass
    with pytest.raises(TypeError, match="nn.Module"), qkv.capture_attention(lambda x: x):
        pass


def test_bahdanau_decoder_steps_joined(gen):
    torch.manual_seed(0)
    model = BahdanauSeq2Seq(RNNConfig(src_vocab=15, tgt_vocab=12, embed_dim=8, hidden_dim=16)).eval()
    src = torch.randint(4, 15, (2, 6), generator=gen)
    src_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    tgt = torch.randint(4, 12, (2, 5), generator=gen)
    logits, attn = model(src, src_mask, tgt, return_attention=True)
    with qkv.capture_attention(model) as records:
        again = model(src, src_mask, tgt)
    assert torch.equal(logits, again)
    (r,) = records
    assert r.kind == "cross" and r.calls == 5 and r.weights.shape == (2, 1, 5, 6)
    torch.testing.assert_close(r.weights[:, 0], attn)
    with qkv.capture_attention(model, join_steps=False) as steps:
        model(src, src_mask, tgt)
    assert len(steps) == 5 and all(s.weights.shape == (2, 1, 1, 6) for s in steps)


def test_kv_cache_decoding_joins_to_the_parallel_pass(gen):
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab=15, tgt_vocab=12, dim=16, num_heads=2, num_layers=2, dropout=0.0)
    model = TransformerSeq2Seq(cfg).eval()
    src = torch.randint(4, 15, (2, 6), generator=gen)
    src_mask = torch.ones(2, 6, dtype=torch.bool)
    tgt = torch.randint(4, 12, (2, 4), generator=gen)
    with qkv.capture_attention(model) as parallel:
        model(src, src_mask, tgt)
    with qkv.capture_attention(model) as stepwise:
        state = model.encode(src, src_mask)
        for t in range(tgt.shape[1]):
            model.decode_step(tgt[:, t], state)
    by_name = {r.name: r for r in parallel}
    assert [r.name for r in parallel] == [r.name for r in stepwise]
    assert {r.kind for r in parallel if r.name.startswith("decoder")} == {"self", "cross"}
    for r in stepwise:
        p = by_name[r.name]
        if r.name.startswith("decoder"):
            assert r.calls == 4 and (r.kind != "self" or r.causal)
        torch.testing.assert_close(r.weights, p.weights, atol=1e-5, rtol=1e-4)


def test_vision_maps(gen):
    torch.manual_seed(0)
    model = nn.Sequential(CBAM(8, reduction=2), SqueezeExcite(8, reduction=2), ECA(8), NonLocal(8, subsample=True),
                          SelectiveKernel(8, reduction=2), AttentionRefinement(8)).eval()
    x = torch.randn(2, 8, 6, 4, generator=gen)
    with qkv.capture_attention(model) as records:
        y = model(x)
    assert torch.equal(y, model(x))
    assert [(r.name, r.kind) for r in records] == [("0.channel", "channel"), ("0.spatial", "spatial"),
                                                  ("1", "channel"), ("2", "channel"), ("3", "self"),
                                                  ("4", "channel"), ("5", "channel")]
    h, cbam = model[0](x, return_attention=True)
    torch.testing.assert_close(records[0].weights, cbam.channel.flatten(1))
    torch.testing.assert_close(records[1].weights, cbam.spatial[:, 0])
    h = model[2](model[1](h))
    _, w = model[3](h, return_attention=True)
    torch.testing.assert_close(records[4].weights, w[:, None])
    assert records[4].grid == ((6, 4), (3, 2)) and records[4].weights.shape == (2, 1, 24, 6)
    _, w = model[4](model[3](h), return_attention=True)
    assert records[5].weights.shape == (2, 2, 8)
    torch.testing.assert_close(records[5].weights, w)
    ffm = FeatureFusion(8).eval()
    with qkv.capture_attention(ffm) as fused:
        out = ffm(x[:, :3], x[:, 3:])
    _, w = ffm(x[:, :3], x[:, 3:], return_attention=True)
    assert torch.equal(out, ffm(x[:, :3], x[:, 3:])) and fused[0].kind == "channel"
    torch.testing.assert_close(fused[0].weights, w.flatten(1))


def test_plain_function_in_a_user_module(gen):
    class Mine(nn.Module):
        def forward(self, x):
            return qkv.attention(x, x, x, score="cosine")

    x = torch.randn(2, 5, 4, generator=gen)
    with qkv.capture_attention(Mine()) as records:
        out = Mine()(x)  # not the captured instance: still recorded, under the innermost module known (none)
        Mine()(x)
    assert len(records) == 1 and records[0].calls == 2 and records[0].name == "Mine"  # outside any forward
    _, w = qkv.attention(x, x, x, score="cosine", return_weights=True)
    torch.testing.assert_close(records[0].weights[:, 0, :5], w)
    assert torch.equal(out, qkv.attention(x, x, x, score="cosine"))


def _rollout_reference(layers, residual=0.5):
    t = layers[0].shape[-1]
    r = torch.eye(t, dtype=torch.float64).expand(layers[0].shape[0], t, t)
    for a in layers:
        a = a.double().mean(1)
        a = residual * torch.eye(t, dtype=torch.float64) + (1 - residual) * a
        a = a / a.sum(-1, keepdim=True)
        r = torch.einsum("bij,bjk->bik", a, r)
    return r


def test_rollout(gen):
    layers = [torch.softmax(torch.randn(2, 3, 6, 6, generator=gen), -1) for _ in range(3)]
    out = qkv.attention_rollout(layers)
    torch.testing.assert_close(out.double(), _rollout_reference(layers))
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 6))
    one = torch.softmax(torch.randn(1, 4, 4, generator=gen), -1)
    torch.testing.assert_close(qkv.attention_rollout([one]), 0.5 * torch.eye(4) + 0.5 * one)  # rows sum to 1
    torch.testing.assert_close(qkv.attention_rollout([one], residual=0.0), one)
    with pytest.raises(ValueError, match="at least one"):
        qkv.attention_rollout([])
    with pytest.raises(ValueError, match="layer 1"):
        qkv.attention_rollout([one, torch.rand(1, 5, 5)])
    with pytest.raises(ValueError, match="residual"):
        qkv.attention_rollout([one], residual=2)


def test_a_model_running_the_three_stages_itself(gen):
    class Stages(nn.Module):
        def forward(self, q, k, v):
            w = qkv.normalize_scores(qkv.compute_scores(q, k, "dot"))
            return qkv.weighted_sum(w, v)

    q, k = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    v = torch.randn(2, 5, 6, generator=gen)
    model = Stages()
    with qkv.capture_attention(model) as records:
        out = model(q, k, v)
    (r,) = records
    assert (r.name, r.kind) == ("Stages", "cross") and torch.equal(out, model(q, k, v))
    torch.testing.assert_close(r.weights[:, 0], torch.softmax(q @ k.transpose(1, 2), -1))


def test_layers_called_by_keyword(gen):
    mha = qkv.MultiHeadAttention(8, 2).eval()
    x, mem = torch.randn(1, 4, 8, generator=gen), torch.randn(1, 6, 8, generator=gen)
    with qkv.capture_attention(mha) as records:
        mha(query=x)
        mha(query=x, key=mem)
    assert [(r.kind, tuple(r.weights.shape)) for r in records] == [("self", (1, 2, 4, 4)), ("cross", (1, 2, 4, 6))]


class _HFLikeAttention(nn.Module):
    """What the Hugging Face integration makes of a model's attention module: it sets ``attention_kind`` on the
    instance and calls qkv.attention inside (here through a submodule of its own, that declares nothing)."""

    def __init__(self, dim=8, heads=2, via_child=False):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.heads, self.via_child = heads, via_child
        self.core = _Core()

    def forward(self, hidden_states, encoder_hidden_states=None):
        kv = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        q, k, v = (t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)
                   for t in (self.q(hidden_states), self.k(kv), self.v(kv)))
        out = self.core(q, k, v) if self.via_child else qkv.attention(q, k, v)
        return out.transpose(1, 2).flatten(2)


class _Core(nn.Module):
    def forward(self, q, k, v):
        return qkv.attention(q, k, v)


def test_any_module_calling_qkv_attention_is_recorded_with_the_kind_it_declares(gen):
    """Names come from the module whose forward made the call, kinds from the nearest enclosing module that declares
    ``attention_kind`` (set on an instance, as the Hugging Face integration does); a module declaring None is self
    when called with one sequence; capture itself knows no layer class."""
    model = nn.ModuleDict({"enc": _HFLikeAttention(), "dec": _HFLikeAttention(via_child=True),
                           "plain": _HFLikeAttention()})
    model["enc"].attention_kind = None  # kind from the call: one sequence -> self
    model["dec"].attention_kind = "cross"  # declared, though the call inside passes k computed from the same x
    x, mem = torch.randn(2, 4, 8, generator=gen), torch.randn(2, 6, 8, generator=gen)
    with qkv.capture_attention(model) as records:
        model["enc"](x)
        model["dec"](x)
        model["dec"](x, mem)
        model["plain"](x, mem)
    got = [(r.name, r.module, r.kind, tuple(r.weights.shape)) for r in records]
    assert got == [("enc", "_HFLikeAttention", "self", (2, 2, 4, 4)),
                   ("dec.core", "_Core", "cross", (2, 2, 8, 6)),  # two calls joined: 4 + 4 queries, keys padded
                   ("plain", "_HFLikeAttention", "cross", (2, 2, 4, 6))]
    assert records[1].calls == 2
    with torch.no_grad():
        q = model["enc"].q(x).view(2, 4, 2, 4).transpose(1, 2)
        k = model["enc"].k(x).view(2, 4, 2, 4).transpose(1, 2)
    torch.testing.assert_close(records[0].weights, torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1))
    model["dec"].attention_kind = "sideways"
    with pytest.raises(ValueError, match="attention_kind must be one of"), qkv.capture_attention(model):
        model["dec"](x)


def test_the_observer_point():
    """qkv.hooks: one observer at a time; its own calls of the core are not reported back to it."""
    from qkv import hooks

    seen = []

    class Observer:
        def on_call(self, fn, q, k, v, kwargs):
            seen.append("call")
            fn(q, k, v, **{**kwargs, "return_weights": True})  # not reported again
            return fn(q, k, v, **kwargs)

        def on_weights(self, weights):
            seen.append("weights")

        def on_map(self, kind, weights):
            seen.append(kind)

    x = torch.randn(1, 3, 4)
    assert not hooks.active()
    obs = Observer()
    hooks.subscribe(obs)
    try:
        with pytest.raises(RuntimeError, match="already subscribed"):
            hooks.subscribe(Observer())
        assert hooks.active()
        torch.testing.assert_close(qkv.attention(x, x, x), torch.softmax(x @ x.mT / 2.0, -1) @ x)
        qkv.weighted_sum(torch.ones(1, 3, 3) / 3, x)
        SqueezeExcite(4, reduction=2)(torch.randn(1, 4, 2, 2))
    finally:
        hooks.unsubscribe(obs)
    assert seen == ["call", "weights", "channel"] and not hooks.active()
    assert SqueezeExcite.attention_kind == "channel" and qkv.MultiHeadAttention.attention_kind is None


def test_each_attention_runs_once(gen, monkeypatch):
    """Under a capture, a call that did not ask for its weights is not run a second time to get them: every path
    of qkv.attention is entered once per call, as many times as without capturing."""
    from qkv import flex
    from qkv import path_table as table

    calls = []
    for module, name in [(table, "sdpa"), (table, "sdpa_causal"), (table, "dot_weights"),
                         (table, "reference"), (table, "online_softmax"), (flex, "_reference")]:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or
                            _real(*a, **kw))
    torch.manual_seed(0)
    model = UserModel().eval()
    ids, memory, key_mask = _inputs(gen)
    with torch.no_grad():
        model(ids, memory, key_mask)
        plain = len(calls)
        calls.clear()
        with qkv.capture_attention(model) as records:
            model(ids, memory, key_mask)
    assert plain == len(records) == 6 and len(calls) == plain
    assert "sdpa" not in calls  # the calls that asked for no weights ran the weights path instead
