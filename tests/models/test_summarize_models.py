"""The pointer-generator against its formulas (float64, fresh random inputs): the copy distribution, the coverage
state and loss, the coverage switch of --coverage-from, beam search with copying against brute force, and the
Transformer's copy attention."""

import itertools
import math

import pytest
import torch

from qkv.models import create
from qkv.models.decoding import beam_search
from qkv.models.pointer import copy_distribution, coverage_loss

V = 12  # vocabulary of the tiny models; ids >= V are source words outside it


def _inputs(gen, b=3, s=7, n_ext=2):
    """Sources with padding, some words outside the vocabulary (ids V..V+n_ext-1, <unk> = 3 in ``src``)."""
    src_ext = torch.randint(4, V + n_ext, (b, s), generator=gen)
    lengths = torch.randint(s // 2, s + 1, (b,), generator=gen)
    lengths[0] = s
    mask = torch.arange(s)[None] < lengths[:, None]
    src_ext = src_ext.masked_fill(~mask, 0)
    src = torch.where(src_ext >= V, torch.full_like(src_ext, 3), src_ext)
    return src, mask, src_ext, n_ext


def _pointer(coverage=True, copy=True, seed=0, slots=0, score="additive", reader=0):
    torch.manual_seed(seed)
    model = create("pointer", vocab=V, embed_dim=6, hidden_dim=8, attn_dim=5, copy=copy, coverage=coverage,
                   oov_slots=slots, score=score, reader_layers=reader, reader_heads=2)
    if coverage:  # a trained w_c (it starts at zero)
        torch.nn.init.normal_(model.score.coverage_proj.weight)
    return model.double().eval()


def test_copy_distribution_sums_to_one_and_copies_exactly_the_attention_mass(gen):
    b, t, s, n_ext = 3, 4, 6, 3
    p_vocab = torch.softmax(torch.randn(b, t, V, generator=gen, dtype=torch.float64), -1)
    attn = torch.softmax(torch.randn(b, t, s, generator=gen, dtype=torch.float64), -1)
    p_gen = torch.rand(b, t, generator=gen, dtype=torch.float64)
    src_ext = torch.randint(4, V + n_ext, (b, s), generator=gen)
    src_ext[0, :2] = V + 1  # one word outside the vocabulary, twice, and nowhere else in that source
    src_ext[0, 2:] = torch.randint(4, V, (s - 2,), generator=gen)
    p = copy_distribution(p_vocab, attn, p_gen, src_ext, n_ext)
    assert p.shape == (b, t, V + n_ext)
    torch.testing.assert_close(p.sum(-1), torch.ones(b, t, dtype=torch.float64), rtol=0, atol=1e-12)
    for i in range(b):  # the formula, word by word
        for w in range(V + n_ext):
            mass = (attn[i] * (src_ext[i] == w)).sum(-1)
            gen_part = p_gen[i] * p_vocab[i, :, w] if w < V else 0.0
            torch.testing.assert_close(p[i, :, w], gen_part + (1 - p_gen[i]) * mass, rtol=0, atol=1e-12)
    # with p_gen = 0 a word outside the vocabulary gets exactly the attention that points at it
    p0 = copy_distribution(p_vocab, attn, torch.zeros(b, t, dtype=torch.float64), src_ext, n_ext)
    torch.testing.assert_close(p0[0, :, V + 1], attn[0, :, :2].sum(-1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", ["pointer", "pointer-slots", "pointer-general", "pointer-reader",
                                  "transformer-pointer"])
def test_the_models_final_distribution_is_the_copy_formula(name, gen):
    torch.manual_seed(1)
    if name == "pointer-general":  # Luong's s^T W h score (no coverage)
        model = _pointer(coverage=False, score="general")
        assert type(model.score).__name__ == "General"
    elif name.startswith("pointer"):
        model = _pointer(slots=1 if name == "pointer-slots" else 0, reader=2 if name == "pointer-reader" else 0)
    else:
        model = create(name, vocab=V, dim=8, num_heads=2, ffn_dim=16, num_layers=2, dropout=0.0).double().eval()
    src, mask, src_ext, n_ext = _inputs(gen)
    tgt_in = torch.randint(1, V + n_ext, (3, 5), generator=gen)
    out = model(src, mask, tgt_in, src_ext, n_ext)
    p = out.log_probs.exp()
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 5, dtype=torch.float64), rtol=0, atol=1e-10)
    assert float(out.attention.detach().masked_fill(mask[:, None], 0).abs().max()) == 0.0  # none on padding
    for i in range(3):
        for w in range(V, V + n_ext):
            mass = (out.attention[i] * (src_ext[i] == w)).sum(-1)
            torch.testing.assert_close(p[i, :, w], (1 - out.p_gen[i]) * mass, rtol=1e-9, atol=1e-12)
    # token by token (the one decoder's protocol) gives the same distributions as teacher forcing
    state = model.encode(src, mask, src_ext, n_ext)
    for t in range(5):
        logp, attn, state = model.decode_step(model.feed_tokens(tgt_in[:, t]), state)
        torch.testing.assert_close(logp.exp(), p[:, t], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(attn, out.attention[:, t], rtol=1e-9, atol=1e-12)


def test_coverage_is_the_sum_of_past_attention_and_the_loss_its_formula(gen):
    model = _pointer()
    src, mask, src_ext, n_ext = _inputs(gen)
    tgt_in = torch.randint(1, V, (3, 6), generator=gen)
    tgt_mask = torch.rand(3, 6, generator=gen) > 0.2
    with torch.no_grad():
        out = model(src, mask, tgt_in, src_ext, n_ext)
    a = out.attention
    expected_cov = torch.cat([torch.zeros_like(a[:, :1]), a.cumsum(1)[:, :-1]], dim=1)
    torch.testing.assert_close(out.coverage, expected_cov, rtol=0, atol=1e-12)
    total = 0.0
    for i in range(3):
        for t in range(6):
            if tgt_mask[i, t]:
                c = [sum(float(a[i, u, j]) for u in range(t)) for j in range(a.shape[2])]
                total += sum(min(float(a[i, t, j]), c[j]) for j in range(a.shape[2]))
    assert math.isclose(float(model.coverage_loss(a, out.coverage, tgt_mask)), total, rel_tol=1e-12)
    assert float(coverage_loss(a, out.coverage)) >= float(coverage_loss(a, out.coverage, tgt_mask))


def test_coverage_enters_the_score_and_a_zero_w_c_is_the_model_without_it(gen):
    model = _pointer()
    src, mask, src_ext, n_ext = _inputs(gen)
    tgt_in = torch.randint(1, V, (3, 4), generator=gen)
    on = model(src, mask, tgt_in, src_ext, n_ext)
    off = model(src, mask, tgt_in, src_ext, n_ext, use_coverage=False)
    torch.testing.assert_close(on.attention[:, 0], off.attention[:, 0])  # the first step has zero coverage
    assert (on.attention[:, 1:] - off.attention[:, 1:]).abs().max() > 1e-6
    fresh = create("pointer", vocab=V, embed_dim=6, hidden_dim=8, attn_dim=5, coverage=True).double().eval()
    assert not fresh.score.coverage_proj.weight.detach().any()  # w_c starts at zero: --coverage-from
    a, b = fresh(src, mask, tgt_in, src_ext, n_ext), fresh(src, mask, tgt_in, src_ext, n_ext, use_coverage=False)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=0, atol=0)
    # and with zero coverage fed, w_c gets no gradient (it stays zero until coverage is switched on)
    fresh.train()
    fresh(src, mask, tgt_in, src_ext, n_ext, use_coverage=False).log_probs.sum().backward()
    assert float(fresh.score.coverage_proj.weight.grad.abs().max()) == 0.0


