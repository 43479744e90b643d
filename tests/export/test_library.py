"""qkv inside a caller's ``torch.compile(fullgraph=True)``, ``torch.export`` (dynamic batch and lengths) and ONNX.

Each model gathers several pieces (every score, every normaliser, masks, the layers, the vision blocks) so that one
compilation and one export cover them; the traced forms are made on one input size and compared with the eager
model on others (other batch sizes and lengths), outputs and attention weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qkv
from qkv import mods, vision
from qkv.layers.transformer import TransformerLayer
from qkv.scores import MLP, Additive, General
from tests.export.harness import compiles, exports, runs_in_onnx

pytestmark = pytest.mark.slow  # compiling and exporting take seconds per model

Q, K = 16, 12  # query and key features


class Scores(nn.Module):
    """Every score (dot family, general, additive, MLP, location-aware, coverage) with weights, under a mask."""

    def __init__(self):
        super().__init__()
        self.general = General(Q, K)
        self.additive = Additive(Q, K, 8)
        self.mlp = MLP(Q, K, [8, 4])
        self.location = qkv.Attention(qkv.LocationAware(Q, K, 8, filters=3, kernel_size=5))
        self.coverage = qkv.Attention(qkv.Coverage(Q, K, 8))

    def forward(self, q, k, v, mask, state):
        outs = [qkv.attention(q[..., :K] if name in ("dot", "scaled_dot", "cosine") else q, k, v, score=score,
                              mask=mask, return_weights=True)
                for name, score in (("dot", "dot"), ("scaled_dot", "scaled_dot"), ("cosine", "cosine"),
                                    ("general", self.general), ("additive", self.additive), ("mlp", self.mlp))]
        outs.append(self.location(q, k, v, mask=mask, state=state, return_weights=True))
        outs.append(self.coverage(q, k, v, mask=mask, state=state, return_weights=True))
        return outs


class Normalisers(nn.Module):
    """Every normaliser, with a boolean mask, an additive float mask with -inf, ``is_causal`` and the modifiers."""

    def forward(self, q, k, v, mask, bias):
        outs = [qkv.attention(q, k, v, normalize=n, mask=mask, return_weights=True)
                for n in ("softmax", "sparsemax", "smooth")]
        outs.append(qkv.attention(q, k, v, mask=bias, return_weights=True))
        outs.append(qkv.attention(q, k, v, mask=bias))
        outs.append(qkv.attention(q, k, v, mask=mask))  # the fused path (SDPA), no weights
        outs.append(qkv.attention(q, k, v, is_causal=True, return_weights=True))
        outs.append(qkv.attention(q, k, v, is_causal=True))
        outs.append(qkv.attention(q, k, v, mask=mask, score_mod=mods.softcap(2.0), mask_mod=mods.sliding_window(3),
                                  return_weights=True))
        return outs


def qkv_inputs(gen, b, tq, tk):
    bias = torch.randn(b, tq, tk, generator=gen).masked_fill(torch.rand(b, tq, tk, generator=gen) < 0.3,
                                                             float("-inf"))
    return (torch.randn(b, tq, Q, generator=gen), torch.randn(b, tk, K, generator=gen),
            torch.randn(b, tk, 8, generator=gen), torch.rand(b, tq, tk, generator=gen) > 0.3, bias)


QKV_AXES = ({0: "B", 1: "Tq"}, {0: "B", 1: "Tk"}, {0: "B", 1: "Tk"}, {0: "B", 1: "Tq", 2: "Tk"},
            {0: "B", 1: "Tq", 2: "Tk"})


def _cases(gen, make, sizes=((2, 5, 7), (3, 4, 9), (2, 6, 3))):
    example, *others = (make(gen, *s) for s in sizes)
    return example, others


def _check(module, example, others, axes, tmp_path, atol=1e-5, **options):
    module.eval()
    compiles(module, example, others, atol=atol)
    exports(module, example, others, axes, atol=atol, **options)
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    runs_in_onnx(module, example, others, axes, tmp_path / "model.onnx", atol=max(atol, 1e-4), **options)


def test_every_score_compiles_and_exports(gen, tmp_path):
    def make(gen, b, tq, tk):
        q, k, v, mask, _ = qkv_inputs(gen, b, tq, tk)
        return q, k, v, mask, torch.softmax(torch.randn(b, tq, tk, generator=gen), -1)

    example, others = _cases(gen, make)
    _check(Scores(), example, others, QKV_AXES[:4] + ({0: "B", 1: "Tq", 2: "Tk"},), tmp_path)


def test_every_normaliser_mask_and_modifier_compiles_and_exports(gen, tmp_path):
    def make(gen, b, tq, tk):
        q, _, v, mask, bias = qkv_inputs(gen, b, tq, tk)
        return q, torch.randn(b, tk, Q, generator=gen), v, mask, bias

    # the causal calls need Tk >= Tq for every query to see a key; the others fully masked rows too
    example, others = _cases(gen, make, ((2, 5, 7), (3, 4, 9), (1, 6, 6)))
    _check(Normalisers(), example, others, QKV_AXES, tmp_path)


class Layers(nn.Module):
    """``Attention``, ``SelfAttention``, ``MultiHeadAttention`` with GQA (self and cross), the Transformer layers
    (an encoder layer and a decoder layer with cross-attention) and attention pooling."""

    def __init__(self, dim=32):
        super().__init__()
        self.att = qkv.Attention("additive", query_dim=dim, hidden_dim=16)
        self.self_att = qkv.SelfAttention(dim, 16)
        self.gqa = qkv.MultiHeadAttention(dim, 4, kv_heads=2)
        self.cosine = qkv.MultiHeadAttention(dim, 4, score="cosine")
        self.encoder = TransformerLayer(dim, 4, 48)
        self.decoder = TransformerLayer(dim, 4, 48, cross_attention=True, kv_heads=1)
        self.pool = qkv.AttentionPooling(dim)

    def forward(self, x, memory, memory_mask):
        a, wa = self.att(x, memory, mask=memory_mask[:, None, :], return_weights=True)
        s, ws = self.self_att(x, is_causal=True, return_weights=True)
        g, wg = self.gqa(x, is_causal=True, return_weights=True, average_weights=False)
        c, wc = self.cosine(x, memory, key_mask=memory_mask, return_weights=True)
        enc = self.encoder(memory, key_mask=memory_mask)
        dec, wd = self.decoder(x, is_causal=True, memory=enc, memory_mask=memory_mask, return_weights=True)
        pooled, wp = self.pool(enc, memory_mask)
        return a, wa, s, ws, g, wg, c, wc, dec, wd, pooled, wp


def layer_inputs(gen, b, t, s, dim=32):
    lengths = torch.randint(1, s + 1, (b,), generator=gen)
    lengths[0] = s
    return (torch.randn(b, t, dim, generator=gen), torch.randn(b, s, dim, generator=gen),
            torch.arange(s)[None, :] < lengths[:, None])


LAYER_AXES = ({0: "B", 1: "T"}, {0: "B", 1: "S"}, {0: "B", 1: "S"})


def test_layers_compile_and_export(gen, tmp_path):
    example, others = _cases(gen, layer_inputs)
    _check(Layers(), example, others, LAYER_AXES, tmp_path, atol=1e-5)


class CachedStep(nn.Module):
    """One decoding step of a GQA self-attention with its key/value cache as inputs and outputs (the form a
    served decoder takes): ``x (B, 1, E)``, ``keys``/``values`` ``(B, G, T, D)`` -> output, new keys and values."""

    def __init__(self, dim=32):
        super().__init__()
        self.mha = qkv.MultiHeadAttention(dim, 4, kv_heads=2)

    def forward(self, x, keys, values):
        cache = qkv.KVCache(keys, values)
        out, weights = self.mha(x, is_causal=True, cache=cache, return_weights=True)
        return out, weights, cache.key, cache.value


def test_kv_cache_step_compiles_and_exports(gen, tmp_path):
    step = CachedStep().eval()

    def make(gen, b, t):
        with torch.no_grad():  # a cache filled by the layer itself on a prefix
            cache = qkv.KVCache()
            step.mha(torch.randn(b, t, 32, generator=gen), is_causal=True, cache=cache)
        return torch.randn(b, 1, 32, generator=gen), cache.key, cache.value

    example, *others = (make(gen, *s) for s in ((2, 5), (3, 8), (2, 1), (1, 3)))
    axes = ({0: "B"}, {0: "B", 2: "T"}, {0: "B", 2: "T"})
    # grouped heads over a cache: a stride comparison PyTorch's symbolic shapes cannot prove (true for every T)
    _check(step, example, others, axes, tmp_path, runtime_checks=True)


class Vision(nn.Module):
    """Every vision block of :func:`vision.create` on one feature map (with its attention maps)."""

    def __init__(self, channels=16):
        super().__init__()
        self.blocks = nn.ModuleList(vision.create(name, channels) for name in vision.list_blocks()
                                    if name not in ("ffm",))
        self.ffm = vision.create("ffm", 2 * channels, out_channels=channels)

    def forward(self, x):
        outs = [block(x, return_attention=True) for block in self.blocks]
        outs.append(self.ffm(x, x, return_attention=True))
        return outs


def test_vision_blocks_compile_and_export(gen, tmp_path):
    model = Vision().eval()
    example, *others = ((torch.randn(b, 16, h, w, generator=gen),) for b, h, w in ((2, 6, 5), (3, 4, 7), (2, 9, 3)))
    _check(model, example, others, ({0: "B", 2: "H", 3: "W"},), tmp_path)


class Representative(nn.Module):
    """What inductor compiles in the tests (the example of the docs): grouped-query causal self-attention with its
    weights, then the cosine score under a mask."""

    def __init__(self, dim=32):
        super().__init__()
        self.mha = qkv.MultiHeadAttention(dim, 4, kv_heads=2)

    def forward(self, x, mask):
        y, w = self.mha(x, is_causal=True, return_weights=True)
        return y, w, qkv.attention(y, x, x, score="cosine", mask=mask)


def test_inductor_compiles_a_representative_model(gen, one_thread):
    """``torch.compile``'s default backend (inductor), ``fullgraph=True``: the generated kernels give the eager
    outputs and weights. (Every piece compiles with ``fullgraph=True`` in the tests above, with dynamo's eager
    backend; inductor's code generation takes minutes for all of them on two cores, so it runs on this one.)"""
    x = torch.randn(2, 7, 32, generator=gen)
    mask = torch.rand(2, 7, 7, generator=gen) > 0.3
    mask[..., 0] = True
    compiles(Representative().eval(), (x, mask), atol=1e-4, backend="inductor", dynamic=False)
