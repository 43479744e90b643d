"""Modifiers on the CPU a block of the scores at a time (qkv.paths.chunked): the fused block function and its
backward against float64 formulas, the weights and the gradients of qkv.attention with several modifiers and masks
(causal, windows, documents, key padding, rows with no key, broadcast keys), the keys a mask hides skipped, when the
block kernels compile, and the fallback when they cannot."""

import logging
import math

import pytest
import torch

import qkv
from qkv import compiled, flex, mods
from qkv.paths import chunked

pytestmark = pytest.mark.usefixtures("one_thread")
DOUBLE = torch.float64


def indices(b, h, tq, tk, at=(0, 0, 0, 0)):
    return (torch.full((1, 1, 1, 1), at[0]), (torch.arange(h) + at[1]).view(1, h, 1, 1),
            (torch.arange(tq) + at[2]).view(1, 1, tq, 1), (torch.arange(tk) + at[3]).view(1, 1, 1, tk))


def t5_module(h, gen):
    t5 = mods.RelativePositionBias(h, 8, 16).double()
    with torch.no_grad():
        t5.bias.normal_(generator=gen)
    return t5


def modifiers(h, gen, t):
    """name -> (score_mod, mask_mod), every kind qkv has (and a user's modifier)."""
    ids = torch.randint(0, 3, (t,), generator=gen).sort().values
    user_bias = torch.randn(h, dtype=DOUBLE, generator=gen)
    return {
        "alibi+causal": (mods.alibi(h), mods.causal),
        "symmetric alibi": (mods.alibi(h, symmetric=True), None),
        "t5+document": (t5_module(h, gen), mods.document(ids)),
        "softcap+window": (mods.softcap(1.5), mods.sliding_window(3)),
        "chain+prefix": (mods.chain(mods.alibi(h), mods.softcap(4.0)), mods.prefix_lm(2)),
        "two-sided window": (None, mods.sliding_window(2, causal=False)),
        "or_masks": (None, mods.or_masks(mods.causal, mods.sliding_window(2, causal=False))),
        "user": (lambda s, b, h_, q, k: s * 0.5 + user_bias[h_] * (q - k).abs(), lambda b, h_, q, k: (q + k) % 3 != 1),
    }