def test_the_baseline_without_copying_has_no_extended_vocabulary(gen):
    model = _pointer(coverage=False, copy=False)
    src, mask, src_ext, n_ext = _inputs(gen)
    out = model(src, mask, torch.randint(1, V, (3, 2), generator=gen), src_ext, n_ext)
    assert out.log_probs.shape[-1] == V and bool((out.p_gen == 1).all())
    with pytest.raises(ValueError, match="coverage needs copy"):
        create("pointer", vocab=V, copy=False, coverage=True)


@pytest.mark.parametrize("seed, slots", [(0, 0), (1, 0), (2, 1)])
def test_beam_search_with_copying_finds_the_brute_force_best(seed, slots, gen):
    """Every output of up to 3 tokens over V' = V + 2 (copies included) scored by teacher forcing; a beam as wide
    as all prefixes must find the best, through the copied ids fed back as <unk> (or as their slot)."""
    model = _pointer(seed=seed, slots=slots)
    with torch.no_grad():
        model.switch.bias.fill_(-1.0)  # copy often, so that copies compete
    src, mask, src_ext, n_ext = _inputs(gen, b=1, s=5, n_ext=2)
    src_ext[0, 1], src_ext[0, 3] = V, V + 1
    src = torch.where(src_ext >= V, torch.full_like(src_ext, 3), src_ext)
    vocab, eos, max_len = V + n_ext, 2, 3
    prefixes = torch.tensor(list(itertools.product(range(vocab), repeat=2)))  # (a, b) for every a, b
    tgt_in = torch.cat([torch.ones(len(prefixes), 1, dtype=torch.long), prefixes], 1)
    n = len(prefixes)
    with torch.no_grad():
        lp = model(src.expand(n, -1), mask.expand(n, -1), tgt_in, src_ext.expand(n, -1), n_ext).log_probs
    scores = {}
    for row, (a, b) in enumerate(prefixes.tolist()):
        scores[(eos,)] = float(lp[row, 0, eos])
        if a != eos:
            scores[(a, eos)] = float(lp[row, 0, a] + lp[row, 1, eos])
            if b != eos:
                for c in range(vocab):
                    scores[(a, b, c)] = float(lp[row, 0, a] + lp[row, 1, b] + lp[row, 2, c])
    best_tokens = max(scores, key=scores.get)
    (hyp,) = beam_search(model, src, mask, src_ext, n_ext, beam=vocab * vocab, max_len=max_len, length_penalty=0.0,
                         normalize=False)
    words = list(best_tokens[:-1] if best_tokens[-1] == eos else best_tokens)
    assert hyp.tokens == words and math.isclose(hyp.score, scores[best_tokens], rel_tol=1e-5)  # float32 sums
    assert hyp.attention.shape == (len(best_tokens), 5)


