"""Induction-head scores on repeated random tokens: hand-built attention patterns give the documented values (an
induction pattern 1, a previous-token pattern 1 on its own score, a uniform causal head 1 / (keys seen)), a model
whose queries and keys are zero is that uniform head, and an OV circuit set to copy scores 1 against 0."""

import pytest
import torch

from qkv.models.induction import attention_scores, copying_scores, induction_table, repeated_tokens
from qkv.models.lm import CausalLM, LMConfig


def uniform_causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]


@pytest.mark.parametrize("length", [3, 7, 20])
def test_hand_built_patterns(length):
    n = 1 + 2 * length
    induction = uniform_causal(n).clone()
    previous = uniform_causal(n).clone()
    for i in range(1 + length, n):  # the rows of the second copy
        induction[i] = 0
        induction[i, i - length + 1] = 1.0
        previous[i] = 0
        previous[i, i - 1] = 1.0
    weights = torch.stack([induction, previous, uniform_causal(n)])[None]  # (1 layer, 3 heads, n, n)
    ind, prev = attention_scores(weights, length)
    assert ind.shape == (1, 3)
    expected_uniform = sum(1 / (i + 1) for i in range(1 + length, n)) / length
    torch.testing.assert_close(ind[0], torch.tensor([1.0, 0.0, expected_uniform]))
    torch.testing.assert_close(prev[0], torch.tensor([0.0, 1.0, expected_uniform]))
    with pytest.raises(ValueError, match="length"):
        attention_scores(weights, length + 1)


def test_the_token_after_the_earlier_occurrence_is_the_next_one():
    tokens = repeated_tokens(50, 6, start_id=2, seed=3)[0]
    assert tokens[0] == 2 and torch.equal(tokens[1:7], tokens[7:]) and len(set(tokens[1:7].tolist())) == 6
    assert tokens[1:].min() >= 4
    for i in range(7, 12):  # the earlier occurrence of tokens[i] is i - 6; the key scored, after it, is the next token
        assert tokens[i - 6] == tokens[i] and tokens[i - 6 + 1] == tokens[i + 1]
    with pytest.raises(ValueError, match="distinct"):
        repeated_tokens(10, 7, start_id=2)


def test_a_model_that_attends_uniformly_scores_as_the_uniform_head():
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=60, dim=16, num_heads=2, num_layers=2, max_len=32, dropout=0.0))
    with torch.no_grad():
        for layer in model.layers:  # zero scores: every head uniform over the keys it may see
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.q_proj.bias.zero_()
    table = induction_table(model, start_id=2, length=40)
    assert table.length == 15  # cut to the context: 1 + 2 * 15 <= 32
    expected = sum(1 / (i + 1) for i in range(16, 31)) / 15
    torch.testing.assert_close(table.induction, torch.full((2, 2), expected))
    torch.testing.assert_close(table.previous, torch.full((2, 2), expected))
    assert len(table.rows()) == 4 and table.tokens.shape == (1, 31)


def test_copying_scores_an_identity_ov_circuit_one_and_its_negative_zero():
    torch.manual_seed(0)
    dim, heads = 64, 2
    model = CausalLM(LMConfig(vocab_size=40, dim=dim, num_heads=heads, num_layers=1, max_len=32, dropout=0.0))
    attn = model.layers[0].self_attn
    with torch.no_grad():
        model.embed.weight.normal_()
        attn.v_proj.weight.copy_(torch.eye(dim))
        attn.v_proj.bias.zero_()
        attn.out_proj.weight.copy_(torch.eye(dim))
        attn.out_proj.weight[:, dim // heads:] *= -1  # head 1 writes the opposite of what it reads
    tokens = torch.arange(4, 24)
    scores = copying_scores(model, tokens)
    assert scores.shape == (1, 2)
    assert scores[0, 0] == 1.0  # reading token t raises t above the other 19
    assert scores[0, 1] == 0.0
