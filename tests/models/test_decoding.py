"""The one decoder (qkv.models.decoding): beam search against brute-force enumeration of every sequence on tiny
vocabularies (plain, length and coverage penalties, n-gram blocking, a prefix scorer with its own state, an extended
vocabulary fed back as <unk> or through the model, min_len, one <eos> per input), beam 1 against a greedy loop,
a batch against its inputs one by one, and every translation model and captioner through the same protocol."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from qkv.models import create
from qkv.models.decoding import (
    Decodable,
    PrefixScorer,
    beam_search,
    coverage_penalty_wu,
    greedy_decode,
    length_penalty_wu,
    repeated_ngram_ban,
    search,
)

pytestmark = pytest.mark.usefixtures("one_thread")

BOS, EOS, UNK = 1, 2, 3


class RandomStep:
    """A deterministic random "model": the next-token logits ``(V',)`` and the attention ``(S,)`` are a fixed
    random function of the input and of every token fed so far (``<bos>`` included). State: ``{"example": (N,),
    "fed": (N, t)}``, reordered by the search's default."""

    def __init__(self, vocab: int, positions: int = 4, seed: int = 0):
        self.vocab, self.positions, self.seed = vocab, positions, seed
        self.seen: list[torch.Tensor] = []  # every token fed, for the tests that look

    def table(self, example: int, fed: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(hash((self.seed, example, fed)) % 2 ** 31)
        logits = 2.0 * torch.randn(self.vocab, generator=g)
        attention = (1.5 * torch.randn(self.positions, generator=g)).softmax(-1)
        return logits, attention

    def start(self, batch: int) -> dict:
        return {"example": torch.arange(batch), "fed": torch.empty(batch, 0, dtype=torch.long)}

    def __call__(self, tokens: torch.Tensor, state: dict):
        self.seen.append(tokens.clone())
        fed = torch.cat([state["fed"], tokens[:, None]], 1)
        rows = [self.table(int(e), tuple(f.tolist())) for e, f in zip(state["example"], fed, strict=True)]
        return (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]),
                {"example": state["example"], "fed": fed})


class WalkScorer(PrefixScorer):
    """A prefix score that depends on the path: ``acc' = acc / 2 + w[token]``, score ``sin(3 acc') / 3`` plus a
    term of the prefix's length and token sum; its state is selected by hypothesis *and* token."""

    def __init__(self, vocab: int):
        self.w = torch.randn(vocab, generator=torch.Generator().manual_seed(7))

    def __call__(self, prefixes, acc):
        cand = acc[:, None] / 2 + self.w[None, :]  # (N, V')
        extra = torch.sin(3 * cand) / 3 + 0.05 * prefixes.shape[1] - 0.02 * (prefixes.sum(1) % 3)[:, None]
        return extra, cand

    def select(self, cand, rows, tokens):
        return cand[rows, tokens]


def brute_force(walk, vocab: int, max_len: int, *, eos: int = EOS, min_len: int = 0, ngram: int = 0,
                alpha: float = 0.0, beta: float = 0.0, mask=None):
    """Every sequence (ended by ``eos``, or ``max_len`` tokens without it) with its objective
    ``score / lp + cp``; ``walk(seq) -> (score, attention rows (n, S))``."""
    out = {}
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if eos in seq[:-1] or (seq[-1] != eos and n < max_len) or (eos in seq and seq.index(eos) < min_len):
                continue
            if ngram and len({seq[i:i + ngram] for i in range(n - ngram + 1)}) < n - ngram + 1:
                continue
            score, attn = walk(seq)
            objective = score / (((5 + n) / 6) ** alpha)
            if beta:
                cov = attn.sum(0).clamp(max=1.0).clamp(min=1e-10).log()
                objective += beta * float(cov[mask].sum() if mask is not None else cov.sum())
            out[seq] = (objective, score)
    return out


