"""CTC prefix scores against brute force over every alignment, greedy CTC decoding, and joint CTC/attention beam
search (with the attention's weight at 0 it finds the labelling CTC makes most likely, as brute force does), and
CTC prefix beam search alone (a beam wide enough to keep every prefix finds brute force's argmax and its
probability)."""

import itertools
import math

import pytest
import torch

from qkv.models.ctc import CTCPrefixScorer, ctc_beam_search, ctc_greedy, joint_step
from qkv.models.decoding import search

BLANK, BOS, EOS = 0, 1, 2


def collapse(path):
    out, last = [], None
    for c in path:
        if c != last and c != BLANK:
            out.append(c)
        last = c
    return tuple(out)


def labelling_probs(x):
    """{labelling: p} of ``x (S, V)`` log-probabilities, by enumerating all V^S alignments (float64)."""
    probs: dict[tuple, float] = {}
    s, v = x.shape
    for path in itertools.product(range(v), repeat=s):
        p = math.exp(sum(float(x[t, c]) for t, c in enumerate(path)))
        key = collapse(path)
        probs[key] = probs.get(key, 0.0) + p
    return probs


def prefix_prob(probs, h):
    return sum(p for k, p in probs.items() if k[: len(h)] == tuple(h))


def walk(scorer, x, lengths, prefix):
    """Feed ``prefix`` token by token; the accumulated score of each next token after it: (V,) float64."""
    state = scorer.initial_state(x, lengths)
    total = torch.zeros(x.shape[0], dtype=torch.float64)
    for t in range(len(prefix) + 1):
        toks = torch.tensor([prefix[:t]] * x.shape[0], dtype=torch.long).view(x.shape[0], t)
        scores, cand = scorer(toks, state)
        if t == len(prefix):
            return total[:, None] + scores.double()
        c = prefix[t]
        total = total + scores[:, c].double()
        state = scorer.select(cand, torch.arange(x.shape[0]), torch.full((x.shape[0],), c))


@pytest.mark.parametrize("seed", range(3))
def test_prefix_scores_match_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    s, v = 5, 5  # tokens: blank, <bos>, <eos>, a=3, b=4
    x = torch.log_softmax(torch.randn(2, s, v, generator=g, dtype=torch.float64) * 2, -1).float()
    lengths = torch.tensor([s, s - 1])  # the second input is one frame shorter
    scorer = CTCPrefixScorer(blank=BLANK, eos_id=EOS, banned=(BOS,))
    for prefix in [(), (3,), (4, 3), (3, 3), (4, 4, 3)]:
        got = walk(scorer, x, lengths, list(prefix))
        for row in range(2):
            probs = labelling_probs(x[row, : int(lengths[row])].double())
            for c in (3, 4):
                want = prefix_prob(probs, (*prefix, c))
                assert math.exp(float(got[row, c])) == pytest.approx(want, rel=1e-4, abs=1e-9), (prefix, c, row)
            exact = probs.get(tuple(prefix), 0.0)  # <eos>: the output is exactly the prefix
            assert math.exp(float(got[row, EOS])) == pytest.approx(exact, rel=1e-4, abs=1e-9)
            assert got[row, BLANK] == -math.inf and got[row, BOS] == -math.inf


def test_weight_scales_the_scores(gen):
    x = torch.log_softmax(torch.randn(1, 6, 5, generator=gen), -1)
    plain = CTCPrefixScorer(eos_id=EOS)(torch.zeros(1, 0, dtype=torch.long),
                                        CTCPrefixScorer(eos_id=EOS).initial_state(x, torch.tensor([6])))[0]
    half = CTCPrefixScorer(eos_id=EOS, weight=0.5)
    scaled = half(torch.zeros(1, 0, dtype=torch.long), half.initial_state(x, torch.tensor([6])))[0]
    finite = torch.isfinite(plain)
    torch.testing.assert_close(scaled[finite], 0.5 * plain[finite])


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    best = torch.tensor([[3, 3, 0, 3, 4, 4, 0, 0], [0, 4, 0, 4, 3, 3, 3, 3]])
    x = torch.nn.functional.one_hot(best, 5).float().log()
    assert ctc_greedy(x, torch.tensor([8, 5]), blank=0) == [[3, 3, 4], [4, 4, 3]]


@pytest.mark.parametrize("seed", range(3))
def test_joint_search_with_ctc_alone_finds_the_most_likely_labelling(seed):
    """A decoder that knows nothing (uniform scores, weighted by 0.01): the beam ranks by CTC's own probability of
    each full labelling, and a wide beam finds brute force's argmax (hypotheses CTC cannot give never win)."""
    g = torch.Generator().manual_seed(100 + seed)
    s, v = 5, 5
    x = torch.log_softmax(torch.randn(1, s, v, generator=g) * 3, -1)
    x[..., BOS] = -1e4  # CTC never outputs <bos> or <eos> as a frame label
    x[..., EOS] = -1e4
    x = torch.log_softmax(x, -1)
    probs = labelling_probs(x[0].double())
    best = max(probs, key=probs.get)
    weight = 0.99
    scorer = CTCPrefixScorer(blank=BLANK, eos_id=EOS, weight=weight, banned=(BOS,))

    def step(tokens, state):  # an attention decoder that knows nothing: uniform over the vocabulary
        return torch.zeros(tokens.shape[0], v), None, state

    found = search(joint_step(step, weight), {"dummy": torch.zeros(1, 1)}, 1, beam=8, max_len=s + 1,
                   length_penalty=0.0, prefix_scorer=scorer, prefix_state=scorer.initial_state(x, torch.tensor([s])),
                   normalize=False)
    assert tuple(found[0].tokens) == best
    expected = weight * math.log(probs[best]) + (1 - weight) * (len(best) + 1) * -math.log(v)
    assert found[0].score == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("seed", range(3))
def test_ctc_beam_search_finds_the_most_likely_labelling(seed):
    g = torch.Generator().manual_seed(200 + seed)
    s, v = 5, 5  # labels a=3, b=4: at most 2 + 4 + ... + 32 = 62 prefixes, all kept by a beam of 64
    x = torch.log_softmax(torch.randn(2, s, v, generator=g) * 2, -1)
    lengths = torch.tensor([s, s - 2])
    found = ctc_beam_search(x, lengths, beam=64, blank=BLANK, eos_id=EOS, banned=(BOS,))
    for row in range(2):
        # brute force over the alignments of blank, a and b only: <bos> and <eos> are never outputs
        y = x[row, : int(lengths[row])].double().clone()
        y[:, [BOS, EOS]] = -math.inf
        probs = labelling_probs(y)
        best = max(probs, key=probs.get)
        assert tuple(found[row].tokens) == best
        assert found[row].score == pytest.approx(math.log(probs[best]), rel=1e-4)
    # a narrow beam gives a labelling of no higher probability, and the greedy path's is never better than the best
    narrow = ctc_beam_search(x, lengths, beam=2, blank=BLANK, eos_id=EOS, banned=(BOS,))
    assert all(n.score <= f.score + 1e-5 for n, f in zip(narrow, found, strict=True))
    with pytest.raises(ValueError, match="two different ids"):
        ctc_beam_search(x, lengths, blank=0, eos_id=0)
    with pytest.raises(ValueError, match="lengths must be"):
        ctc_beam_search(x, lengths[:1], eos_id=EOS)