def formula(q, k, v, score_mod, mask_mod, allowed=None, scale=None):
    """The float64 formula: softmax over the allowed keys of the modified scaled scores; rows with none: zero."""
    b, h, tq, tk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    bi, hi, qi, ki = (torch.arange(b).view(b, 1, 1, 1), torch.arange(h).view(1, h, 1, 1),
                      torch.arange(tq).view(1, 1, tq, 1), torch.arange(tk).view(1, 1, 1, tk))
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    keep = torch.ones(s.shape, dtype=torch.bool)
    if mask_mod is not None:
        keep = keep & mask_mod(bi, hi, qi, ki)
    if allowed is not None:
        keep = keep & allowed
    w = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    return w @ v, w


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 3 query rows (2 when masked) and one head: several blocks, and keys skipped, on tiny inputs."""
    monkeypatch.setattr(chunked, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(chunked, "MIN_ROWS", 3)
    monkeypatch.setattr(chunked, "MASKED_ROWS", 2)


@pytest.fixture
def eager():
    compiled.set_compile(False)
    yield
    compiled.set_compile(None)


# -------------------------------------------------------------------------------------------- the block function


@pytest.mark.parametrize("name", ["alibi+causal", "t5+document", "softcap+window", "user"])
def test_the_block_function_against_the_formula(gen, name):
    """Weights and log-sum-exp of a block that starts inside the scores (offsets on every axis), with a bias and a
    key-padding ``keep`` that leaves one row with no key."""
    h, rows, tk = 3, 4, 6
    score_mod, mask_mod = modifiers(8, gen, 32)[name]
    at = (1, 2, 5, 3)
    s = torch.randn(1, h, rows, tk, dtype=DOUBLE, generator=gen)
    bias = torch.randn(1, 1, rows, tk, dtype=DOUBLE, generator=gen)
    keep = torch.rand(1, h, rows, tk, generator=gen) > 0.3
    keep[0, 1, 2] = False  # a row with no key
    dest = torch.empty_like(s)
    lse = chunked.block_probs(s.clone(), torch.tensor(at), keep, bias, score_mod, mask_mod, dest=dest)
    idx = indices(1, h, rows, tk, at)
    m = s if score_mod is None else score_mod(s, *idx)
    m = m + bias
    allowed = keep if mask_mod is None else keep & mask_mod(*idx)
    masked = m.masked_fill(~allowed, float("-inf"))
    want = torch.softmax(masked, -1).nan_to_num(0.0)
    torch.testing.assert_close(dest, want)
    want_lse = torch.logsumexp(masked, -1, keepdim=True)
    want_lse = torch.where(torch.isinf(want_lse), float("inf"), want_lse)
    torch.testing.assert_close(lse, want_lse)
    assert torch.equal(dest[0, 1, 2], torch.zeros(tk)) and lse[0, 1, 2, 0] == float("inf")


@pytest.mark.parametrize("name", ["alibi+causal", "softcap+window", "chain+prefix", "user"])
def test_the_block_backward_against_autograd(gen, name):
    """``p`` and ``ds`` of :func:`block_grads` (written over ``s`` and ``dp``) against autograd of the formula."""
    h, rows, tk = 2, 5, 7
    score_mod, mask_mod = modifiers(4, gen, 32)[name]
    at = (0, 1, 3, 2)
    s = torch.randn(1, h, rows, tk, dtype=DOUBLE, generator=gen, requires_grad=True)
    v = torch.randn(1, h, tk, 3, dtype=DOUBLE, generator=gen)
    do = torch.randn(1, h, rows, 3, dtype=DOUBLE, generator=gen)
    idx = indices(1, h, rows, tk, at)
    m = s if score_mod is None else score_mod(s, *idx)
    allowed = torch.ones(m.shape, dtype=torch.bool) if mask_mod is None else mask_mod(*idx).expand(m.shape)
    masked = m.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(masked, -1).nan_to_num(0.0)
    out = p @ v
    (want_ds,) = torch.autograd.grad(out, s, do)
    lse = torch.logsumexp(masked, -1, keepdim=True).detach()
    lse = torch.where(torch.isinf(lse), float("inf"), lse)
    s0, dp = s.detach().clone(), do @ v.transpose(-1, -2)
    delta = (do * out.detach()).sum(-1, keepdim=True)
    chunked.block_grads(s0, torch.tensor(at), None, None, score_mod, mask_mod, lse=lse, dp=dp, delta=delta,
                        modified=False)
    torch.testing.assert_close(s0, p.detach())
    torch.testing.assert_close(dp, want_ds)


# ------------------------------------------------------------------------------------------ through qkv.attention


def inputs(gen, b=2, h=4, tq=9, tk=9, d=5, kb=None, kh=None):
    q = torch.randn(b, h, tq, d, dtype=DOUBLE, generator=gen)
    k = torch.randn(kb or b, kh or h, tk, d, dtype=DOUBLE, generator=gen)
    v = torch.randn(kb or b, kh or h, tk, d + 1, dtype=DOUBLE, generator=gen)
    return q, k, v


@pytest.mark.parametrize("mode", ["eager", "auto"])
def test_weights_and_gradients_with_every_modifier(gen, small_blocks, mode, monkeypatch):
    """Outputs, weights and gradients (inputs, and T5's learned table) of qkv.attention on the CPU against the
    float64 formula, in blocks of 2-3 rows, for every kind of modifier."""
    if mode == "eager":
        compiled.set_compile(False)
    try:
        for name, (score_mod, mask_mod) in modifiers(4, gen, 9).items():
            q, k, v = inputs(gen)
            with torch.no_grad():
                out, w = qkv.attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, return_weights=True)
            want_out, want_w = formula(q, k, v, score_mod, mask_mod)
            torch.testing.assert_close(w, want_w, msg=name)
            torch.testing.assert_close(out, want_out, msg=name)
            params = [t.requires_grad_() for t in (q, k, v)]
            if isinstance(score_mod, torch.nn.Module):
                params += list(score_mod.parameters())
            got = torch.autograd.grad(qkv.attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod).square().sum(),
                                      params)
            want = torch.autograd.grad(formula(q, k, v, score_mod, mask_mod)[0].square().sum(), params)
            for a, b, what in zip(got, want, ["q", "k", "v", "table"], strict=False):
                torch.testing.assert_close(a, b, msg=f"{name}: d{what}")
    finally:
        compiled.set_compile(None)


def test_padding_causal_offset_and_broadcast_keys(gen, small_blocks, eager):
    """Key padding that empties a whole sequence (zero output, zero gradients, never NaN), ``is_causal`` with a query
    offset, and keys and values shared by every head (their gradients summed over the heads)."""
    q, k, v = inputs(gen, tq=5, tk=9, kh=1)
    pad = (torch.arange(9)[None] < torch.tensor([7, 0])[:, None])[:, None, None]  # the second sequence: no key
    params = [t.requires_grad_() for t in (q, k, v)]
    out = qkv.attention(q, k, v, mask=pad, score_mod=mods.alibi(4), is_causal=True, q_offset=4)
    shifted = mods.offset(mods.causal, 4, score=False)
    want, _ = formula(q, k, v, mods.offset(mods.alibi(4), 4, score=True), shifted, allowed=pad)
    torch.testing.assert_close(out, want)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    got = torch.autograd.grad(out.square().sum(), params)
    expected = torch.autograd.grad(want.square().sum(), params)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
        assert torch.isfinite(a).all()
    assert got[1].shape == k.shape and torch.equal(got[0][1], torch.zeros_like(got[0][1]))


def test_weights_too_small_for_a_normal_float_are_zero(gen, small_blocks, eager, monkeypatch):
    """Scores that fall more than 87 below their row's maximum give float32 weights below the smallest normal number:
    the blocks write them as zero (subnormal numbers make the matrix products that read them several times slower),
    forward and backward, and everything else stays the float64 formula's."""
    q, k, v = inputs(gen, b=2, h=2, tq=6, tk=40, d=4)

    def steep(s, b, h, q_idx, kv_idx):
        return s - 2.3 * (h + 1) * (q_idx - kv_idx).abs()

    want, w64 = formula(q, k, v, steep, None)
    tiny = torch.finfo(torch.float32).tiny
    assert ((w64 > 0) & (w64 < tiny)).any()  # the formula has weights that float32 can only hold as subnormals
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    with torch.no_grad():  # (weights that are differentiated take the checkpointed stages, not the blocks)
        out, w = qkv.attention(q32, k32, v32, score_mod=steep, return_weights=True)
    assert not ((w > 0) & (w < tiny)).any()
    torch.testing.assert_close(w.double(), w64, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    probs = {}
    real = chunked.block_grads

    def spy(s, *args, **kwargs):
        result = real(s, *args, **kwargs)
        probs.setdefault("p", []).append(s.clone())  # the backward's probabilities, written over s
        return result

    monkeypatch.setattr(chunked.GRADS, "fn", spy)
    got = torch.autograd.grad(qkv.attention(q32, k32, v32, score_mod=steep).square().sum(), (q32, k32, v32))
    assert probs and not any(((p > 0) & (p < tiny)).any() for p in probs["p"])
    params = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(formula(*params, steep, None)[0].square().sum(), params)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


def test_gradcheck(gen, eager, monkeypatch):
    """torch.autograd.gradcheck through the blocks: ALiBi and a learned per-head bias (a tensor the modifier's
    closure holds), soft-capped, under a causal mask."""
    monkeypatch.setattr(chunked, "MASKED_ROWS", 2)  # and keys skipped
    q, k, v = (t.requires_grad_() for t in inputs(gen, b=1, h=2, tq=4, tk=4, d=2))
    table = torch.randn(2, dtype=DOUBLE, generator=gen, requires_grad=True)

    def f(q, k, v, table):
        def learned(s, b, h, q_idx, kv_idx):
            return s + table[h] * (q_idx - kv_idx)

        return qkv.attention(q, k, v, score_mod=mods.chain(mods.alibi(2), learned, mods.softcap(2.0)),
                             mask_mod=mods.causal)

    assert torch.autograd.gradcheck(f, (q, k, v, table))


def test_training_keeps_no_scores(gen, eager):
    """The backward pass saves the inputs, the output and one log-sum-exp per query row: no (Tq, Tk) tensor."""
    q, k, v = (t.requires_grad_() for t in inputs(gen, b=1, h=2, tq=64, tk=48, d=4))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = qkv.attention(q, k, v, score_mod=mods.alibi(2), mask_mod=mods.causal)
    assert saved and all(64 * 48 not in (math.prod(s[-2:]),) for s in saved), saved
    out.sum().backward()
    assert q.grad is not None


def test_blocks_skip_the_keys_a_mask_hides(small_blocks, monkeypatch):
    """Causal: a block of rows [i0, i1) computes keys [0, i1) only; a window of 3: [i0 - 2, i1)."""
    q = torch.zeros(1, 1, 8, 2)
    causal = chunked._Plan(q, q, q, 1.0, None, mods.causal, None, None, q.dtype, None, None, None, False)
    assert [(s[3], s[4], s[5], s[6]) for s in causal.spans] == [(0, 2, 0, 2), (2, 4, 0, 4), (4, 6, 0, 6),
                                                               (6, 8, 0, 8)]
    window = chunked._Plan(q, q, q, 1.0, None, mods.sliding_window(3), None, None, q.dtype, None, None, None, False)
    assert [(s[5], s[6]) for s in window.spans] == [(0, 2), (0, 4), (2, 6), (4, 8)]
    monkeypatch.setattr(chunked, "MASK_ELEMENTS", 20)  # the mask evaluated a block or two at a time: the same
    again = chunked._Plan(q, q, q, 1.0, None, mods.sliding_window(3), None, None, q.dtype, None, None, None, False)
    assert again.spans == window.spans
    nobody = chunked._Plan(q, q, q, 1.0, None, lambda b, h, q_idx, kv_idx: (q_idx < 3) & (kv_idx >= 0), None, None,
                           q.dtype, None, None, None, False)
    assert [(s[5], s[6]) for s in nobody.spans] == [(0, 8), (0, 8), (0, 0), (0, 0)]  # rows with no key: nothing


def test_the_keys_of_the_blocks_are_found_once_for_the_axes_a_mask_ignores(small_blocks, gen):
    """A causal mask depends on neither the batch row nor the head: the keys each block needs are found on one head
    of one batch row and serve every other; a mask that depends on the batch row (key padding) is evaluated for each
    row; a user's function, whose axes are unknown, for each row and head group. The spans are the same."""
    q = torch.zeros(3, 4, 8, 2)
    calls = []

    def counted(mod, axes=None):
        def mask(b, h, q_idx, kv_idx):
            calls.append((int(b.flatten()[0]), h.numel()))
            return mod(b, h, q_idx, kv_idx)

        if axes is not None:
            mask.qkv_uses = frozenset(axes)
        return mask

    def plan(mask_fn, keep=None, axes=None):
        calls.clear()
        return chunked._Plan(q, q, q, 1.0, None, mask_fn, keep, None, q.dtype, None, None, None, False,
                             mask_axes=axes)

    known = plan(counted(mods.causal), axes=mods.uses(mods.causal))
    assert calls == [(0, 1)]
    unknown = plan(counted(mods.causal))
    assert len(calls) == 3 * 4 and known.spans == unknown.spans  # (one head per block here: small blocks)
    pad = torch.rand(3, 1, 1, 8, generator=gen) > 0.3
    padded = plan(counted(mods.causal), keep=pad, axes=mods.uses(mods.causal))
    assert sorted({b for b, _ in calls}) == [0, 1, 2] and all(n == 1 for _, n in calls)
    assert padded.spans == plan(counted(mods.causal), keep=pad).spans
    q, k, v = (torch.randn(3, 4, 8, 2, generator=gen, dtype=DOUBLE) for _ in range(3))
    with torch.no_grad():
        out, w = qkv.attention(q, k, v, mask=pad, mask_mod=mods.causal, score_mod=mods.alibi(4), return_weights=True)
    want, want_w = formula(q, k, v, mods.alibi(4), mods.causal, allowed=pad)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w, want_w)


# ------------------------------------------------------------------------------------------ compiling the blocks


def test_the_block_kernels_compile_when_they_pay(gen, monkeypatch, tmp_path):
    """``auto``: the first calls run the eager block function, timed; once their time would have paid for compiling
    (fake clock: each call "takes" 10 s), the forward and the backward kernels are compiled (a fake compiler that
    counts) and used. ``QKV_COMPILE=0``: never."""
    calls = {"now": 0.0, "reads": 0}

    def clock():
        calls["reads"] += 1
        if calls["reads"] % 2 == 0:
            calls["now"] += 10.0
        return calls["now"]

    made = []

    def fake_compile(fn, **options):
        made.append(fn.__name__)
        return fn

    monkeypatch.setattr(compiled, "clock", clock)
    monkeypatch.setattr(compiled, "_compile", fake_compile)
    monkeypatch.setattr(compiled, "_start", lambda job: job())  # the background compilation, done at once
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "_broken", None)
    for kernel in (chunked.BLOCK, chunked.GRADS):
        monkeypatch.setattr(kernel, "counts", {})
        monkeypatch.setattr(kernel, "_compiled", None)
    q, k, v = inputs(gen)
    compiled.set_compile(False)
    try:
        for _ in range(5):
            qkv.attention(q, k, v, score_mod=mods.alibi(4), return_weights=True)
        assert made == []
        compiled.set_compile("auto")
        used = []
        for _ in range(7):
            q.requires_grad_()
            qkv.attention(q, k, v, score_mod=mods.alibi(4), mask_mod=mods.causal).sum().backward()
            used.append(sum(c.compiled for c in chunked.BLOCK.counts.values()))
        assert made == ["block_probs", "block_grads"]
        assert used[:compiled.MIN_CALLS] == [0] * compiled.MIN_CALLS and used[-1] == 1
    finally:
        compiled.set_compile(None)


