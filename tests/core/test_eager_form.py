"""The fused form of the pairwise scores computed eagerly in cache-sized chunks (:mod:`qkv.eager_form`) equals the
textbook formula in float64: every activation, factored or not, chunks that split the rows and the keys, broadcast
batch axes, an output bias; ``qkv.attention`` without compilation takes it in inference, and gradients still flow
through the checkpointed tiles."""

import pytest
import torch
from torch import nn

import qkv
from qkv import compiled, eager_form, tiling
from qkv.scores import MLP, Additive

pytestmark = pytest.mark.usefixtures("one_thread")


def _formula(qp, kp, form):
    w, b, act = form
    s = tiling.ACTIVATIONS[act](qp.double()[..., :, None, :] + kp.double()[..., None, :, :]) @ w.double()
    return s if b is None else s + b.double()


@pytest.mark.parametrize("act", sorted(tiling.ACTIVATIONS))
@pytest.mark.parametrize("chunk", [1 << 6, 1 << 10, 1 << 21])  # keys split, rows split, one chunk
@pytest.mark.parametrize("spread", [1.0, 30.0])  # factored for tanh and sigmoid, and beyond the factors' range
def test_the_chunks_equal_the_formula(gen, monkeypatch, act, chunk, spread):
    monkeypatch.setattr(eager_form, "CHUNK", chunk)
    qp = spread * torch.randn(2, 1, 7, 12, generator=gen)
    kp = spread * torch.randn(3, 9, 12, generator=gen)
    form = (torch.randn(12, generator=gen), torch.tensor(0.3), act)
    factors = tiling._factored(act, qp, kp)
    assert (factors is not None) == (act in ("Tanh", "Sigmoid") and spread == 1.0)
    a, c = (qp, kp) if factors is None else factors[:2]
    got = eager_form.scores(a, c, form, factors is not None)
    want = _formula(qp, kp, form)
    assert got.shape == want.shape == (2, 3, 7, 9) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * spread)


def test_float64_stays_float64(gen):
    qp, kp = (torch.randn(n, 8, dtype=torch.float64, generator=gen) for n in (5, 6))
    form = (torch.randn(8, dtype=torch.float64, generator=gen), None, "Tanh")
    eq, ek, _ = tiling._factored("Tanh", qp, kp)
    assert torch.allclose(eager_form.scores(eq, ek, form, True), _formula(qp, kp, form), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: Additive(16, 12, 32), lambda: MLP(16, 12, 32, act_layer=nn.GELU)])
def test_attention_without_compilation_takes_the_chunks_in_inference(gen, monkeypatch, make):
    monkeypatch.setattr(eager_form, "CHUNK", 1 << 9)
    seen = []
    real = eager_form.scores
    monkeypatch.setattr(eager_form, "scores", lambda *a: seen.append(1) or real(*a))
    compiled.set_compile("0")
    try:
        torch.manual_seed(0)
        sc = make()
        q, k, v = torch.randn(3, 40, 16, generator=gen), torch.randn(3, 50, 12, generator=gen), torch.randn(3, 50, 5)
        with torch.no_grad(), qkv.trace_paths() as taken:
            out = qkv.attention(q, k, v, score=sc)
        want = torch.softmax(sc.double().reference(q.double(), k.double()), -1) @ v.double()
        assert taken == ["tiled"] and seen
        assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-6)
        sc.float()
        q.requires_grad_(True)  # gradients: the checkpointed tiles, not the chunks
        seen.clear()
        qkv.attention(q, k, v, score=sc).sum().backward()
        assert not seen and q.grad is not None and torch.isfinite(q.grad).all()
    finally:
        compiled.set_compile(None)


def test_what_it_takes(gen):
    qp, kp = torch.randn(4, 8, generator=gen), torch.randn(5, 8, generator=gen)
    w = torch.randn(8, generator=gen)
    assert eager_form.usable((w, None, "Tanh"), qp, kp)
    assert not eager_form.usable(None, qp, kp)
    assert not eager_form.usable((w, None, "Tanh"), qp.bfloat16(), kp.bfloat16())
    assert not eager_form.usable((w.requires_grad_(True), None, "Tanh"), qp, kp)
    with torch.no_grad():
        assert eager_form.usable((w, None, "Tanh"), qp, kp)


def test_auto_compiles_the_additive_kernel_from_the_eager_chunks(gen, monkeypatch):
    """Timed eager chunks start the compilation of the fused kernel on the arguments of one of its tiles."""
    started = []
    monkeypatch.setattr(tiling, "FUSED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(compiled, "BACKGROUND_SHARE", 0.0)
    for kernel in (tiling.PAIRED, tiling.EXP):
        monkeypatch.setattr(kernel, "_submit", lambda sig, count, args, kw, layout=None, k=kernel:
                            started.append((k.name, len(args))) or count.queued.add("x"))
        monkeypatch.setattr(kernel, "counts", {})
    compiled.set_compile("auto")
    try:
        sc = Additive(8, 8, 6)
        q, k, v = (torch.randn(3, 30, 8, generator=gen) for _ in range(3))
        with torch.no_grad():
            for _ in range(compiled.MIN_CALLS + 2):
                qkv.attention(q, k, v, score=sc)
    finally:
        compiled.set_compile(None)
    assert started == [(tiling.PAIRED.name, 8)]  # the paired kernel's eight arguments, once