def test_oov_slots_tell_unknown_words_apart_and_the_same_word_alike(gen):
    """With slots the j-th distinct unknown word of a source is read as slot V + j (the same word twice: the same
    slot), words past the slots as <unk>; without slots every unknown word is <unk>."""
    model, plain = _pointer(slots=2), _pointer(slots=0)
    src_ext = torch.tensor([[5, V, 6, V + 1, V, V + 2, 7]])
    mask = torch.ones_like(src_ext, dtype=torch.bool)
    src = torch.where(src_ext >= V, torch.full_like(src_ext, 3), src_ext)
    read = model.feed_tokens(src_ext)
    assert read.tolist() == [[5, V, 6, V + 1, V, 3, 7]]
    with torch.no_grad():
        memory = model.encode(src, mask, src_ext, 3)["memory"]
        by_hand, _ = model.encoder(read, mask)  # the encoder reads the slots
        torch.testing.assert_close(memory, by_hand, rtol=0, atol=0)
        swapped = src_ext.clone()
        swapped[0, 1], swapped[0, 3], swapped[0, 4] = V + 1, V, V + 1  # the two unknown words trade places
        assert not torch.allclose(model.encode(src, mask, swapped, 3)["memory"], memory)
        assert torch.equal(plain.encode(src, mask, swapped, 3)["memory"], plain.encode(src, mask, src_ext, 3)["memory"])
        past = src_ext.clone()
        past[0, 5] = V + 7  # past the slots: <unk> whichever it is
        torch.testing.assert_close(model.encode(src, mask, past, 8)["memory"], memory, rtol=0, atol=0)
    with pytest.raises(ValueError, match="oov_slots"):
        create("pointer", vocab=V, copy=False, oov_slots=4)
    with pytest.raises(ValueError, match="additive with coverage"):
        create("pointer", vocab=V, coverage=True, score="general")


def test_reader_layers_are_self_attention_over_the_encoder_outputs_and_ignore_padding(gen):
    """``reader_layers``: the decoder attends to the BiLSTM's outputs passed through that many Transformer layers
    (the source's padding masked as keys); a padded source reads the same as alone; bad settings are refused."""
    model = _pointer(coverage=False, score="general", reader=2)
    src, mask, src_ext, n_ext = _inputs(gen)
    with torch.no_grad():
        memory = model.encode(src, mask, src_ext, n_ext)["memory"]
        by_hand, _ = model.encoder(src, mask)
        for layer in model.reader:
            by_hand = layer(by_hand, key_mask=mask)
        torch.testing.assert_close(memory, by_hand, rtol=0, atol=0)
        assert not torch.allclose(memory, model.encoder(src, mask)[0])  # the layers change it
        for i in range(3):
            n = int(mask[i].sum())
            alone = model.encode(src[i:i + 1, :n], mask[i:i + 1, :n], src_ext[i:i + 1, :n], n_ext)["memory"]
            torch.testing.assert_close(memory[i:i + 1, :n], alone, rtol=1e-9, atol=1e-12)
            # the first word's reading depends on the last through the self-attention, not only through the LSTM
            changed = src[i:i + 1, :n].clone()
            changed[0, -1] = 4 + (int(changed[0, -1]) - 3) % (V - 4)
            lstm_only = model.encoder(changed, mask[i:i + 1, :n])[0]
            read = model.encode(changed, mask[i:i + 1, :n], None, 0)["memory"]
            assert not torch.allclose(read[0, 0], alone[0, 0]) and not torch.allclose(read, lstm_only)
    for bad in ({"reader_layers": -1}, {"reader_layers": 1, "reader_heads": 3}):
        with pytest.raises(ValueError, match="reader_layers"):
            create("pointer", vocab=V, embed_dim=6, hidden_dim=8, **bad)
