"""Hostile input on every path: garbage under the mask, empty axes, fully masked rows.

A key that no query of its batch row may attend to (key padding, or a column of a general mask that is
False for every query) is *masked*: padding memory is often uninitialised, so it may hold anything. Each case
runs twice, with NaN / inf / -inf / the dtype's max at the masked keys and values and with zeros there; on
every path (fused or tiled ``impl="auto"``, ``impl="reference"``; with and without ``return_weights``; with and
without autograd) the outputs, weights and gradients must agree, be finite, match a float64 reference on
the clean data, give exactly zero rows where a query has no allowed key and exactly zero gradients at the
masked keys and values. Keys masked for only some queries are seen by the others, so they hold real data.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv import scores as S
from qkv.masks import causal_mask
from tests.reference import attention_ref

SCORES = ["dot", "scaled_dot", "cosine", "general", "additive", "additive_tiled", "mlp", "custom"]
SAME_DIM = {"dot", "scaled_dot", "cosine", "custom"}
GARBAGE = ["nan", "inf", "-inf", "max", "big"]  # "big" (1e6) is finite and harmless: left in place on CPU
MASKS = ["none", "padding", "general", "shared", "float", "all_false"]
# (impl, return_weights, autograd): every path attention() can take
PATHS = [(impl, rw, grad) for impl in ("auto", "reference") for rw in (False, True) for grad in (True, False)]
TOL = {torch.float64: {"atol": 1e-9, "rtol": 1e-7}, torch.float32: {"atol": 2e-5, "rtol": 1e-4}}


def custom(q, k):
    return torch.tanh(q @ k.transpose(-2, -1))


def make_score(name, dq, dk, dtype):
    if name == "general":
        return S.General(dq, dk, bias=True, dtype=dtype)
    if name == "additive":
        return S.Additive(dq, dk, 6, dtype=dtype)
    if name == "additive_tiled":  # one (q, k) pair per tile: tiles, checkpoints and the online softmax
        return S.Additive(dq, dk, 6, max_elements=6, dtype=dtype)
    if name == "mlp":
        return S.MLP(dq, dk, (5, 4), act_layer=torch.nn.Tanh, dtype=dtype)
    if name == "custom":
        return custom
    return name


def make_mask(kind, batch, tq, tk, gen, dtype):
    """``(mask, allowed)``: the mask given to attention and its boolean meaning, expanded to the scores."""
    if kind == "none":
        return None, torch.ones(*batch, tq, tk, dtype=torch.bool)
    if kind == "padding":
        lengths = torch.randint(0, max(tk, 1), (batch[0],), generator=gen)  # < Tk: some padding
        m = (torch.arange(tk) < lengths[:, None]).view(batch[0], *([1] * len(batch)), tk)
    elif kind == "shared":
        m = torch.rand(tq, tk, generator=gen) > 0.5
    elif kind == "all_false":
        m = torch.zeros(*batch, tq, tk, dtype=torch.bool)
    else:
        m = torch.rand(*batch, tq, tk, generator=gen) > 0.5
        if tq:
            m[..., int(torch.randint(0, tq, (1,), generator=gen)), :] = False  # a fully masked row
    if tk and kind != "all_false":
        m[..., int(torch.randint(0, tk, (1,), generator=gen))] = False  # a key that no query sees
    allowed = m.expand(*batch, tq, tk)
    if kind == "float":
        m = torch.randn(m.shape, generator=gen, dtype=dtype).masked_fill(~m, float("-inf"))
    return m, allowed


def fill(t, unused, value):
    """``t (..., Tk, D)`` with the rows where ``unused (..., Tk)`` is True set to ``value``."""
    return t.masked_fill(unused[..., None], value)


def run(q, k, v, score, mask, normalize, path, cot, **kw):
    """Output, weights and gradients (inputs, then the score's parameters) of one attention call."""
    impl, rw, grad = path
    leaves = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
    params = list(score.parameters()) if isinstance(score, torch.nn.Module) else []
    with torch.set_grad_enabled(grad):
        r = qkv.attention(*leaves, score=score, mask=mask, normalize=normalize, impl=impl, return_weights=rw, **kw)
    out, w = r if rw else (r, None)
    if not grad:
        return out, w, None
    assert out.requires_grad
    grads = torch.autograd.grad((out * cot).sum(), leaves + params, allow_unused=True)
    return out, w, [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves + params, strict=True)]


