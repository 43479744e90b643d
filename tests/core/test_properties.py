"""Property tests: for any shapes and any mask (all-False included), weights are a (sub)distribution."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv import scores as S
from tests.reference import attention_ref

_ADDITIVE = {}


def additive(d):
    if d not in _ADDITIVE:
        _ADDITIVE[d] = S.Additive(d, d, 5, max_elements=40, dtype=torch.float64)
    return _ADDITIVE[d]


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3), tq=st.integers(0, 6), tk=st.integers(0, 7), d=st.integers(1, 5),
    score=st.sampled_from(["dot", "scaled_dot", "cosine", "additive"]),
    normalize=st.sampled_from(["softmax", "sparsemax"]),
    mask_kind=st.sampled_from(["bool", "all_false", "float", "none"]),
    return_weights=st.booleans(), seed=st.integers(0, 2**31 - 1), magnitude=st.sampled_from([1.0, 1e3]),
)
def test_weights_are_distributions_and_everything_is_finite(b, tq, tk, d, score, normalize, mask_kind,
                                                            return_weights, seed, magnitude):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, tq, d, generator=g, dtype=torch.float64) * magnitude).requires_grad_()
    k = (torch.randn(b, tk, d, generator=g, dtype=torch.float64) * magnitude).requires_grad_()
    v = torch.randn(b, tk, 3, generator=g, dtype=torch.float64).requires_grad_()
    allowed = torch.rand(b, tq, tk, generator=g) > 0.5
    if mask_kind == "all_false":
        allowed = torch.zeros_like(allowed)
    mask = {"bool": allowed, "all_false": allowed, "none": None,
            "float": torch.zeros(b, tq, tk, dtype=torch.float64).masked_fill(~allowed, float("-inf"))}[mask_kind]
    if mask is None:
        allowed = torch.ones_like(allowed)
    sc = additive(d) if score == "additive" else score
    out, w = qkv.attention(q, k, v, score=sc, mask=mask, normalize=normalize, return_weights=True)
    fast = qkv.attention(q, k, v, score=sc, mask=mask, normalize=normalize, return_weights=return_weights)
    fast = fast[0] if return_weights else fast
    # an independent float64 reference (explicit formulas, no qkv path): both calls, whichever path they took
    with torch.no_grad():
        want_out, want_w = attention_ref(q, k, v, score=sc, mask=mask, normalize=normalize)
    torch.testing.assert_close(w, want_w)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(fast, want_out)
    assert torch.all(w >= 0)
    assert torch.all(w[~allowed] == 0)
    sums = w.sum(-1)
    has_key = allowed.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert torch.all(sums[~has_key] == 0)
    assert torch.all(out[~has_key] == 0) and torch.all(fast[~has_key] == 0)
    (out.square().sum() + fast.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
