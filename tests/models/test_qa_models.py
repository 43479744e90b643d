"""The readers: shapes, masks over padding (padded positions change nothing), attention sums, span decoding against
brute force (never end < start, never padding), and the registry."""

import pytest
import torch

from qkv.models import create
from qkv.models.reading import QA_MODELS, ReaderOutput, decode_spans

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"attentive-reader": {"embed_dim": 8, "hidden_dim": 12},
         "bidaf-reader": {"embed_dim": 8, "hidden_dim": 12},
         "transformer-reader": {"dim": 16, "num_heads": 2, "num_layers": 2}}
SCORES = {"attentive-reader": ("general", "additive", "scaled_dot", "dot", "cosine", "mlp"),
          "bidaf-reader": ("general", "additive", "scaled_dot"),
          "transformer-reader": ("scaled_dot", "general")}


def batch(gen, b=3, tc=9, tq=5, vocab=30):
    context = torch.randint(4, vocab, (b, tc), generator=gen)
    question = torch.randint(4, vocab, (b, tq), generator=gen)
    cm = torch.ones(b, tc, dtype=torch.bool)
    qm = torch.ones(b, tq, dtype=torch.bool)
    cm[1, 5:] = False
    cm[2, 7:] = False
    qm[0, 3:] = False
    qm[2, 1:] = False
    match = (torch.rand(b, tc, generator=gen) < 0.3).float()
    return context, cm, question, qm, match


@pytest.mark.parametrize("name", list(SMALL))
def test_outputs_and_masks_over_padding(name, gen):
    for score in SCORES[name]:
        torch.manual_seed(0)
        model = create(name, vocab_size=30, score=score, dropout=0.0, **SMALL[name]).eval()
        c, cm, q, qm, match = batch(gen)
        out = model(c, cm, q, qm, match)
        assert isinstance(out, ReaderOutput)
        for t in out:
            assert t.shape == c.shape
        assert torch.isinf(out.start_logits[~cm]).all() and torch.isfinite(out.start_logits[cm]).all()
        assert torch.isinf(out.end_logits[~cm]).all() and torch.isfinite(out.end_logits[cm]).all()
        torch.testing.assert_close(out.attention.sum(-1), torch.ones(3))
        assert (out.attention[~cm] == 0).all()
        # garbage in the padded positions (ids, the match flag) and longer padding change nothing
        c2, q2, m2 = c.clone(), q.clone(), match.clone()
        c2[~cm] = torch.randint(4, 30, (int((~cm).sum()),), generator=gen)
        q2[~qm] = torch.randint(4, 30, (int((~qm).sum()),), generator=gen)
        m2[~cm] = 1.0
        pad = torch.zeros(3, 4, dtype=torch.bool)
        out2 = model(torch.cat([c2, c2[:, :4]], 1), torch.cat([cm, pad], 1), torch.cat([q2, q2[:, :4]], 1),
                     torch.cat([qm, pad], 1), torch.cat([m2, m2[:, :4]], 1))
        for a, b in zip(out, out2, strict=True):
            torch.testing.assert_close(a[cm], b[:, :9][cm], atol=1e-5, rtol=1e-5)
        # a row's answer does not depend on the other rows of its batch
        alone = model(c[1:2, :5], cm[1:2, :5], q[1:2], qm[1:2], match[1:2, :5])
        torch.testing.assert_close(alone.start_logits, out.start_logits[1:2, :5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(SMALL))
def test_gradients_reach_every_parameter(name, gen):
    model = create(name, vocab_size=30, **SMALL[name])
    c, cm, q, qm, match = batch(gen)
    out = model(c, cm, q, qm, match)
    loss = -(out.start_logits.log_softmax(-1)[:, 0] + out.end_logits.log_softmax(-1)[:, 1]).sum()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_bad_inputs(gen):
    model = create("attentive-reader", vocab_size=30, **SMALL["attentive-reader"])
    c, cm, q, qm, match = batch(gen)
    with pytest.raises(ValueError, match="context_mask must be a bool tensor"):
        model(c, cm.long(), q, qm, match)
    with pytest.raises(ValueError, match="match must be"):
        model(c, cm, q, qm, match[:, :3])
    cm0 = cm.clone()
    cm0[0] = False
    with pytest.raises(ValueError, match="at least one token"):
        model(c, cm0, q, qm, match)
    with pytest.raises(ValueError, match="hidden_dim .* must be even"):
        create("bidaf-reader", vocab_size=30, hidden_dim=7)
    with pytest.raises(ValueError, match="does not take"):
        create("transformer-reader", vocab_size=30, hidden_dim=8)


def brute_force(ls, le, mask, max_len):
    """The best (i, j) by enumeration, in float64."""
    ls = ls.double().masked_fill(~mask, float("-inf")).log_softmax(-1)
    le = le.double().masked_fill(~mask, float("-inf")).log_softmax(-1)
    best = (-float("inf"), None)
    n = int(mask.sum())
    for i in range(n):
        for j in range(i, min(n, i + max_len)):
            if ls[i] + le[j] > best[0]:
                best = (float(ls[i] + le[j]), (i, j))
    return best


def test_decode_spans_against_brute_force(gen):
    for _ in range(30):
        b, t = 4, int(torch.randint(1, 12, (1,), generator=gen))
        ls, le = torch.randn(b, t, generator=gen) * 3, torch.randn(b, t, generator=gen) * 3
        lengths = torch.randint(1, t + 1, (b,), generator=gen)
        mask = torch.arange(t)[None] < lengths[:, None]
        # padding holds the largest logits: never chosen
        ls[~mask], le[~mask] = 100.0, 100.0
        # ends that come before the best start are favoured: never end < start
        le[:, 0] += 5.0
        max_len = int(torch.randint(1, 5, (1,), generator=gen))
        start, end, prob = decode_spans(ls, le, mask, max_len)
        assert (start <= end).all() and (end < start + max_len).all()
        assert (end < lengths).all()
        for k in range(b):
            score, (i, j) = brute_force(ls[k], le[k], mask[k], max_len)
            assert prob[k].item() == pytest.approx(torch.tensor(score).exp().item(), rel=1e-4)
            assert (int(start[k]), int(end[k])) == (i, j)


def test_decode_spans_errors():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="max_answer_len"):
        decode_spans(torch.zeros(2, 3), torch.zeros(2, 3), mask, 0)
    with pytest.raises(ValueError, match="one shape"):
        decode_spans(torch.zeros(2, 4), torch.zeros(2, 3), mask)
    mask[1] = False
    with pytest.raises(ValueError, match="at least one real token"):
        decode_spans(torch.zeros(2, 3), torch.zeros(2, 3), mask)