def reference(q, k, v, score, mask, normalize, cot, is_causal):
    """Float64 output, weights and gradients by the papers' formulas (tests/reference.py), on clean data."""
    score = copy.deepcopy(score).double() if isinstance(score, torch.nn.Module) else score
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    params = list(score.parameters()) if isinstance(score, torch.nn.Module) else []
    m = None if mask is None else mask.double() if mask.dtype != torch.bool else mask
    if is_causal:
        causal = causal_mask(q.shape[-2], k.shape[-2])
        m = causal if m is None else m & causal if m.dtype == torch.bool else m.masked_fill(~causal, float("-inf"))
    out, w = attention_ref(*leaves, score, m, normalize)
    grads = torch.autograd.grad((out * cot.double()).sum(), leaves + params, allow_unused=True)
    return out, w, [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves + params, strict=True)]


def check(*, b, heads, tq, tk, d, dv, score_name, normalize, mask_kind, garbage, dtype, is_causal, dropout, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dk = d if score_name in SAME_DIM else d + 1
    batch = (b, 2) if heads else (b,)
    kv_batch = (b, 1) if heads else (b,)  # keys and values shared by the heads: broadcast
    q = torch.randn(*batch, tq, d, generator=gen, dtype=dtype)
    k = torch.randn(*kv_batch, tk, dk, generator=gen, dtype=dtype)
    v = torch.randn(*kv_batch, tk, dv, generator=gen, dtype=dtype)
    cot = torch.randn(*batch, tq, dv, generator=gen, dtype=dtype)
    score = make_score(score_name, d, dk, dtype)
    mask, allowed = make_mask(mask_kind, batch, tq, tk, gen, dtype)
    if is_causal:
        allowed = allowed & causal_mask(tq, tk)
    unused = ~allowed.any(dim=-2)  # (*batch, Tk): no query may attend to this key
    if heads:
        unused = unused.all(dim=1, keepdim=True)  # masked for every head sharing the key
    bad = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "max": torch.finfo(dtype).max,
           "big": 1e6}[garbage]
    k_clean, v_clean = fill(k, unused, 0.0), fill(v, unused, 0.0)
    k_bad, v_bad = fill(k, unused, bad), fill(v, unused, bad)
    empty_row = ~allowed.any(dim=-1)  # (*batch, Tq)
    kw = {"is_causal": is_causal, "dropout": 0.3 if dropout else 0.0}
    ref = reference(q, k_clean, v_clean, score, mask, normalize, cot, is_causal)
    for path in PATHS:
        torch.manual_seed(seed)  # the same dropout draws for both runs
        got = run(q, k_bad, v_bad, score, mask, normalize, path, cot, **kw)
        torch.manual_seed(seed)
        want = run(q, k_clean, v_clean, score, mask, normalize, path, cot, **kw)
        where = f"path {path}"
        out, w, grads = got
        assert out.shape == (*batch, tq, dv), where
        assert torch.isfinite(out).all(), where
        assert torch.all(out[empty_row] == 0), where
        torch.testing.assert_close(out, want[0], msg=where)
        if not dropout:
            torch.testing.assert_close(out, ref[0].to(dtype), **TOL[dtype], msg=where)
        if w is not None:
            assert w.shape == (*batch, tq, tk), where
            assert torch.isfinite(w).all() and torch.all(w[empty_row] == 0), where
            torch.testing.assert_close(w, want[1], msg=where)
            torch.testing.assert_close(w, ref[1].to(dtype), **TOL[dtype], msg=where)
        if grads is not None:
            for i, (g, g_clean) in enumerate(zip(grads, want[2], strict=True)):
                assert torch.isfinite(g).all(), f"{where}: gradient {i}"
                torch.testing.assert_close(g, g_clean, msg=f"{where}: gradient {i}")
            gk, gv = grads[1], grads[2]
            assert torch.all(gk[unused.expand(gk.shape[:-1])] == 0) and torch.all(gv[unused.expand(gv.shape[:-1])] == 0)
            if not dropout:
                for i, (g, g_ref) in enumerate(zip(grads, ref[2], strict=True)):
                    torch.testing.assert_close(g, g_ref.to(dtype), **TOL[dtype], msg=f"{where}: gradient {i}")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    b=st.integers(1, 2), heads=st.booleans(), tq=st.integers(0, 4), tk=st.integers(0, 5), d=st.integers(1, 4),
    dv=st.integers(1, 3), score_name=st.sampled_from(SCORES), normalize=st.sampled_from(["softmax", "sparsemax"]),
    mask_kind=st.sampled_from(MASKS), garbage=st.sampled_from(GARBAGE),
    dtype=st.sampled_from([torch.float32, torch.float64]), is_causal=st.booleans(),
    dropout=st.sampled_from([False, False, True]), seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