def random_walk(step: RandomStep, example: int, *, feed=lambda t: t, scorer=None, acc0=0.0):
    def walk(seq):
        fed, score, rows, acc = (BOS,), 0.0, [], torch.tensor([acc0])
        for i, tok in enumerate(seq):
            logits, attn = step.table(example, fed)
            score += float(torch.log_softmax(logits, -1)[tok])
            if scorer is not None:
                extra, cand = scorer(torch.tensor([seq[:i]], dtype=torch.long).view(1, i), acc)
                score += float(extra[0, tok])
                acc = cand[:, tok]
            rows.append(attn)
            fed = fed + (feed(tok),)
        return score, torch.stack(rows)
    return walk


def check_best(hyp, table, eos=EOS, tol=1e-4):
    """The beam's winner has the best objective of all; it is that very sequence unless another is within tol."""
    best = max(table, key=lambda s: table[s][0])
    finished = hyp.attention.shape[0] == len(hyp.tokens) + 1
    mine = tuple(hyp.tokens) + ((eos,) if finished else ())
    assert mine in table, mine
    assert table[mine][0] == pytest.approx(table[best][0], abs=tol)
    assert hyp.score == pytest.approx(table[mine][1], abs=tol)
    runner_up = max((v[0] for s, v in table.items() if s != best), default=-math.inf)
    if table[best][0] - runner_up > tol:
        assert mine == best


