"""Stateful scores (qkv.location): location-aware attention and coverage held to their papers' formulas in float64,
written here loop by loop; the smoothing normaliser; bad states refused."""

import pytest
import torch

import qkv
from qkv.location import Coverage, LocationAware
from qkv.normalize import smooth


def _conv_by_hand(state, weight):
    """``f[..., j, c] = sum_m weight[c, 0, m] * state[..., j + m - K // 2]`` with zeros outside: F * a."""
    k = weight.shape[-1]
    tk = state.shape[-1]
    out = torch.zeros(*state.shape, weight.shape[0], dtype=state.dtype)
    for j in range(tk):
        for m in range(k):
            i = j + m - k // 2
            if 0 <= i < tk:
                out[..., j, :] += state[..., i, None] * weight[:, 0, m]
    return out


def _location_scores(score, query, key, state):
    """Chorowski et al. 2015, eq. (8)-(9): e_tj = w^T tanh(W s_t + V h_j + U f_tj + b)."""
    W, V, b = score.query_proj.weight, score.key_proj.weight, score.key_proj.bias
    w, U = score.v.weight[0], score.location_proj.weight
    f = _conv_by_hand(state, score.conv.weight)  # (..., Tq, Tk, filters)
    tq, tk = query.shape[-2], key.shape[-2]
    e = torch.zeros(*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]), tq, tk, dtype=query.dtype)
    for t in range(tq):
        for j in range(tk):
            h = query[..., t, :] @ W.T + key[..., j, :] @ V.T + b + f[..., min(t, f.shape[-3] - 1), j, :] @ U.T
            e[..., t, j] = torch.tanh(h) @ w
    return e


@pytest.mark.parametrize("per_query", [False, True])
def test_location_aware_equals_the_paper_formula(per_query):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    B, H, tq, tk, dq, dk, dv = 2, 3, 2, 9, 5, 4, 3
    score = LocationAware(dq, dk, 6, filters=3, kernel_size=5).double()
    q = torch.randn(B, H, tq, dq, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, tk, dk, generator=g, dtype=torch.float64)
    v = torch.randn(B, 1, tk, dv, generator=g, dtype=torch.float64)
    state = torch.softmax(torch.randn(B, H, *((tq,) if per_query else ()), tk, generator=g, dtype=torch.float64), -1)
    beta = 1.7  # sharpening
    out, weights = qkv.attention(q, k, v, score=score.given(state), scale=beta, return_weights=True)
    e = _location_scores(score, q, k, state if per_query else state.unsqueeze(-2))
    expected = torch.softmax(beta * e, -1)
    torch.testing.assert_close(weights, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out, expected @ v, rtol=1e-10, atol=1e-12)
    # the key's part computed once gives the same
    prepared = qkv.attention(q, score.prepare_key(k), v, score=score.given(state), scale=beta, key_prepared=True)
    torch.testing.assert_close(prepared, out, rtol=1e-12, atol=1e-12)


def test_location_features_move_the_attention_with_the_previous_weights():
    """The same query and keys, the previous weights at another place: other scores (the state is read)."""
    torch.manual_seed(0)
    score = LocationAware(4, 4, 8, filters=4, kernel_size=3).double()
    q, k = torch.randn(1, 1, 4, dtype=torch.float64), torch.randn(1, 6, 4, dtype=torch.float64)
    a, b = torch.eye(6, dtype=torch.float64)[[1]], torch.eye(6, dtype=torch.float64)[[4]]
    wa = qkv.attention(q, k, k, score=score.given(a), return_weights=True)[1]
    wb = qkv.attention(q, k, k, score=score.given(b), return_weights=True)[1]
    assert not torch.allclose(wa, wb)


