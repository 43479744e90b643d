"""attention(): fast paths against the reference path and an independent float64 formula."""

import copy

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv import scores as S
from qkv.masks import causal_mask
from tests.reference import attention_ref, scores_ref, softmax_ref, sparsemax_ref

D64 = torch.float64


def make_score(name, dq, dk, gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    if name == "general":
        return S.General(dq, dk, bias=True, dtype=D64)
    if name == "additive":
        return S.Additive(dq, dk, 16, dtype=D64)
    if name == "additive_tiled":
        return S.Additive(dq, dk, 16, max_elements=16 * 3 * 2, dtype=D64)
    if name == "mlp":
        return S.MLP(dq, dk, (12, 8), act_layer=torch.nn.Tanh, dtype=D64)
    if name == "custom":
        return lambda q, k: -torch.cdist(q, k)
    return name


SCORES = ["dot", "scaled_dot", "cosine", "general", "additive", "additive_tiled", "mlp", "custom"]
SAME_DIM = {"dot", "scaled_dot", "cosine", "custom"}


def make_mask(kind, b, tq, tk, gen):
    if kind is None:
        return None
    if kind == "padding":
        lengths = torch.randint(1, tk + 1, (b,), generator=gen)
        return qkv.masks.key_padding_mask(lengths, tk)
    if kind == "random":
        m = torch.rand(b, tq, tk, generator=gen) > 0.4
        m[0, 1] = False  # a fully masked row
        return m
    if kind == "float":
        m = torch.randn(b, tq, tk, generator=gen, dtype=D64)
        m[torch.rand(b, tq, tk, generator=gen) > 0.6] = float("-inf")
        m[-1, 0] = float("-inf")
        return m
    raise AssertionError(kind)


@pytest.mark.parametrize("normalize", ["softmax", "sparsemax"])
@pytest.mark.parametrize("mask_kind", [None, "padding", "random", "float"])
@pytest.mark.parametrize("score_name", SCORES)
def test_paths_match_reference(score_name, mask_kind, normalize, gen):
    b, tq, tk = 3, 5, 7
    dq = 8
    dk = 8 if score_name in SAME_DIM else 6
    q = torch.randn(b, tq, dq, generator=gen, dtype=D64)
    k = torch.randn(b, tk, dk, generator=gen, dtype=D64)
    v = torch.randn(b, tk, 4, generator=gen, dtype=D64)
    score = make_score(score_name, dq, dk, gen)
    mask = make_mask(mask_kind, b, tq, tk, gen)
    want_out, want_w = attention_ref(q, k, v, score, mask, normalize)
    for impl in ("auto", "reference"):
        out, w = qkv.attention(q, k, v, score=score, mask=mask, normalize=normalize, impl=impl, return_weights=True)
        torch.testing.assert_close(w, want_w, atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-9)
        out = qkv.attention(q, k, v, score=score, mask=mask, normalize=normalize, impl=impl)
        torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-9)
        with torch.no_grad():  # the online-softmax path of pairwise scores
            out = qkv.attention(q, k, v, score=score, mask=mask, normalize=normalize, impl=impl)
        torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-9)
        with torch.no_grad():  # weights normalised in place over the scores (no graph to keep)
            out, w = qkv.attention(q, k, v, score=score, mask=mask, normalize=normalize, impl=impl,
                                   return_weights=True)
        torch.testing.assert_close(w, want_w, atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("score_name", SCORES)
def test_prepared_keys_give_the_same_attention(score_name, gen):
    dq = 8
    dk = 8 if score_name in SAME_DIM else 6
    q = torch.randn(2, 3, dq, generator=gen, dtype=D64)
    k = torch.randn(2, 5, dk, generator=gen, dtype=D64)
    v = torch.randn(2, 5, 4, generator=gen, dtype=D64)
    score = S.get_score(make_score(score_name, dq, dk, gen))
    mask = torch.rand(2, 3, 5, generator=gen) > 0.3
    want = qkv.attention(q, k, v, score=score, mask=mask, return_weights=True)
    pk = score.prepare_key(k)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = qkv.attention(q, pk, v, score=score, mask=mask, return_weights=True, key_prepared=True)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(qkv.attention(q, pk, v, score=score, mask=mask, key_prepared=True), want[0])
    if score_name in ("general", "additive", "mlp"):
        with pytest.raises(ValueError, match="prepared key"):
            qkv.attention(q, k, v, score=score, key_prepared=True)


@pytest.mark.parametrize("score_name", SCORES)
def test_gradcheck_every_score(score_name, gen):
    dq = 4
    dk = 4 if score_name in SAME_DIM else 3
    q = torch.randn(2, 3, dq, generator=gen, dtype=D64, requires_grad=True)
    k = torch.randn(2, 4, dk, generator=gen, dtype=D64, requires_grad=True)
    v = torch.randn(2, 4, 2, generator=gen, dtype=D64, requires_grad=True)
    score = make_score(score_name, dq, dk, gen)
    mask = torch.rand(2, 3, 4, generator=gen) > 0.3
    mask[0, 0] = False
    mask[1, 2, 1] = True

    def f(q, k, v):
        return qkv.attention(q, k, v, score=score, mask=mask, return_weights=True)

    assert torch.autograd.gradcheck(f, (q, k, v))
    if isinstance(score, torch.nn.Module) and any(True for _ in score.parameters()):
        params = list(score.parameters())
        out = qkv.attention(q, k, v, score=score, mask=mask)
        grads = torch.autograd.grad(out.sum(), params)
        assert all(torch.isfinite(g).all() for g in grads)


def test_tiled_pairwise_gradients_match_untiled(gen):
    """Checkpointed tiles give the same gradients as the materialised formula, for inputs and weights."""
    torch.manual_seed(0)
    tiled = S.Additive(6, 5, 8, max_elements=8 * 2 * 3, dtype=D64)
    q = torch.randn(2, 9, 6, generator=gen, dtype=D64, requires_grad=True)
    k = torch.randn(2, 11, 5, generator=gen, dtype=D64, requires_grad=True)
    v = torch.randn(2, 11, 3, generator=gen, dtype=D64)
    assert tiled.tile_sizes(q, k) != (9, 11)
    out = qkv.attention(q, k, v, score=tiled)
    gq, gk, *gp = torch.autograd.grad(out.square().sum(), [q, k, *tiled.parameters()])
    ref = torch.softmax(tiled.reference(q, k), -1) @ v
    rq, rk, *rp = torch.autograd.grad(ref.square().sum(), [q, k, *tiled.parameters()])
    for a, b in zip([gq, gk, *gp], [rq, rk, *rp], strict=True):
        torch.testing.assert_close(a, b)


def test_the_default_tile_bound_follows_the_device():
    """Without ``max_elements``, a pairwise score's tiles hold 2**24 elements on a CPU and 2**27 on a GPU (small tiles
    ran 7x slower than the textbook formula there); a bound given is kept on every device; zero or less is refused."""
    from qkv import tiling

    sc = S.Additive(4, 4, 256)
    q, k = torch.zeros(8, 512, 4), torch.zeros(8, 512, 4)
    assert sc.max_elements is None
    assert sc.tile_sizes(q, k) == tiling.tile_sizes(512, 512, 8, 256, 1 << 24) == (512, 16)
    assert tiling.max_elements_for("cuda", None) == tiling.GPU_MAX_ELEMENTS == 1 << 27
    assert tiling.tile_sizes(512, 512, 8, 256, tiling.max_elements_for("cuda:0", None)) == (512, 128)
    assert tiling.max_elements_for("cpu", None) == tiling.DEFAULT_MAX_ELEMENTS
    assert tiling.max_elements_for(torch.device("cuda"), 4096) == 4096
    assert S.Additive(4, 4, 256, max_elements=4096).tile_sizes(q, k) == tiling.tile_sizes(512, 512, 8, 256, 4096)
    with pytest.raises(ValueError, match="max_elements must be positive"):
        S.Additive(4, 4, 8, max_elements=0)


def test_pairwise_scores_equal_formula(gen):
    q = torch.randn(2, 4, 5, generator=gen, dtype=D64)
    k = torch.randn(2, 6, 3, generator=gen, dtype=D64)
    for score in (S.Additive(5, 3, 7, dtype=D64), S.MLP(5, 3, 7, dtype=D64), S.General(5, 3, dtype=D64)):
        torch.testing.assert_close(score(q, k), scores_ref(score, q, k))


def test_batch_axes_broadcast(gen):
    q = torch.randn(2, 1, 5, 8, generator=gen, dtype=D64)
    k = torch.randn(1, 3, 7, 8, generator=gen, dtype=D64)
    v = torch.randn(1, 3, 7, 2, generator=gen, dtype=D64)
    out = qkv.attention(q, k, v)
    assert out.shape == (2, 3, 5, 2)
    torch.testing.assert_close(out, attention_ref(q, k, v)[0])
    score = S.Additive(8, 8, 4, max_elements=20, dtype=D64)
    with torch.no_grad():
        torch.testing.assert_close(qkv.attention(q, k, v, score=score), attention_ref(q, k, v, score)[0])


@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 7), (7, 3)])
def test_is_causal_matches_sdpa(tq, tk, gen):
    q = torch.randn(2, tq, 8, generator=gen)
    k = torch.randn(2, tk, 8, generator=gen)
    v = torch.randn(2, tk, 4, generator=gen)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(qkv.attention(q, k, v, is_causal=True), want)
    out, w = qkv.attention(q, k, v, is_causal=True, return_weights=True)
    torch.testing.assert_close(out, want)
    assert not w.masked_select(~causal_mask(tq, tk)).any()
    torch.testing.assert_close(qkv.attention(q, k, v, mask=causal_mask(tq, tk)), want)


