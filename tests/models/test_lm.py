"""The causal language model: cached decoding equals full recomputation, sampling draws from the distribution it
names, generation is reproducible with a seed, and a tiny model learns a repeated pattern."""

import math

import pytest
import torch

from qkv.models import create
from qkv.models.lm import CausalLM, LMConfig, generate, sample_next

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(positions="learned", **kw):
    cfg = dict(vocab_size=23, dim=32, num_heads=4, num_layers=2, max_len=40, positions=positions, dropout=0.0)
    return CausalLM(LMConfig(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "alibi"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_cached_steps_equal_the_whole_sequence(positions, kv_heads, gen):
    model = tiny(positions, kv_heads=kv_heads)
    tokens = torch.randint(1, 23, (3, 17), generator=gen)
    full = model(tokens)
    caches = model.new_caches()
    parts = [model.step(tokens[:, :6], caches)] + [model.step(tokens[:, t:t + 1], caches) for t in range(6, 17)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_causal_a_later_token_never_changes_an_earlier_prediction(gen):
    model = tiny()
    a = torch.randint(1, 23, (2, 12), generator=gen)
    b = a.clone()
    b[:, 7:] = torch.randint(1, 23, (2, 5), generator=gen)
    torch.testing.assert_close(model(a)[:, :7], model(b)[:, :7])


def test_tied_output_and_registry():
    model = create("lm", vocab_size=11, dim=16, num_heads=2, num_layers=1)
    assert model.out.weight is model.embed.weight
    untied = tiny(tie_weights=False)
    assert untied.out.weight is not untied.embed.weight


def test_bad_inputs_are_errors_that_name_them():
    model = tiny()
    with pytest.raises(ValueError, match="context"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.ones(1, 4))
    with pytest.raises(ValueError, match="positions"):
        LMConfig(vocab_size=10, positions="rotary")
    with pytest.raises(ValueError, match="context"):
        generate(model, torch.ones(1, 30, dtype=torch.long), 11)
    with pytest.raises(ValueError, match="P >= 1"):
        generate(model, torch.ones(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 5), temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        sample_next(torch.zeros(1, 5), top_p=0)
    # ALiBi reads past max_len (it has no position table)
    assert tiny("alibi")(torch.ones(1, 60, dtype=torch.long)).shape == (1, 60, 23)


def test_greedy_generation_equals_argmax_by_full_recomputation(gen):
    model = tiny()
    prompt = torch.randint(1, 23, (2, 5), generator=gen)
    out = generate(model, prompt, 8, greedy=True)
    seq = prompt
    for _ in range(8):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_sampling_with_a_seed_is_reproducible_and_eos_stops_a_row(gen):
    model = tiny()
    prompt = torch.randint(1, 23, (4, 3), generator=gen)
    a = generate(model, prompt, 12, top_k=10, top_p=0.9, seed=7)
    assert torch.equal(a, generate(model, prompt, 12, top_k=10, top_p=0.9, seed=7))
    assert not torch.equal(a, generate(model, prompt, 12, top_k=10, top_p=0.9, seed=8))
    eos = int(a[0, 5])
    b = generate(model, prompt, 12, top_k=10, top_p=0.9, seed=7, eos_id=eos)
    row = b[0, 3:].tolist()
    assert all(t == eos for t in row[row.index(eos):])


def test_sampling_frequencies_follow_the_truncated_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    draws = sample_next(logits.expand(n, -1), temperature=0.7, top_k=3, generator=g)
    probs = (logits[0, :3] / 0.7).softmax(-1)
    counts = torch.bincount(draws, minlength=5).double() / n
    assert counts[3:].sum() == 0
    torch.testing.assert_close(counts[:3], probs.double(), atol=4 * math.sqrt(0.25 / n), rtol=0)
    # nucleus: the smallest set of tokens reaching top_p (here the first two: 0.63 + 0.23 >= 0.8)
    p = logits[0].softmax(-1)
    assert p[0] < 0.8 <= p[0] + p[1]
    draws = sample_next(logits.expand(n, -1), top_p=0.8, generator=g)
    assert set(draws.tolist()) == {0, 1}
    assert torch.equal(sample_next(logits, top_k=1, generator=g), torch.tensor([0]))


def test_a_tiny_model_learns_a_repeated_pattern(one_thread):
    torch.manual_seed(0)
    pattern = [3, 7, 5, 9, 4]
    model = tiny(dropout=0.0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    starts = torch.randint(0, 5, (16,))
    data = torch.tensor([[pattern[(s + i) % 5] for i in range(24)] for s in starts.tolist()])
    for _ in range(150):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 23), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = generate(model, torch.tensor([[5, 9]]), 10, greedy=True)
    assert out[0].tolist() == [5, 9, 4, 3, 7, 5, 9, 4, 3, 7, 5, 9]