def test_coverage_equals_see_et_al_formula():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    score = Coverage(5, 4, 7).double()
    q = torch.randn(3, 1, 5, generator=g, dtype=torch.float64)
    k = torch.randn(3, 8, 4, generator=g, dtype=torch.float64)
    cov = torch.rand(3, 8, generator=g, dtype=torch.float64) * 2
    mask = torch.ones(3, 1, 8, dtype=torch.bool)
    mask[1, :, 5:] = False
    weights = qkv.attention(q, k, k, score=score.given(cov), mask=mask, return_weights=True)[1]
    W, V, b = score.query_proj.weight, score.key_proj.weight, score.key_proj.bias
    wc, w = score.coverage_proj.weight[:, 0], score.v.weight[0]
    # e_i = v^T tanh(W_h h_i + W_s s_t + w_c c_i + b_attn), (3, 8)
    e = torch.tanh(q @ W.T + k @ V.T + b + cov[..., None] * wc) @ w
    e = e.masked_fill(~mask[:, 0], float("-inf"))
    torch.testing.assert_close(weights[:, 0], torch.softmax(e, -1), rtol=1e-10, atol=1e-12)
    assert (weights[1, 0, 5:] == 0).all()


def test_smoothing_is_sigmoid_over_its_sum_and_masks_exactly():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    s = torch.randn(4, 3, 7, generator=g, dtype=torch.float64)
    torch.testing.assert_close(smooth(s), torch.sigmoid(s) / torch.sigmoid(s).sum(-1, keepdim=True))
    q, k = torch.randn(4, 3, 5, generator=g), torch.randn(4, 7, 5, generator=g)
    mask = torch.rand(4, 3, 7, generator=g) > 0.3
    mask[..., 0] = True
    w = qkv.attention(q, k, k, mask=mask, normalize="smooth", return_weights=True)[1]
    assert (w[~mask] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 3))
    assert smooth(torch.zeros(2, 0)).shape == (2, 0)


def test_gradients_reach_the_convolution_float64():
    torch.manual_seed(1)
    score = LocationAware(3, 3, 4, filters=2, kernel_size=3).double()
    q = torch.randn(2, 1, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    prev = torch.softmax(torch.randn(2, 5, dtype=torch.float64), -1).requires_grad_()

    def f(q, k, prev):
        return qkv.attention(q, k, k, score=score.given(prev))

    assert torch.autograd.gradcheck(f, (q, k, prev))
    f(q, k, prev).sum().backward()
    assert score.conv.weight.grad is not None and score.conv.weight.grad.abs().sum() > 0


def test_capture_records_stateful_calls_and_the_layer_takes_a_state():
    torch.manual_seed(2)
    layer = qkv.Attention(LocationAware(4, 4, 8, filters=2, kernel_size=3))
    q, k = torch.randn(2, 1, 4), torch.randn(2, 6, 4)
    prev = torch.softmax(torch.randn(2, 6), -1)
    with qkv.capture_attention(layer) as records:
        out, w = layer(q, k, state=prev, return_weights=True)
    assert len(records) == 1
    torch.testing.assert_close(records[0].weights[:, 0], w)  # recorded with a heads axis


def test_bad_states_and_sizes_are_clear_errors():
    score = LocationAware(4, 4, 8, filters=2, kernel_size=3)
    q, k = torch.randn(2, 1, 4), torch.randn(2, 6, 4)
    with pytest.raises(ValueError, match="stateful score: give it its state"):
        qkv.attention(q, k, k, score=score)
    with pytest.raises(ValueError, match=r"state \(2, 5\) does not fit"):
        qkv.attention(q, k, k, score=score.given(torch.rand(2, 5)))
    with pytest.raises(ValueError, match=r"state \(3, 6\) does not fit"):
        qkv.attention(q, k, k, score=score.given(torch.rand(3, 6)))
    with pytest.raises(ValueError, match="floating-point"):
        qkv.attention(q, k, k, score=score.given(torch.ones(2, 6, dtype=torch.long)))
    with pytest.raises(ValueError, match="kernel_size positive and odd"):
        LocationAware(4, 4, 8, kernel_size=4)
    with pytest.raises(ValueError, match="built for query_dim=4"):
        qkv.attention(torch.randn(2, 1, 5), k, k, score=score.given(torch.rand(2, 6)))
    with pytest.raises(ValueError, match="reads none"):
        qkv.Attention("dot")(q, k, state=torch.rand(2, 6))