def test_scale_and_temperature(gen):
    q = torch.randn(4, 6, generator=gen, dtype=D64)
    k = torch.randn(5, 6, generator=gen, dtype=D64)
    v = torch.randn(5, 2, generator=gen, dtype=D64)
    want = attention_ref(q, k, v, "dot", scale=0.3)[0]
    torch.testing.assert_close(qkv.attention(q, k, v, score="dot", scale=0.3), want)
    cos = S.Cosine(temperature=0.1)
    _, w = qkv.attention(q, k, v, score=cos, return_weights=True)
    torch.testing.assert_close(w, attention_ref(q, k, v, "cosine", scale=10.0)[1])


def test_fully_masked_rows_zero_with_finite_grads(gen):
    for score in ["scaled_dot", S.Additive(4, 4, 3, dtype=D64)]:
        for normalize in ["softmax", "sparsemax"]:
            for return_weights in (False, True):
                q = torch.randn(2, 3, 4, generator=gen, dtype=D64, requires_grad=True)
                k = torch.randn(2, 5, 4, generator=gen, dtype=D64, requires_grad=True)
                v = torch.randn(2, 5, 3, generator=gen, dtype=D64, requires_grad=True)
                mask = torch.zeros(2, 3, 5, dtype=torch.bool)
                r = qkv.attention(q, k, v, score=score, mask=mask, normalize=normalize, return_weights=return_weights)
                out = r[0] if return_weights else r
                assert torch.equal(out, torch.zeros_like(out))
                out.sum().backward()
                for t in (q, k, v):
                    assert torch.isfinite(t.grad).all()