CASES = {
    "plain": {},
    "length_penalty": {"length_penalty": 0.6},
    "long_favoured": {"length_penalty": 2.0},
    "coverage": {"length_penalty": 0.6, "coverage_penalty": 0.4},
    "ngram1": {"no_repeat_ngram_size": 1},
    "ngram2": {"no_repeat_ngram_size": 2, "length_penalty": 1.0},
    "ngram3": {"no_repeat_ngram_size": 3, "vocab": 3, "max_len": 5},
    "min_len": {"min_len": 2},
    "per_input_eos": {"eos_id": [EOS, 0]},
    "prefix_scorer": {"prefix": True},
    "extended_vocab": {"vocab_size": 4},
    "everything": {"vocab_size": 4, "prefix": True, "no_repeat_ngram_size": 2, "length_penalty": 0.6,
                   "coverage_penalty": 0.3, "min_len": 1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_wide_beam_equals_brute_force(case):
    opts = dict(CASES[case])
    vocab = opts.pop("vocab", 6 if "vocab_size" in opts else 4)  # V' = 6 with vocab_size 4: ids 4, 5 copy
    max_len, b = opts.pop("max_len", 3), 2
    step = RandomStep(vocab, seed=len(case))
    prefix = opts.pop("prefix", False)
    scorer, acc0 = (WalkScorer(vocab), torch.tensor([0.3, -0.4])) if prefix else (None, None)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    eos = opts.get("eos_id", EOS)
    hyps = search(step, step.start(b), b, beam=vocab ** max_len, max_len=max_len, prefix_scorer=scorer,
                  prefix_state=acc0, source_mask=mask, **{"length_penalty": 0.0, **opts})
    for i, hyp in enumerate(hyps):
        v = opts.get("vocab_size") or vocab
        walk = random_walk(step, i, feed=lambda t, v=v: UNK if t >= v else t, scorer=scorer,
                           acc0=float(acc0[i]) if prefix else 0.0)
        eos_i = eos[i] if isinstance(eos, list) else eos
        table = brute_force(walk, vocab, max_len, eos=eos_i, min_len=opts.get("min_len", 0),
                            ngram=opts.get("no_repeat_ngram_size", 0), alpha=opts.get("length_penalty", 0.0),
                            beta=opts.get("coverage_penalty", 0.0), mask=mask[i])
        check_best(hyp, table, eos_i)
        assert hyp.attention.shape[1] == 4
    if "vocab_size" in opts:  # ids of the extended vocabulary were produced, and fed back as <unk>
        fed = torch.cat(step.seen)
        assert int(fed.max()) < 4 and bool((fed == UNK).any())


def test_a_model_maps_its_extended_tokens_itself():
    """A model's feed_tokens (e.g. a copied source word fed back as its own embedding's id) and reorder_state are
    used by beam_search; the search itself assumes no vocabulary size."""
    step = RandomStep(6, seed=3)

    class Copier:
        reordered = 0

        def encode(self, n):
            return step.start(int(n.shape[0]))

        def decode_step(self, tokens, state):
            assert int(tokens.max()) < 4
            return step(tokens, state)

        def feed_tokens(self, tokens, state):
            return torch.where(tokens >= 4, tokens - 4 + 2, tokens)  # copies 4, 5 -> 2, 3

        def reorder_state(self, state, index):
            Copier.reordered += 1
            return {k: v.index_select(0, index) for k, v in state.items()}

    model = Copier()
    assert isinstance(model, Decodable)
    hyps = beam_search(model, torch.zeros(2, 1), beam=6 ** 3, max_len=3, length_penalty=0.0)
    assert Copier.reordered >= 2
    for i, hyp in enumerate(hyps):
        table = brute_force(random_walk(step, i, feed=lambda t: t - 2 if t >= 4 else t), 6, 3)
        check_best(hyp, table)


@pytest.mark.parametrize("opts", [{}, {"vocab_size": 5}, {"no_repeat_ngram_size": 2}, {"min_len": 3}])
def test_beam_one_is_a_greedy_loop(opts):
    vocab, max_len, b = 7, 6, 3
    step = RandomStep(vocab, seed=11)
    hyps = search(step, step.start(b), b, beam=1, max_len=max_len, length_penalty=0.6, **opts)
    for i, hyp in enumerate(hyps):
        fed, toks, score = (BOS,), [], 0.0
        for t in range(max_len):
            logp = torch.log_softmax(step.table(i, fed)[0], -1)
            if opts.get("no_repeat_ngram_size") and t >= 2:
                banned = {toks[j + 1] for j in range(t - 1) if toks[j] == toks[-1]}
                logp[list(banned)] = -math.inf
            if t < opts.get("min_len", 0):
                logp[EOS] = -math.inf
            tok = int(logp.argmax())
            score += float(logp[tok])
            if tok == EOS:
                break
            toks.append(tok)
            fed += (UNK if tok >= opts.get("vocab_size", vocab) else tok,)
        assert hyp.tokens == toks and hyp.score == pytest.approx(score, abs=1e-5)


def test_a_batch_equals_its_inputs_one_by_one():
    step = RandomStep(9, seed=5)
    together = search(step, step.start(4), 4, beam=3, max_len=7, no_repeat_ngram_size=2)
    for i, hyp in enumerate(together):
        state = {"example": torch.tensor([i]), "fed": torch.empty(1, 0, dtype=torch.long)}
        alone = search(step, state, 1, beam=3, max_len=7, no_repeat_ngram_size=2)[0]
        assert hyp.tokens == alone.tokens and hyp.score == pytest.approx(alone.score, abs=1e-6)
        torch.testing.assert_close(hyp.attention, alone.attention)


def _translator(kind: str):
    torch.manual_seed(4)
    if kind == "transformer":
        model = create(kind, src_vocab=13, tgt_vocab=9, dim=16, num_heads=2, ffn_dim=32, num_layers=2, dropout=0.0,
                       tie_output=False)
    else:
        model = create(kind, src_vocab=13, tgt_vocab=9, embed_dim=8, hidden_dim=12, attn_dim=8, dropout=0.0)
    with torch.no_grad():
        model.out.weight.mul_(4)  # sharper outputs: no near-ties between hypotheses
    return model.eval()


@pytest.mark.parametrize("kind", ["fixed", "bahdanau", "luong", "transformer"])
def test_translation_batch_of_different_lengths_equals_one_by_one(kind, gen):
    model = _translator(kind)
    assert isinstance(model, Decodable)
    lengths = [6, 2, 4, 5]
    src = torch.zeros(4, 6, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, 13, (n,), generator=gen)
    mask = src != 0
    opts = dict(beam=3, max_len=8, length_penalty=0.6, coverage_penalty=0.2, no_repeat_ngram_size=3)
    together = beam_search(model, src, mask, source_mask=mask, **opts)
    for i, n in enumerate(lengths):
        alone = beam_search(model, src[i:i + 1, :n], mask[i:i + 1, :n], **opts)[0]
        assert together[i].tokens == alone.tokens
        assert together[i].score == pytest.approx(alone.score, abs=1e-4)
        torch.testing.assert_close(together[i].attention[:, :n], alone.attention, atol=1e-5, rtol=1e-4)
        assert float(together[i].attention[:, n:].abs().sum()) == 0.0  # padding is never attended


@torch.no_grad()
def test_translation_wide_beam_equals_brute_force_with_the_models_own_forward(gen):
    """Scores of every target by teacher forcing (forward), ranked with both penalties, against the beam."""
    model = _translator("bahdanau")
    src = torch.randint(4, 13, (1, 4), generator=gen)
    mask = torch.ones_like(src, dtype=torch.bool)
    vocab, max_len = 9, 3
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=max_len - 1)))
    tgt_in = torch.cat([torch.full((len(seqs), 1), BOS), seqs], 1)
    logits, attn = model(src.expand(len(seqs), -1), mask.expand(len(seqs), -1), tgt_in, return_attention=True)
    logp = torch.log_softmax(logits, -1)
    index = {tuple(s.tolist()): i for i, s in enumerate(seqs)}

    def walk(seq):
        row = index[tuple(seq[:max_len - 1]) + (0,) * (max_len - 1 - min(len(seq), max_len - 1))]
        return sum(float(logp[row, t, tok]) for t, tok in enumerate(seq)), attn[row, :len(seq)]

    hyp = beam_search(model, src, mask, beam=vocab ** max_len, max_len=max_len, length_penalty=0.6,
                      coverage_penalty=0.5)[0]
    check_best(hyp, brute_force(walk, vocab, max_len, alpha=0.6, beta=0.5))