def test_masked_garbage_never_leaks(**case):
    check(**case)


@pytest.mark.parametrize("zeroing", ["copy", "check first"])
@pytest.mark.parametrize("normalize", ["softmax", "sparsemax"])
@pytest.mark.parametrize("score_name", SCORES)
def test_masked_garbage_every_score_and_normaliser(score_name, normalize, zeroing, monkeypatch):
    """Every score x normaliser x path at least once, whatever hypothesis draws: padding and general masks; the
    unseen keys zeroed at once (small inputs on a CPU) or after a check of their values (larger ones)."""
    from qkv.paths import common

    monkeypatch.setattr(common, "CHECK_ABOVE", 0 if zeroing == "check first" else 1 << 30)
    cases = [("padding", True, "nan"), ("general", False, "inf"), ("float", True, "max"), ("shared", False, "big")]
    for i, (mask_kind, heads, garbage) in enumerate(cases):
        check(b=2, heads=heads, tq=3, tk=5, d=3, dv=2, score_name=score_name, normalize=normalize,
              mask_kind=mask_kind, garbage=garbage, dtype=torch.float64, is_causal=False, dropout=False, seed=i)


@pytest.mark.parametrize("normalize", ["softmax", "sparsemax"])
@pytest.mark.parametrize("score_name", SCORES)
@pytest.mark.parametrize("tq,tk", [(3, 0), (0, 4), (0, 0)])
def test_empty_axes_every_score_and_path(score_name, normalize, tq, tk):
    """Tk = 0: zero output (..., Tq, Dv) and weights (..., Tq, 0); Tq = 0: empty output; gradients all zero."""
    dk = 3 if score_name in SAME_DIM else 2
    score = make_score(score_name, 3, dk, torch.float32)
    for mask in (None, torch.ones(2, 1, tk, dtype=torch.bool)):
        for path in PATHS:
            q, k, v = torch.randn(2, tq, 3), torch.randn(2, tk, dk), torch.randn(2, tk, 4)
            out, w, grads = run(q, k, v, score, mask, normalize, path, torch.ones(2, tq, 4))
            assert out.shape == (2, tq, 4) and torch.all(out == 0), path
            assert w is None or w.shape == (2, tq, tk), path
            for g in grads or []:
                assert torch.all(g == 0), path


def test_garbage_under_the_mask_changes_nothing_sdpa_would_see():
    """The fused path against SDPA itself: with clean padding, qkv and SDPA agree; with garbage, qkv is unmoved."""
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    mask = qkv.masks.key_padding_mask(torch.tensor([6, 3]))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    k[1, 3:], v[1, 3:] = math.nan, math.inf
    torch.testing.assert_close(qkv.attention(q, k, v, mask=mask), want)


def test_what_is_derived_from_a_mask_is_kept_while_the_mask_is_unchanged():
    """The small tensors the GPU path derives from a mask (rows with a key, unseen keys) are made once per mask,
    and again after the mask changes in place."""
    from qkv.paths import common

    made = []

    def make(m):
        made.append(1)
        return m.any(dim=-1, keepdim=True)

    mask = torch.tensor([[True, False], [False, False]])
    first = common.derived(mask, "rows", make)
    assert common.derived(mask, "rows", make) is first and len(made) == 1
    mask[1, 0] = True
    again = common.derived(mask, "rows", make)
    assert len(made) == 2 and again.tolist() == [[True], [True]]
    assert common.derived(mask.clone(), "rows", make) is not again  # another tensor: its own