def test_a_modifier_the_compiler_cannot_take_runs_eager(gen, monkeypatch, caplog):
    """When compiling the block kernel fails on a user's modifier, that modifier's blocks run eager (said once) and
    compiled kernels stay on; the result is the formula's."""
    monkeypatch.setattr(compiled, "_broken", None)
    monkeypatch.setattr(chunked.BLOCK, "counts", {})
    monkeypatch.setattr(chunked.BLOCK, "_compiled", None)

    def cannot(*a, **kw):
        raise RuntimeError("Unsupported: a fake compiler failure")

    monkeypatch.setattr(compiled, "_compile", lambda fn, **options: cannot)
    monkeypatch.setattr(flex, "_eager_only", type(flex._eager_only)())

    def odd(b, h, q_idx, kv_idx):
        return (q_idx + kv_idx) % 2 == 0

    q, k, v = inputs(gen)
    compiled.set_compile(True)
    try:
        with caplog.at_level(logging.WARNING), torch.no_grad():
            out, w = qkv.attention(q, k, v, mask_mod=odd, return_weights=True)
            qkv.attention(q, k, v, mask_mod=odd, return_weights=True)
    finally:
        compiled.set_compile(None)
    said = [r.getMessage() for r in caplog.records if "could not compile" in r.getMessage()]
    assert len(said) == 1 and "odd" in said[0]
    assert compiled.reason() is None
    torch.testing.assert_close(w, formula(q, k, v, None, odd)[1])


@pytest.mark.slow
def test_the_compiled_block_kernels_are_exact(gen, small_blocks, compile_now):
    """The block kernels compiled by inductor (forward and backward): weights and gradients equal the float64
    formula, with ALiBi, a causal mask and a padded sequence."""
    q, k, v = inputs(gen, tq=7, tk=7)
    pad = (torch.arange(7)[None] < torch.tensor([7, 4])[:, None])[:, None, None]
    with torch.no_grad():
        out, w = qkv.attention(q, k, v, mask=pad, score_mod=mods.alibi(4), mask_mod=mods.causal, return_weights=True)
    want_out, want_w = formula(q, k, v, mods.alibi(4), mods.causal, allowed=pad)
    torch.testing.assert_close(w, want_w)
    torch.testing.assert_close(out, want_out)
    params = [t.requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(qkv.attention(q, k, v, mask=pad, score_mod=mods.alibi(4),
                                            mask_mod=mods.causal).square().sum(), params)
    want = torch.autograd.grad(formula(q, k, v, mods.alibi(4), mods.causal, allowed=pad)[0].square().sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert any(c.compiled for c in chunked.BLOCK.counts.values())
    assert any(c.compiled for c in chunked.GRADS.counts.values())
