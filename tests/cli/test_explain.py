"""The worked example of self-attention, number by number, and the `qkv explain` command."""

import math

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.explain import EXAMPLE_INPUTS, example_self_attention, walkthrough

# From the worked example: the keys of the three inputs.
EXAMPLE_KEYS = [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
# From the article the example follows ("Illustrated: Self-Attention"): queries and values.
QUERIES = [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
VALUES = [[1, 2, 3], [2, 8, 0], [2, 6, 3]]


def softmax_by_hand(row):
    e = [math.exp(x) for x in row]
    return [x / sum(e) for x in e]


def test_projections_reproduce_the_worked_example():
    w = walkthrough("dot", scale=1.0)
    assert w.inputs.tolist() == EXAMPLE_INPUTS
    assert w.keys.tolist() == EXAMPLE_KEYS
    assert w.queries.tolist() == QUERIES
    assert w.values.tolist() == VALUES


@pytest.mark.parametrize("scaled", [False, True])
def test_scores_weights_outputs_number_by_number(scaled):
    factor = 1 / math.sqrt(3) if scaled else 1.0
    w = walkthrough("scaled_dot" if scaled else "dot")
    assert w.scale == pytest.approx(factor)
    for i, q in enumerate(QUERIES):
        scores = [sum(a * b for a, b in zip(q, k, strict=True)) * factor for k in EXAMPLE_KEYS]
        weights = softmax_by_hand(scores)
        out = [sum(weights[j] * VALUES[j][c] for j in range(3)) for c in range(3)]
        assert w.scores[i].tolist() == pytest.approx(scores, abs=1e-12)
        assert w.weights[i].tolist() == pytest.approx(weights, abs=1e-12)
        assert w.outputs[i].tolist() == pytest.approx(out, abs=1e-12)
    if not scaled:  # the article's rounded figures for input 1
        assert w.scores[0].tolist() == [2, 4, 4]
        assert w.outputs[0].tolist() == pytest.approx([1.9366, 6.6831, 1.5951], abs=1e-4)


def test_self_attention_layer_gives_the_same_outputs():
    x = torch.tensor(EXAMPLE_INPUTS, dtype=torch.float64)
    torch.testing.assert_close(example_self_attention()(x), walkthrough("scaled_dot").outputs)
    torch.testing.assert_close(example_self_attention(scale=1.0)(x), walkthrough("dot").outputs)
    out, w = qkv.attention(*(lin(x) for lin in (example_self_attention().q_proj, example_self_attention().k_proj,
                                                  example_self_attention().v_proj)), return_weights=True)
    torch.testing.assert_close(w, walkthrough("scaled_dot").weights)


def test_self_attention_scale_is_a_number_or_none():
    x = torch.tensor(EXAMPLE_INPUTS, dtype=torch.float64)
    layer = example_self_attention(scale=0.25)
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    want = torch.softmax(q @ k.T * 0.25, dim=-1) @ v
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)
    for bad in (True, False, "1"):
        with pytest.raises(ValueError, match="scale must be a number or None.*scale=1.0"):
            qkv.SelfAttention(4, 3, scale=bad)
    with pytest.raises(ValueError, match="scale must be a number or None"):
        qkv.Attention("dot", scale=True)


def my_score(q, k):
    return -torch.cdist(q, k)


def test_cli_explain_prints_every_stage(capsys, tmp_path):
    png = tmp_path / "w.png"
    assert main(["explain", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    for needle in ("keys", "queries", "values", "stage 1", "stage 2", "stage 3", "without scaling",
                   "1/sqrt(d_k)", "1.9366", "6.6831"):
        assert needle in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_explain_other_scores(capsys):
    assert main(["explain", "--score", "cosine", "--scale", "5"]) == 0
    assert "score = cosine, scale = 5.0" in capsys.readouterr().out
    assert main(["explain", "--score", "tests.cli.test_explain:my_score", "--normalize", "sparsemax"]) == 0
    out = capsys.readouterr().out
    assert "tests.cli.test_explain:my_score" in out
    assert main(["explain", "--score", "additive"]) == 0


def test_cli_threads_option_holds_the_count_while_the_command_runs(capsys, monkeypatch):
    import qkv.cli.explain as explain

    before = torch.get_num_threads()
    seen = []
    fmt = explain._fmt
    monkeypatch.setattr(explain, "_fmt", lambda t: seen.append(torch.get_num_threads()) or fmt(t))
    try:
        torch.set_num_threads(2)
        assert main(["--threads", "1", "explain"]) == 0
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2  # 1 inside, the count before put back
        assert main(["--threads", "0", "explain"]) == 2
        assert "--threads must be" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_cli_explain_bad_score(capsys):
    assert main(["explain", "--score", "nope"]) == 2
    assert "unknown score 'nope'" in capsys.readouterr().err
    try:  # an error exit, however the command reports it (exit status 2 or SystemExit with the message)
        status = main(["explain", "--score", "no.such.module:fn"])
    except SystemExit as e:
        status = e.code
    assert status not in (0, None)
    assert "cannot load score function" in capsys.readouterr().err + str(status)