def test_zeroing_unseen_keys_off_the_cpu_takes_no_tensor_from_another_device():
    """Off the CPU (the meta device stands in for a GPU here), the zeroed keys and values are made from the inputs
    and Python numbers only: a CPU tensor among the arguments would be copied to the GPU on every call, and the
    call would wait for that copy."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from qkv.paths import common

    class Devices(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for a in torch.utils._pytree.tree_leaves((args, kwargs or {})):
                if isinstance(a, torch.Tensor):
                    self.seen.add((str(func), a.device.type))
            return func(*args, **(kwargs or {}))

    k, v = torch.empty(2, 3, 5, 4, device="meta"), torch.empty(2, 3, 5, 6, device="meta")
    pad = torch.ones(2, 1, 1, 5, dtype=torch.bool, device="meta")
    with Devices() as mode:
        k0, v0 = common.zero_unseen_keys(pad, k, v, 4)
    assert k0.shape == k.shape and v0.shape == v.shape
    assert any("where" in f for f, _ in mode.seen)
    assert {d for _, d in mode.seen} == {"meta"}, sorted(mode.seen)


def test_unseen_keys_are_checked_before_they_are_copied_only_when_large():
    """On a CPU, keys and values above ``CHECK_ABOVE`` elements are zeroed only when an unseen row holds something
    harmful (left as they are, no copy, otherwise); smaller ones are zeroed at once (the copy is cheaper than the
    check). Either way the unseen rows reach nothing."""
    from qkv.paths import common

    pad = (torch.arange(64) < 48)[None, None, None, :].expand(2, 1, 1, 64)
    for shape in ((2, 4, 64, 64), (1, 1, 64, 2)):  # above and below the bound
        k, v = torch.randn(shape), torch.randn(shape)
        large = k.numel() + v.numel() > common.CHECK_ABOVE
        k0, v0 = common.zero_unseen_keys(pad, k, v, shape[-1])
        assert (k0 is k and v0 is v) == large, shape
        v[..., 50, :] = math.nan
        k0, v0 = common.zero_unseen_keys(pad, k, v, shape[-1])
        assert k0 is not k and v0 is not v, shape
        assert torch.all(k0[..., 48:, :] == 0) and torch.all(v0[..., 48:, :] == 0), shape
        torch.testing.assert_close(v0[..., :48, :], v[..., :48, :])


@pytest.fixture
def no_zeroing():
    qkv.set_zero_unseen_keys(False)
    yield
    qkv.set_zero_unseen_keys(True)


@pytest.mark.parametrize("return_weights", [False, True])
def test_without_zeroing_finite_padding_gives_the_same_and_nan_padding_reaches_the_output(no_zeroing, gen,
                                                                                         return_weights):
    """``set_zero_unseen_keys(False)`` skips the copies: finite padding changes nothing (a fully padded row is
    still zero), and NaN in padding then reaches the output, as in PyTorch's SDPA (the trade-off it documents)."""
    b, t, d = 3, 6, 4
    q, k, v = (torch.randn(b, 2, t, d, generator=gen, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([6, 2, 0])
    pad = (torch.arange(t)[None] < lengths[:, None])[:, None, None]
    got = qkv.attention(q, k, v, mask=pad, return_weights=return_weights)
    got = got[0] if return_weights else got
    want = attention_ref(q, k, v, mask=pad.expand(b, 2, t, t))[0]
    torch.testing.assert_close(got, want)
    assert torch.all(got[2] == 0)
    dirty = v.masked_fill(~pad.transpose(-2, -1), float("nan"))
    out = qkv.attention(q, k, dirty, mask=pad, return_weights=return_weights)
    out = out[0] if return_weights else out
    assert torch.isnan(out[1]).any()
    qkv.set_zero_unseen_keys(True)
    clean = qkv.attention(q, k, dirty, mask=pad, return_weights=return_weights)
    torch.testing.assert_close(clean[0] if return_weights else clean, want)
    with pytest.raises(ValueError, match="True or False"):
        qkv.set_zero_unseen_keys("no")
