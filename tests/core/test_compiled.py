"""The compiled kernels: the fused additive/MLP tile against the eager tiles (values and gradients), the fallback
when compiling fails, and qkv inside a caller's torch.compile."""

import logging

import pytest
import torch
from torch import nn

import qkv
from qkv import compiled, mods, tiling
from qkv.scores import MLP, Additive

pytestmark = [pytest.mark.skipif(not compiled.available(), reason="torch.compile is not available here"),
              pytest.mark.usefixtures("one_thread")]


@pytest.fixture
def small_tiles(monkeypatch):
    """Fused tiles from any size, tiles of at most 4096 elements: several tiles per call on small inputs."""
    monkeypatch.setattr(tiling, "FUSED_MIN_ELEMENTS", 1)


def eager(monkeypatch):
    monkeypatch.setenv("QKV_NO_COMPILE", "1")


@pytest.mark.parametrize("make", [lambda: Additive(6, 5, 16, max_elements=4096),
                                  lambda: MLP(6, 5, 16, act_layer=nn.GELU, max_elements=1 << 20)])
def test_fused_tiles_equal_the_eager_ones(gen, small_tiles, monkeypatch, make):
    torch.manual_seed(0)
    sc = make()
    q = torch.randn(3, 20, 6, generator=gen, requires_grad=True)
    k = torch.randn(3, 17, 5, generator=gen, requires_grad=True)
    v = torch.randn(3, 17, 4, generator=gen, requires_grad=True)
    mask = torch.arange(17)[None, None] < torch.tensor([17, 9, 1])[:, None, None]
    params = [q, k, v, *sc.parameters()]

    def run():
        out, w = qkv.attention(q, k, v, score=sc, mask=mask, return_weights=True)
        grads = torch.autograd.grad(out.square().sum() + w.sum(), params)
        with torch.no_grad():  # the online-softmax path over the same tiles
            online = qkv.attention(q, k, v, score=sc, mask=mask)
        return out, w, grads, online

    fused = run()
    eager(monkeypatch)
    expected = run()
    torch.testing.assert_close(fused[0], expected[0])
    torch.testing.assert_close(fused[1], expected[1])
    for a, b in zip(fused[2], expected[2], strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(fused[3], expected[3])


def test_forms():
    assert Additive(4, 4, 8).fused_form()[2] == "Tanh"
    assert MLP(4, 4, [8, 8]).fused_form() is None  # two hidden layers: not one fused reduction
    assert MLP(4, 4, 8, act_layer=lambda: nn.GELU(approximate="tanh")).fused_form() is None
    assert MLP(4, 4, 8).fused_form()[2] == "ReLU"


def test_falls_back_and_says_so_once(gen, small_tiles, monkeypatch, caplog):
    sc = Additive(4, 4, 8, max_elements=512)
    q, k, v = (torch.randn(2, 12, 4, generator=gen) for _ in range(3))
    expected = sc.reference(q, k)

    def broken(*args, **kw):
        raise RuntimeError("InductorError: no working C++ compiler")

    monkeypatch.setattr(compiled, "kernel", broken)
    monkeypatch.setattr(compiled, "_broken", None)
    with caplog.at_level(logging.WARNING, logger="qkv.compiled"):
        torch.testing.assert_close(sc(q, k), expected)
        torch.testing.assert_close(sc(q, k), expected)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "C++ compiler" in said[0] and "Additive" in said[0]
    assert not compiled.available()


def test_inside_the_callers_torch_compile(gen):
    """A model with ALiBi self-attention and an additive attention, compiled by its user: same outputs."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = qkv.MultiHeadAttention(16, 4, score_mod=mods.alibi(4), mask_mod=mods.causal)
            self.attn = qkv.Attention(Additive(16, 16, 8))

        def forward(self, x):
            y = self.mha(x)
            return self.attn(y, x)

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 128, 16, generator=gen)  # 128 x 128 scores: the fused FlexAttention path
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model)(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