def test_dropout_is_unbiased_and_off_at_zero(gen):
    q = torch.randn(1, 4, 8, generator=gen)
    k = torch.randn(1, 6, 8, generator=gen)
    v = torch.randn(1, 6, 3, generator=gen)
    base = qkv.attention(q, k, v)
    torch.manual_seed(0)
    draws = torch.stack([qkv.attention(q.expand(2000, -1, -1), k, v, dropout=0.3) for _ in range(5)])
    assert not torch.allclose(draws[0, 0], base[0])
    torch.testing.assert_close(draws.mean(dim=(0, 1)), base[0], atol=0.05, rtol=0.05)
    _, w = qkv.attention(q, k, v, dropout=0.3, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4))  # weights are returned before dropout


def test_stage_functions_compose(gen):
    q = torch.randn(3, 4, generator=gen, dtype=D64)
    k = torch.randn(5, 4, generator=gen, dtype=D64)
    v = torch.randn(5, 2, generator=gen, dtype=D64)
    mask = torch.tensor([True, True, False, True, False])
    s = qkv.compute_scores(q, k, "scaled_dot")
    w = qkv.normalize_scores(s, mask[None, :])
    out = qkv.weighted_sum(w, v)
    torch.testing.assert_close(out, qkv.attention(q, k, v, mask=mask[None, :]))
    assert torch.all(w[:, ~mask] == 0)