CAPTIONERS = {"caption-soft": {"embed_dim": 6, "hidden_dim": 10, "attn_dim": 7},
              "caption-hard": {"embed_dim": 6, "hidden_dim": 10, "attn_dim": 7, "test_attention": "argmax"},
              "caption-fixed": {"embed_dim": 6, "hidden_dim": 10},
              "caption-transformer": {"dim": 8, "num_heads": 2, "num_layers": 2, "max_len": 12, "grid": 4}}


def _captioner(name):
    torch.manual_seed(6)
    model = create(name, vocab_size=6, widths=[4, 4, 6, 8], dropout=0.0, **CAPTIONERS[name])
    with torch.no_grad():
        model.out.weight.mul_(3)
    return model.eval()


@pytest.mark.parametrize("name", list(CAPTIONERS))
@torch.no_grad()
def test_captioners_decode_with_the_one_decoder_as_brute_force(name, gen):
    """The images are the encoder input (no adapter); the wide beam finds the best caption of all, scored by the
    model's teacher-forced forward; the attention rows are the maps over the L grid cells."""
    model = _captioner(name)
    assert isinstance(model, Decodable)
    images = torch.rand(2, 1, 16, 16, generator=gen)
    vocab, max_len = 6, 3
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=max_len - 1)))
    hyps = beam_search(model, images, beam=vocab ** max_len, max_len=max_len, length_penalty=0.6)
    for i, hyp in enumerate(hyps):
        tgt_in = torch.cat([torch.full((len(seqs), 1), BOS), seqs], 1)
        out = model(images[i:i + 1], tgt_in, torch.zeros(len(seqs), dtype=torch.long))
        logp = torch.log_softmax(out.logits, -1)
        index = {tuple(s.tolist()): j for j, s in enumerate(seqs)}

        def walk(seq, logp=logp, out=out, index=index):
            row = index[tuple(seq[:max_len - 1]) + (0,) * (max_len - 1 - min(len(seq), max_len - 1))]
            return sum(float(logp[row, t, tok]) for t, tok in enumerate(seq)), out.attention[row, :len(seq)]

        check_best(hyp, brute_force(walk, vocab, max_len, alpha=0.6))
        assert hyp.attention.shape[1] == 4  # a 2x2 grid