def test_registry_names():
    assert set(QA_MODELS) == set(SMALL)


def test_token_flags_unpack_the_two_bits(gen):
    from qkv.models.reading import token_flags

    match = torch.randint(0, 4, (3, 7), generator=gen).float()
    mask = torch.rand(3, 7, generator=gen) < 0.7
    in_question, capital = token_flags(match, match.long(), mask)
    for i in range(3):
        for j in range(7):
            m, on = int(match[i, j]), bool(mask[i, j])
            assert int(in_question[i, j]) == (m & 1 if on else 0)
            assert int(capital[i, j]) == ((m >> 1) & 1 if on else 0)
    zero, zero2 = token_flags(None, match.long(), mask)
    assert not zero.any() and not zero2.any()


@pytest.mark.parametrize("name", list(SMALL))
def test_the_capital_letter_flag_is_read_only_when_asked(name, gen):
    c, cm, q, qm, match = batch(gen)
    torch.manual_seed(0)
    plain = create(name, vocab_size=30, dropout=0.0, **SMALL[name]).eval()
    torch.manual_seed(0)
    cased = create(name, vocab_size=30, dropout=0.0, case_feature=True, **SMALL[name]).eval()
    capital = match + 2 * (torch.rand(match.shape, generator=gen) < 0.5).float()
    capital[0, 0], capital[0, 1] = 2.0 + match[0, 0], match[0, 1]  # at least one token of each kind
    with torch.no_grad():
        # without the flag, bit 2 is ignored: the reader reads what it read before the flag existed
        for a, b in zip(plain(c, cm, q, qm, match), plain(c, cm, q, qm, capital), strict=True):
            torch.testing.assert_close(a, b)
        # with it, the flag changes what the reader says, and only through real tokens
        with_flag, without = cased(c, cm, q, qm, capital), cased(c, cm, q, qm, match)
        assert not torch.allclose(with_flag.start_logits[cm], without.start_logits[cm])
        garbage = capital.clone()
        garbage[~cm] = 3.0
        for a, b in zip(with_flag, cased(c, cm, q, qm, garbage), strict=True):
            torch.testing.assert_close(a, b)
    assert sum(p.numel() for p in cased.parameters()) > sum(p.numel() for p in plain.parameters())
    out = cased.train()(c, cm, q, qm, capital)
    (out.start_logits.log_softmax(-1)[:, 0] + out.end_logits.log_softmax(-1)[:, 1]).sum().neg().backward()
    assert not [n for n, p in cased.named_parameters() if p.grad is None]