@pytest.mark.parametrize("normalize", ["softmax", "sparsemax"])
@pytest.mark.parametrize("score,scale,magnitude", [
    ("scaled_dot", None, 100.0),  # q . k ~ 8e4 overflows float16 before the 1/8 scale; the scaled score does not
    ("dot", 1e4, 1.0),  # the scaled scores themselves exceed float16's 65504
    ("cosine", 3e4, 1.0),
    ("additive", 1e3, 1.0),
])
def test_float16_on_cpu_is_finite_where_float32_is(score, scale, magnitude, normalize, gen):
    """Float16 inputs on CPU: every path finite, and as close to the exact answer as float16 allows.

    The exact answer is the float64 reference on the same (float16) inputs and score weights. The tolerance is the
    error of a plain float16 reference (at least one float16 ulp of the largest value), times 8: its raw scores
    computed in float16 where they fit (the additive score's projections, tanh and sum; the dot products here are
    built to overflow float16, so they are taken exact), then normalised exactly and stored in float16 (weights
    rounded, then their weighted sum). On tensors this small the largest error is one draw of the rounding noise:
    over 80 draws qkv's stayed within 4.3 times the plain reference's.
    """
    q = (torch.randn(2, 5, 64, generator=gen) * magnitude).half()
    k = (torch.randn(2, 7, 64, generator=gen) * magnitude).half()
    v = torch.randn(2, 7, 3, generator=gen).half()
    torch.manual_seed(0)
    sc16 = S.Additive(64, 64, 16, dtype=torch.float16) if score == "additive" else score
    sc64 = copy.deepcopy(sc16).double() if score == "additive" else score
    mask = qkv.masks.key_padding_mask(torch.tensor([7, 4]))
    ulp = torch.finfo(torch.float16).eps

    def tolerance(plain, exact):
        return 8 * max((plain.double() - exact).abs().max().item(), ulp * exact.abs().max().item())

    for m in (None, mask):
        with torch.no_grad():
            want_out, want_w = attention_ref(q.double(), k.double(), v.double(), score=sc64, mask=m,
                                             normalize=normalize, scale=scale)
        plain_w = want_w.half()
        if score == "additive":
            raw16 = scores_ref(sc16, q, k).double() * scale
            allowed = (torch.ones(2, 5, 7, dtype=torch.bool) if m is None else m.expand(2, 5, 7))
            plain_w = (softmax_ref if normalize == "softmax" else sparsemax_ref)(raw16, allowed).half()
        tol_out = tolerance((plain_w.double() @ v.double()).half(), want_out)
        tol_w = tolerance(plain_w, want_w)
        for impl in ("auto", "reference"):
            for rw in (False, True):
                for grad in (False, True):
                    with torch.set_grad_enabled(grad):
                        got = qkv.attention(q, k, v, score=sc16, scale=scale, normalize=normalize, mask=m, impl=impl,
                                            return_weights=rw)
                    out = got[0] if rw else got
                    where = (m is not None, impl, rw, grad)
                    assert out.dtype == torch.float16 and torch.isfinite(out).all(), where
                    assert (out.double() - want_out).abs().max() <= tol_out, where
                    if rw:
                        assert torch.isfinite(got[1]).all()
                        assert (got[1].double() - want_w).abs().max() <= tol_w, where