@pytest.mark.parametrize("name", list(CAPTIONERS))
def test_captioning_a_batch_equals_one_by_one(name, gen):
    model = _captioner(name)
    images = torch.rand(3, 1, 16, 16, generator=gen)
    together = beam_search(model, images, beam=3, max_len=6, no_repeat_ngram_size=2)
    for i in range(3):
        alone = beam_search(model, images[i:i + 1], beam=3, max_len=6, no_repeat_ngram_size=2)[0]
        assert together[i].tokens == alone.tokens and together[i].score == pytest.approx(alone.score, abs=1e-4)
        torch.testing.assert_close(together[i].attention, alone.attention, atol=1e-5, rtol=1e-4)


def test_greedy_decode_takes_the_encoder_inputs(gen):
    model = _translator("luong")
    src = torch.randint(4, 13, (2, 5), generator=gen)
    mask = torch.ones_like(src, dtype=torch.bool)
    assert [h.tokens for h in greedy_decode(model, src, mask, max_len=6)] == \
        [h.tokens for h in beam_search(model, src, mask, beam=1, max_len=6)]


def test_penalties_and_ngram_ban_hand_computed():
    assert length_penalty_wu(torch.tensor([1, 7]), 0.6).tolist() == pytest.approx([1.0, 2.0 ** 0.6])
    assert length_penalty_wu(torch.tensor([3]), 0.0).tolist() == [1.0]
    cov = torch.tensor([[0.5, 1.7, 0.0, 0.25]])
    mask = torch.tensor([[True, True, False, True]])
    assert float(coverage_penalty_wu(cov, 0.2, mask)) == pytest.approx(0.2 * (math.log(0.5) + 0 + math.log(0.25)))
    assert float(coverage_penalty_wu(cov, 1.0)) == pytest.approx(math.log(0.5) + math.log(1e-10) + math.log(0.25),
                                                                 rel=1e-5)
    tokens = torch.tensor([[4, 5, 4, 6, 4], [1, 2, 3, 1, 2], [7, 7, 7, 7, 7]])
    ban = repeated_ngram_ban(tokens, 2, 9)
    assert ban[0].nonzero().flatten().tolist() == [5, 6]  # 4 5 and 4 6 seen: after a 4, neither 5 nor 6
    assert ban[1].nonzero().flatten().tolist() == [3]  # 1 2 3 seen
    assert ban[2].nonzero().flatten().tolist() == [7]
    assert repeated_ngram_ban(tokens, 1, 9)[1].nonzero().flatten().tolist() == [1, 2, 3]
    assert not repeated_ngram_ban(tokens[:, :2], 3, 9).any()
    three = repeated_ngram_ban(torch.tensor([[1, 2, 3, 1, 2], [2, 1, 3, 1, 2]]), 3, 9)
    assert three[0].nonzero().flatten().tolist() == [3] and not three[1].any()  # (1, 2) then 3 seen; not (2, 1)


def test_bad_arguments():
    step = RandomStep(4)
    with pytest.raises(ValueError, match="beam must be"):
        search(step, step.start(1), 1, beam=0)
    with pytest.raises(ValueError, match="max_len must be"):
        search(step, step.start(1), 1, max_len=0)
    with pytest.raises(ValueError, match="min_len in"):
        search(step, step.start(1), 1, max_len=3, min_len=4)
    with pytest.raises(ValueError, match="eos_id must be one id or one per input"):
        search(step, step.start(2), 2, eos_id=[2, 2, 2])
    with pytest.raises(ValueError, match="coverage_penalty needs"):
        search(lambda y, s: (torch.zeros(len(y), 4), None, s), {}, 1, coverage_penalty=0.2, max_len=2)
    with pytest.raises(ValueError, match="encoder inputs"):
        beam_search(_translator("bahdanau"))
    hyp = search(lambda y, s: (torch.zeros(len(y), 4), None, s), {}, 1, max_len=2)[0]  # a step without attention
    assert hyp.attention.shape[1] == 0 and hyp.attention.shape[0] - len(hyp.tokens) in (0, 1)
