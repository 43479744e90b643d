"""Head statistics (qkv.viz.head_stats) against hand-computed values on constructed attention maps, and against a
plain loop over rows on random maps with random tokens."""

import math

import pytest
import torch

from qkv.viz.head_stats import STATISTICS, head_statistics


def _previous_token_map(t):
    w = torch.zeros(t, t)
    w[0, 0] = 1
    w[torch.arange(1, t), torch.arange(t - 1)] = 1
    return w


def _uniform_causal(t):
    return torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]


def test_a_previous_token_head():
    t = 6
    s = head_statistics(_previous_token_map(t)[None], list("abcdef"))
    assert s["previous"].item() == pytest.approx(1.0)
    assert s["first"].item() == pytest.approx(2 / t)  # rows 0 and 1 sit on the first token
    assert s["distance"].item() == pytest.approx((t - 1) / t)
    assert s["entropy"].item() == pytest.approx(0.0, abs=1e-6)
    assert s["induction"].isnan()  # no token repeats


def test_a_uniform_causal_head():
    t = 5
    s = head_statistics(_uniform_causal(t)[None])
    rows = range(t)
    assert s["entropy"].item() == pytest.approx(sum(math.log(i + 1) for i in rows) / t, rel=1e-5)
    assert s["first"].item() == pytest.approx(sum(1 / (i + 1) for i in rows) / t, rel=1e-5)
    assert s["previous"].item() == pytest.approx(sum(1 / (i + 1) for i in range(1, t)) / (t - 1), rel=1e-5)
    assert s["distance"].item() == pytest.approx(sum(i / 2 for i in rows) / t, rel=1e-5)
    assert s["induction"].isnan()  # no tokens given


def test_an_induction_head_and_a_previous_token_head_on_a_repeated_sequence():
    tokens = ["a", "b", "c", "a", "b", "c"]
    induction = torch.zeros(6, 6)
    induction[:3] = _uniform_causal(6)[:3]
    for i, j in ((3, 1), (4, 2), (5, 3)):  # attend to what followed the earlier occurrence of the current token
        induction[i, j] = 1
    both = torch.stack([induction, _previous_token_map(6)])
    s = head_statistics(both, tokens)
    assert s["induction"].tolist() == pytest.approx([1.0, 0.0])
    assert s["previous"][1].item() == pytest.approx(1.0)
    assert s["previous"][0].item() == pytest.approx((1 / 2 + 1 / 3 + 0 + 0 + 0) / 5)


def test_cross_attention_has_no_positions():
    w = torch.softmax(torch.randn(2, 3, 7), -1)
    s = head_statistics(w, self_attention=False)
    assert s["distance"].isnan().all() and s["previous"].isnan().all() and s["induction"].isnan().all()
    torch.testing.assert_close(s["first"], w[..., 0].mean(-1))


def _reference(w, tokens):
    """One head, one row at a time, as the definitions say (float64)."""
    tq, tk = w.shape
    out = {k: [] for k in STATISTICS}
    ind = []
    for r in range(tq):
        i = tk - tq + r
        row = w[r].double()
        if row.sum() == 0:
            continue
        out["entropy"].append(-sum(p * math.log(p) for p in row.tolist() if p > 0))
        out["first"].append(row[0].item())
        out["distance"].append(sum(p * abs(i - j) for j, p in enumerate(row.tolist())))
        if i >= 1:
            out["previous"].append(row[i - 1].item())
        follows = [j for j in range(1, i + 1) if tokens[j - 1] == tokens[i]]
        if follows:
            ind.append(sum(row[j].item() for j in follows))
    out["induction"] = ind
    return {k: (sum(v) / len(v) if v else float("nan")) for k, v in out.items()}


@pytest.mark.parametrize("tq", [9, 1, 4])
def test_random_maps_equal_a_loop_over_rows(tq, gen):
    tk = 9
    tokens = torch.randint(0, 3, (tk,), generator=gen).tolist()
    scores = torch.randn(3, tq, tk, generator=gen, dtype=torch.float64)
    allowed = torch.arange(tk)[None, :] <= torch.arange(tk - tq, tk)[:, None]
    w = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    w[1, 0] = 0  # a row with no key: left out of the means
    got = head_statistics(w, tokens)
    for h in range(3):
        want = _reference(w[h], tokens)
        for k in STATISTICS:
            if math.isnan(want[k]):
                assert got[k][h].isnan(), k
            else:
                assert got[k][h].item() == pytest.approx(want[k], rel=1e-5, abs=1e-6), (k, h)


def test_bad_shapes_are_errors():
    with pytest.raises(ValueError, match=r"\(H, Tq, Tk\)"):
        head_statistics(torch.rand(4, 4))
    with pytest.raises(ValueError, match="tokens"):
        head_statistics(torch.rand(1, 4, 4), ["a"])