def test_half_precision_runs():
    q = torch.randn(2, 4, 8, dtype=torch.bfloat16)
    out, w = qkv.attention(q, q, q, return_weights=True, mask=torch.zeros(4, 4, dtype=torch.bool))
    assert out.dtype == torch.bfloat16 and torch.all(out == 0) and torch.all(w == 0)


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs,q,k,v,match",
    [
        ({}, (2, 3, 4), (2, 5, 4), (2, 6, 4), "same Tk"),
        ({}, (2, 3, 4), (2, 5, 6), (2, 5, 4), "same size"),
        ({"score": "cosine"}, (3, 4), (5, 3), (5, 2), "same size"),
        ({}, (4,), (5, 4), (5, 2), r"query must be \(\.\.\., T, D\)"),
        ({}, (2, 3, 4), (3, 5, 4), (3, 5, 4), "do not broadcast"),
        ({"score": "nope"}, (3, 4), (5, 4), (5, 2), "unknown score 'nope'"),
        ({"score": "additive"}, (3, 4), (5, 4), (5, 2), "learned parameters"),
        ({"normalize": "max"}, (3, 4), (5, 4), (5, 2), "unknown normalize"),
        ({"dropout": 1.0}, (3, 4), (5, 4), (5, 2), "dropout"),
        ({"mask": torch.ones(3, 4, dtype=torch.bool)}, (3, 4), (5, 4), (5, 2),
         r"mask \(3, 4\) does not broadcast to the scores \(3, 5\)"),
        ({"mask": torch.ones(3, 1, 5, dtype=torch.bool)}, (2, 3, 4), (2, 5, 4), (2, 5, 2),
         r"mask \(3, 1, 5\) does not broadcast to the scores \(2, 3, 5\)"),
        ({"mask": torch.ones(2, 3, 1, 5)}, (3, 1, 3, 4), (1, 5, 4), (1, 5, 2),
         r"mask \(2, 3, 1, 5\) does not broadcast to the scores \(3, 1, 3, 5\)"),
        ({"mask": torch.ones(3, 5, dtype=torch.long)}, (3, 4), (5, 4), (5, 2), "mask must be bool"),
        ({"mask": torch.ones(5, dtype=torch.bool)}, (3, 4), (5, 4), (5, 2), "at least 2 dims"),
        ({"score": lambda q, k: q @ q.T}, (3, 4), (5, 4), (5, 2), "custom score must return"),
        ({"impl": "fast"}, (3, 4), (5, 4), (5, 2), "impl"),
    ],
)
def test_bad_input_raises(kwargs, q, k, v, match):
    with pytest.raises(ValueError, match=match):
        qkv.attention(torch.randn(q), torch.randn(k), torch.randn(v), **kwargs)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_non_floating_tensors_raise_naming_them(name, dtype):
    args = {"query": torch.randn(2, 3, 4), "key": torch.randn(2, 5, 4), "value": torch.randn(2, 5, 2)}
    args[name] = args[name].to(dtype)
    match = f"{name} must be a floating-point tensor, got {dtype}"
    for impl in ("auto", "reference"):
        with pytest.raises(ValueError, match=match):
            qkv.attention(args["query"], args["key"], args["value"], impl=impl)
    if name != "value":
        with pytest.raises(ValueError, match=match):
            qkv.compute_scores(args["query"], args["key"])
    else:
        with pytest.raises(ValueError, match=match):
            qkv.weighted_sum(torch.rand(2, 3, 5), args["value"])
    with pytest.raises(ValueError, match=f"scores must be a floating-point tensor, got {dtype}"):
        qkv.normalize_scores(torch.randn(3, 5).to(dtype))


@pytest.mark.parametrize("name", ["query", "key", "value"])
@pytest.mark.parametrize("dtype", [D64, torch.float16, torch.bfloat16])
def test_mismatched_dtypes_raise_naming_them(name, dtype):
    """No silent promotion: scaled_dot_product_attention wants one dtype, and so does every path here."""
    args = {"query": torch.randn(2, 3, 4), "key": torch.randn(2, 5, 4), "value": torch.randn(2, 5, 2)}
    args[name] = args[name].to(dtype)
    got = {n: (dtype if n == name else torch.float32) for n in args}
    match = f"share a dtype, got query {got['query']}, key {got['key']}, value {got['value']}"
    with pytest.raises(ValueError, match=match):
        qkv.attention(args["query"], args["key"], args["value"])
    with pytest.raises(ValueError, match="weights and value must share a dtype"):
        qkv.weighted_sum(torch.rand(2, 3, 5, dtype=D64), torch.randn(2, 5, 2))


