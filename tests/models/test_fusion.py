"""Language-model fusion in the one decoder: an exhaustive fused beam equals brute force over every output, a zero
weight equals no language model, cached scoring equals the model run on each whole prefix, and tokenisers must
match."""

import itertools

import pytest
import torch
from torch import nn

from qkv.data import train_tokenizer
from qkv.models.decoding import reorder_state, search
from qkv.models.fusion import LMScorer, ScorerSum, token_map
from qkv.models.lm import CausalLM, LMConfig

V, BOS, EOS = 6, 1, 2

pytestmark = pytest.mark.usefixtures("one_thread")


class ToyDecoder(nn.Module):
    """A GRU over the tokens produced so far: its logits depend on the whole prefix."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.cell, self.out = nn.Embedding(V, 8), nn.GRUCell(8, 8), nn.Linear(8, V)

    def step(self, tokens, state):
        h = self.cell(self.emb(tokens), state["h"])
        return self.out(h) * 2.0, None, {"h": h}

    @torch.no_grad()
    def log_probs(self, seq):
        h, total = torch.zeros(1, 8), 0.0
        for y_prev, y in zip([BOS] + seq[:-1], seq, strict=True):
            logits, _, st = self.step(torch.tensor([y_prev]), {"h": h})
            h = st["h"]
            total += float(torch.log_softmax(logits, -1)[0, y])
        return total


@torch.no_grad()
def lm_log_prob(lm, seq, start):
    ids = torch.tensor([[start] + seq])
    logp = torch.log_softmax(lm(ids[:, :-1]).double(), -1)
    return float(logp[0, torch.arange(len(seq)), ids[0, 1:]].sum())


def outputs(max_len):
    """Every output of at most max_len tokens: ends with <eos>, or max_len tokens without one."""
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
                continue
            yield list(seq)


@pytest.mark.parametrize("weight, reward", [(0.7, 0.0), (0.4, 0.6)])
def test_an_exhaustive_fused_beam_is_the_brute_force_best(weight, reward):
    dec = ToyDecoder(0).eval()
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=1, max_len=8, dropout=0.0)).eval()
    max_len = 3
    scorer = LMScorer(lm, weight=weight, reward=reward, eos_id=EOS, start_id=EOS)
    best = search(dec.step, {"h": torch.zeros(1, 8)}, 1, beam=V ** 2, max_len=max_len, length_penalty=0.0,
                  prefix_scorer=scorer, prefix_state=scorer.initial_state())[0]

    def joint(seq):
        words = len(seq) - (seq[-1] == EOS)
        return dec.log_probs(seq) + weight * lm_log_prob(lm, seq, EOS) + reward * words

    with torch.no_grad():
        brute = max(outputs(max_len), key=joint)
    assert best.tokens == [t for t in brute if t != EOS]
    assert best.score == pytest.approx(joint(brute), abs=1e-4)


def test_a_zero_weight_is_decoding_without_the_language_model(gen):
    dec = ToyDecoder(1).eval()
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=1, max_len=16, dropout=0.0)).eval()
    state = {"h": torch.randn(3, 8, generator=gen)}
    plain = search(dec.step, dict(state), 3, beam=4, max_len=8)
    scorer = LMScorer(lm, weight=0.0, eos_id=EOS, start_id=EOS)
    fused = search(dec.step, dict(state), 3, beam=4, max_len=8, prefix_scorer=scorer,
                   prefix_state=scorer.initial_state())
    assert [h.tokens for h in plain] == [h.tokens for h in fused]
    assert [h.score for h in plain] == pytest.approx([h.score for h in fused], abs=1e-5)


def test_cached_scores_equal_the_model_on_each_whole_prefix(gen):
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=2, max_len=16, dropout=0.0)).eval()
    vocab_map = torch.tensor([0, 1, 2, 5, 3, 4])  # the decoder's ids in the language model's order
    scorer = LMScorer(lm, weight=1.0, vocab_map=vocab_map, eos_id=EOS, start_id=EOS)
    state = scorer.initial_state()
    prefixes = torch.empty(2, 0, dtype=torch.long)
    for t in range(5):
        scores, state = scorer(prefixes, state)
        lm_ids = torch.cat([torch.full((2, 1), EOS), vocab_map[prefixes]], dim=1)
        want = torch.log_softmax(lm(lm_ids)[:, -1], -1)[:, vocab_map]
        torch.testing.assert_close(scores, want, atol=1e-5, rtol=1e-5)
        nxt = torch.randint(0, V, (2, 1), generator=gen)
        prefixes = torch.cat([prefixes, nxt], dim=1)
        if t == 2:  # the search keeps the second hypothesis twice
            state = reorder_state(state, torch.tensor([1, 1]))
            prefixes = prefixes[[1, 1]]


def test_scorers_add_and_tokenisers_must_match():
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=1, max_len=16, dropout=0.0)).eval()
    a = LMScorer(lm, weight=0.5, eos_id=EOS, start_id=EOS)
    b = LMScorer(lm, weight=0.25, reward=1.0, eos_id=EOS, start_id=EOS)
    both = ScorerSum([a, b])
    empty = torch.empty(1, 0, dtype=torch.long)
    scores, _ = both(empty, [a.initial_state(), b.initial_state()])
    one, _ = LMScorer(lm, weight=0.75, eos_id=EOS, start_id=EOS)(empty, {"caches": lm.new_caches()})
    bonus = torch.ones(1, V)
    bonus[0, EOS] = 0
    torch.testing.assert_close(scores, one + bonus)
    chars = train_tokenizer("char", ["abc", "abd"])
    other = train_tokenizer("char", ["dcx"])
    mapping, coverage = token_map(chars, other)
    names = chars.tokens_of_ids(range(chars.vocab_size))
    other_names = other.tokens_of_ids(range(other.vocab_size))
    for i, s in enumerate(names[4:], 4):
        assert other_names[int(mapping[i])] == (s if s in other_names else "<unk>")
    assert coverage == pytest.approx(sum(s in other_names for s in names[4:]) / len(names[4:]))
    with pytest.raises(ValueError, match=r"language model's tokens \(word\) are not the decoder's \(char\)"):
        token_map(chars, train_tokenizer("word", ["a b c"]))
    with pytest.raises(ValueError, match="weight"):
        LMScorer(lm, weight=-1, eos_id=EOS, start_id=EOS)


class ExtendedDecoder(ToyDecoder):
    """ToyDecoder over an extended vocabulary: ``X`` more tokens (copied words) past the base ``V``."""

    X = 2

    def __init__(self, seed):
        super().__init__(seed)
        torch.manual_seed(seed + 10)
        self.extra = nn.Linear(8, self.X)
        with torch.no_grad():
            self.extra.bias.add_(1.5)  # copies are likely, so that the best output holds one

    def step(self, tokens, state):
        h = self.cell(self.emb(tokens.clamp(max=V - 1)), state["h"])
        return torch.cat([self.out(h), self.extra(h)], -1) * 2.0, None, {"h": h}


def test_a_base_vocabulary_language_model_scores_extended_tokens_as_its_unknown():
    from qkv.data import UNK_ID

    dec = ExtendedDecoder(2).eval()
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=1, max_len=8, dropout=0.0)).eval()
    weight, max_len, total = 0.8, 3, V + ExtendedDecoder.X
    scorer = LMScorer(lm, weight=weight, eos_id=EOS, start_id=EOS)
    best = search(dec.step, {"h": torch.zeros(1, 8)}, 1, beam=total ** 2, max_len=max_len, length_penalty=0.0,
                  prefix_scorer=scorer, prefix_state=scorer.initial_state())[0]

    @torch.no_grad()
    def joint(seq):
        h, score = torch.zeros(1, 8), 0.0
        for y_prev, y in zip([BOS] + seq[:-1], seq, strict=True):
            logits, _, st = dec.step(torch.tensor([y_prev]), {"h": h})
            h = st["h"]
            score += float(torch.log_softmax(logits, -1)[0, y])
        as_lm = [t if t < V else UNK_ID for t in seq]  # read and scored as <unk>
        return score + weight * lm_log_prob(lm, as_lm, EOS)

    candidates = [list(s) for n in range(1, max_len + 1) for s in itertools.product(range(total), repeat=n)
                  if EOS not in s[:-1] and (n == max_len or s[-1] == EOS)]
    brute = max(candidates, key=joint)
    assert any(t >= V for t in brute)
    assert best.tokens == [t for t in brute if t != EOS]
    assert best.score == pytest.approx(joint(brute), abs=1e-4)


def test_past_its_context_the_language_model_reads_the_last_half_context_afresh():
    context, weight = 6, 0.9
    lm = CausalLM(LMConfig(vocab_size=V, dim=16, num_heads=2, num_layers=1, max_len=context, dropout=0.0)).eval()
    scorer = LMScorer(lm, weight=weight, eos_id=EOS, start_id=EOS)
    torch.manual_seed(5)
    prefixes = torch.randint(3, V, (3, 14))
    state, held, restarts = scorer.initial_state(), 0, 0  # held: how many positions the model reads, by hand
    for t in range(prefixes.shape[1] + 1):
        scores, state = scorer(prefixes[:, :t], state)
        if held + 1 > context:
            held, restarts = context // 2, restarts + 1
        else:
            held += 1
        read = torch.cat([torch.full((3, 1), EOS), prefixes[:, :t]], 1)[:, -held:]  # the start token, then the prefix
        with torch.no_grad():
            expected = weight * torch.log_softmax(lm(read)[:, -1].float(), -1)
        assert len(state["caches"][0]) == held <= context
        assert torch.allclose(scores, expected, atol=1e-5), t
    assert restarts >= 2