def test_stage_functions_check_shapes():
    with pytest.raises(ValueError, match=r"mask \(2, 1, 5\) does not broadcast to the scores \(3, 4, 5\)"):
        qkv.normalize_scores(torch.randn(3, 4, 5), torch.ones(2, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"batch axes of weights \(2, 3, 5\), value \(3, 5, 2\) do not broadcast"):
        qkv.weighted_sum(torch.rand(2, 3, 5), torch.randn(3, 5, 2))
    with pytest.raises(ValueError, match="query and key must share a dtype"):
        qkv.compute_scores(torch.randn(3, 4), torch.randn(5, 4, dtype=D64))


def test_dtype_mismatch_and_wrong_score_sizes():
    with pytest.raises(ValueError, match="share a dtype"):
        qkv.attention(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2, dtype=D64))
    with pytest.raises(ValueError, match="query_dim=4, key_dim=6"):
        qkv.attention(torch.randn(3, 4), torch.randn(5, 5), torch.randn(5, 2), score=S.Additive(4, 6, 8))
    with pytest.raises(ValueError, match="temperature"):
        S.Cosine(temperature=0)


@pytest.mark.parametrize("score", ["scaled_dot", "dot", "cosine"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_mixed_dtypes_under_autocast_are_cast_like_sdpa(score, return_weights, gen):
    """Under autocast a float32 learned query meets bfloat16 keys (an attention-pooling layer in AMP training):
    the inputs are cast to the autocast dtype, as autocast does for SDPA; outside autocast it is an error."""
    q = torch.randn(2, 3, 8, generator=gen)
    k = torch.randn(2, 5, 8, generator=gen).bfloat16()
    v = torch.randn(2, 5, 4, generator=gen).half()
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, :]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = qkv.attention(q, k, v, score=score, mask=mask, return_weights=return_weights)
    want = qkv.attention(q.bfloat16(), k, v.bfloat16(), score=score, mask=mask, return_weights=return_weights)
    for g, w in zip(got if return_weights else [got], want if return_weights else [want], strict=True):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)  # bfloat16 rounding, inside and outside autocast
    with pytest.raises(ValueError, match="must share a dtype"):
        qkv.attention(q, k, v, score=score)


@pytest.mark.parametrize("kw", [{}, {"impl": "reference"}, {"return_weights": True}, {"mask_mod": qkv.mods.causal},
                                {"score": S.Additive(4, 4, 5, dtype=torch.float64)}])
def test_a_mask_with_more_batch_axes_than_the_inputs(gen, kw):
    """A mask whose batch axes would enlarge the output is refused on every path with both shapes
    named; extra leading axes of size 1 are dropped, so every path gives (*batch, Tq, Dv)."""
    q = torch.randn(2, 3, 4, generator=gen, dtype=D64)
    k, v = torch.randn(2, 5, 4, generator=gen, dtype=D64), torch.randn(2, 5, 6, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match=r"mask \(4, 2, 1, 5\).*query \(2, 3, 4\)"):
        qkv.attention(q, k, v, mask=torch.ones(4, 2, 1, 5, dtype=torch.bool), **kw)
    with pytest.raises(ValueError, match=r"mask \(3, 3, 5\).*batch axes \(1,\)"):
        qkv.attention(q[:1], k[:1], v[:1], mask=torch.ones(3, 3, 5, dtype=torch.bool), **kw)
    allowed = torch.rand(2, 1, 5, generator=gen) > 0.3
    out = qkv.attention(q, k, v, mask=allowed[None, None], **kw)
    want = qkv.attention(q, k, v, mask=allowed, **kw)
    out, want = (out[0], want[0]) if kw.get("return_weights") else (out, want)
    assert out.shape == (2, 3, 6)
    torch.testing.assert_close(out, want)
