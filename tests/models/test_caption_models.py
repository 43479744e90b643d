"""Captioning models: the doubly stochastic penalty and the REINFORCE terms on hand-computed cases, the gate beta,
teacher forcing against step-by-step decoding, beam 1 against a greedy loop, hard attention's test modes."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.data.tokenize import BOS_ID, EOS_ID
from qkv.models import create
from qkv.models.captioning import (
    FixedCaptioner,
    GridEncoder,
    HardCaptioner,
    SoftCaptioner,
    doubly_stochastic_penalty,
    grid_coords,
    reinforce_loss,
)
from qkv.models.decoding import beam_search

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"vocab_size": 11, "widths": [4, 4, 6, 8], "dropout": 0.0}
RNN = {**TINY, "embed_dim": 6, "hidden_dim": 10}
MODELS = {"caption-soft": {**RNN, "attn_dim": 7}, "caption-hard": {**RNN, "attn_dim": 7}, "caption-fixed": RNN,
          "caption-transformer": {**TINY, "dim": 8, "num_heads": 2, "num_layers": 2, "max_len": 12, "grid": 4}}


def test_doubly_stochastic_penalty_hand_computed():
    attn = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]], dtype=torch.float64)
    both = doubly_stochastic_penalty(attn, torch.tensor([[True, True]]))
    assert float(both) == pytest.approx(0.4 ** 2 + 0.6 ** 2 + 0.0)  # sums over t: 0.6, 0.4, 1.0
    first = doubly_stochastic_penalty(attn, torch.tensor([[True, False]]))  # the padded step does not count
    assert float(first) == pytest.approx(0.5 ** 2 + 0.7 ** 2 + 0.8 ** 2)
    two = doubly_stochastic_penalty(torch.cat([attn, attn]), torch.tensor([[True, True], [True, False]]))
    assert float(two) == pytest.approx(float(both) + float(first))  # summed over the batch


def test_reinforce_gradient_hand_computed():
    z = torch.tensor([0.2, -0.5, 1.0], dtype=torch.float64, requires_grad=True)
    alpha = z.softmax(-1)
    log_alpha = alpha.log()
    s, reward, baseline, lr, le = 1, -2.0, -3.0, 0.7, 0.05
    entropy = -(alpha * log_alpha).sum()
    loss = reinforce_loss(torch.tensor([reward], dtype=torch.float64), log_alpha[s].reshape(1, 1),
                          entropy.reshape(1, 1), torch.tensor([[True]]), baseline, reward_weight=lr,
                          entropy_weight=le)
    loss.backward()
    a = alpha.detach()
    onehot = torch.nn.functional.one_hot(torch.tensor(s), 3).double()
    h = float(-(a * a.log()).sum())
    # d/dz [-lr (R - b) log a_s] = -lr (R - b) (onehot - a);  d/dz [-le H] = le a (log a + H)
    expected = -lr * (reward - baseline) * (onehot - a) + le * a * (a.log() + h)
    torch.testing.assert_close(z.grad, expected)


def test_reinforce_estimator_is_unbiased_whatever_the_baseline():
    z = torch.tensor([0.3, -1.0, 0.5, 0.0], dtype=torch.float64, requires_grad=True)
    rewards = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    exact = torch.autograd.grad((z.softmax(-1) * rewards).sum(), z)[0]  # d E[R] / dz
    for baseline in (0.0, 2.5):
        alpha = z.softmax(-1)
        # the expectation over s of the estimator: sum_s alpha_s * grad of -loss(s)
        total = torch.zeros_like(z)
        for s in range(4):
            loss = reinforce_loss(rewards[s:s + 1], alpha.log()[s].reshape(1, 1), torch.zeros(1, 1),
                                  torch.tensor([[True]]), baseline)
            total += alpha[s].detach() * -torch.autograd.grad(loss, z, retain_graph=True)[0]
        torch.testing.assert_close(total, exact)


def test_padding_steps_do_not_enter_reinforce():
    lp = torch.tensor([[-1.0, -7.0]], requires_grad=True)
    loss = reinforce_loss(torch.tensor([-1.0]), lp, torch.zeros(1, 2), torch.tensor([[True, False]]), 0.0)
    loss.backward()
    assert lp.grad[0, 1] == 0 and lp.grad[0, 0] != 0


def _images(gen, n=3):
    return torch.rand(n, 1, 16, 16, generator=gen)


def test_beta_gates_the_context(gen):
    torch.manual_seed(0)
    model = SoftCaptioner(**MODELS["caption-soft"]).eval()
    with torch.no_grad():
        model.f_beta.weight.zero_()
        model.f_beta.bias.fill_(math.log(0.25 / 0.75))  # beta = 0.25 whatever h
    state = model.encode(_images(gen))
    z, alpha, _, extras = model.context(state)
    torch.testing.assert_close(extras["beta"], torch.full((3,), 0.25))
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3))
    ungated = torch.einsum("bl,bld->bd", alpha.double(), state["a"].double())  # independent weighted sum
    torch.testing.assert_close(z.double(), 0.25 * ungated, rtol=1e-5, atol=1e-6)
    out = model(_images(gen), torch.full((3, 4), BOS_ID))
    assert out.beta.shape == (3, 4) and torch.allclose(out.beta, torch.tensor(0.25))


@pytest.mark.parametrize("name", list(MODELS))
def test_teacher_forcing_equals_step_by_step(name, gen):
    torch.manual_seed(1)
    model = create(name, **MODELS[name]).eval()
    x = _images(gen)
    tgt = torch.randint(4, 11, (3, 5), generator=gen)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        out = model(x, tgt)
        state = model.encode(x)
        steps = []
        for t in range(5):
            logits, attn, state = model.decode_step(tgt[:, t], state)
            steps.append((logits, attn))
    assert out.logits.shape == (3, 5, 11) and out.attention.shape == (3, 5, 4)
    torch.testing.assert_close(torch.stack([s[0] for s in steps], 1), out.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack([s[1] for s in steps], 1), out.attention, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(3, 5))


@pytest.mark.parametrize("name", list(MODELS))
def test_beam_one_is_greedy(name, gen):
    torch.manual_seed(2)
    model = create(name, **MODELS[name]).eval()
    x = _images(gen, 4)
    hyps = beam_search(model, x, beam=1, max_len=8, length_penalty=0.0)  # the images are the encoder input
    with torch.no_grad():  # a plain greedy loop
        state = model.encode(x)
        y = torch.full((4,), BOS_ID)
        seqs = [[] for _ in range(4)]
        done = torch.zeros(4, dtype=torch.bool)
        for _ in range(8):
            logits, _, state = model.decode_step(y, state)
            y = logits.argmax(-1)
            for i in range(4):
                if not done[i]:
                    seqs[i].append(int(y[i]))
            done |= y == EOS_ID
    for h, seq in zip(hyps, seqs, strict=True):
        assert h.tokens == [t for t in seq if t != EOS_ID][:len(h.tokens)] and h.tokens == seq[:len(h.tokens)]
        assert len(h.tokens) == (seq.index(EOS_ID) if EOS_ID in seq else len(seq))
    wider = beam_search(model, x, beam=3, max_len=8, length_penalty=0.0)
    assert all(w.score >= h.score - 1e-5 for w, h in zip(wider, hyps, strict=True))  # a beam finds no worse


def test_hard_attention_train_and_test_modes(gen):
    torch.manual_seed(3)
    hard = HardCaptioner(**MODELS["caption-hard"])
    soft_like = hard.eval()
    x, tgt = _images(gen), torch.full((3, 4), BOS_ID)
    with torch.no_grad():
        state = soft_like.encode(x)
        z, alpha, _, _ = soft_like.context(state)
        torch.testing.assert_close(z, torch.einsum("bl,bld->bd", alpha, state["a"]), rtol=1e-5, atol=1e-6)
        soft_like.test_attention = "argmax"
        z_max, one_hot, _, _ = soft_like.context(state)
    assert torch.equal(one_hot.argmax(-1), alpha.argmax(-1)) and torch.equal(one_hot.sum(-1), torch.ones(3))
    torch.testing.assert_close(z_max, state["a"][torch.arange(3), alpha.argmax(-1)])
    hard.train()
    out = hard(x, tgt)
    assert out.sample_log_prob.shape == (3, 4) and (out.sample_log_prob <= 0).all()
    assert (out.entropy >= 0).all() and (out.entropy <= math.log(4) + 1e-5).all()
    hard.update_baseline(torch.tensor([-4.0, -2.0]))
    assert float(hard.baseline) == -3.0  # the first call sets it
    hard.update_baseline(torch.tensor([-1.0]), decay=0.9)
    assert float(hard.baseline) == pytest.approx(-2.8)
    assert "baseline" in hard.state_dict()  # checkpointed with the weights
    with pytest.raises(ValueError, match="test_attention"):
        HardCaptioner(**MODELS["caption-hard"], test_attention="mean")


def test_fixed_model_attention_is_uniform_and_ignores_positions(gen):
    model = FixedCaptioner(**MODELS["caption-fixed"]).eval()
    out = model(_images(gen), torch.full((3, 2), BOS_ID))
    torch.testing.assert_close(out.attention, torch.full((3, 2, 4), 0.25))
    assert not hasattr(model, "attend")


def test_scores_and_bad_sizes():
    for score in ("general", "mlp", "additive"):
        create("caption-soft", **{**MODELS["caption-soft"], "score": score})
    with pytest.raises(ValueError, match="caption-soft"):
        create("caption-soft", **{**MODELS["caption-soft"], "widths": [4, 4]})
    with pytest.raises(ValueError, match="grid"):
        model = create("caption-transformer", **MODELS["caption-transformer"])
        model.encode(torch.zeros(1, 1, 32, 32))


WHERE = {"caption-soft": {**MODELS["caption-soft"], "coords": False, "where": True},
         "caption-hard": {**MODELS["caption-hard"], "coords": False, "where": True, "deep_output": "context",
                          "content_ids": [5, 7]},
         "caption-soft ": {**MODELS["caption-soft"], "where": True, "deep_output": "context", "content_ids": [4]},
         "caption-hard ": {**MODELS["caption-hard"], "coords": False, "where": True, "padding": "circular",
                           "keys": "both"},
         "caption-soft  ": {**MODELS["caption-soft"], "coords": False, "where": True, "padding": "circular",
                            "keys": "positions", "deep_output": "grounded", "content_ids": [5, 7],
                            "init_state": "learned"}}


@pytest.mark.parametrize("name", list(WHERE))
def test_where_and_context_output_teacher_forcing_equals_step_by_step(name, gen):
    torch.manual_seed(2)
    model = create(name.strip(), **WHERE[name]).eval()
    x, tgt = torch.rand(3, 1, 24, 24, generator=gen), torch.randint(4, 11, (3, 6), generator=gen)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        out, state, steps = model(x, tgt), model.encode(x), []
        for t in range(6):
            logits, _, state = model.decode_step(tgt[:, t], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), out.logits, rtol=1e-4, atol=1e-5)


def test_where_location_is_the_alpha_weighted_grid(gen):
    torch.manual_seed(3)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "coords": False, "where": True}).eval()
    state = model.encode(torch.rand(2, 1, 24, 24, generator=gen))  # a 3x3 grid
    assert state["grid"] == (3, 3)
    by_hand = torch.tensor([[y, x] for y in (-1.0, 0.0, 1.0) for x in (-1.0, 0.0, 1.0)], dtype=torch.float64)
    torch.testing.assert_close(grid_coords(3, 3).double(), by_hand)
    with torch.no_grad():
        z, alpha, loc, extras = model.context(state)
        expected = sum(alpha[:, i, None].double() * by_hand[i] for i in range(9))
        torch.testing.assert_close(loc.double(), expected, rtol=1e-5, atol=1e-6)
        ungated = torch.einsum("bl,bld->bd", alpha.double(), state["a"].double())  # z stays the image's context
        torch.testing.assert_close(z.double(), extras["beta"][:, None].double() * ungated, rtol=1e-5, atol=1e-6)
        _, _, _, step_extras = model.step(torch.full((2,), BOS_ID), state)
        torch.testing.assert_close(step_extras["loc"], loc)
    hard = HardCaptioner(**{**MODELS["caption-hard"], "where": True}).eval()
    hard.test_attention = "argmax"
    state = hard.encode(torch.rand(2, 1, 16, 16, generator=gen))
    _, one_hot, loc, _ = hard.context(state)
    torch.testing.assert_close(loc, grid_coords(2, 2)[one_hot.argmax(-1)])  # the chosen cell's (y, x)


def test_context_output_predicts_items_without_the_decoder_state(gen):
    torch.manual_seed(4)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "deep_output": "context",
                             "content_ids": [5, 7]}).eval()
    state = model.encode(_images(gen))
    y = torch.tensor([BOS_ID, 6, 9])
    with torch.no_grad():
        z, _, loc, _ = model.context(state)
        logits, _, _, _ = model.step(y, state)
        e = model.embed(y)
        items = model.out(e + model.out_z(z))
        others = model.out(e + model.out_z(z) + model.out_loc(loc) + model.out_h(model.cell(
            torch.cat([e, z, loc], -1), (state["h"], state["c"]))[0]))
    torch.testing.assert_close(logits[:, [5, 7]], items[:, [5, 7]])
    rest = [i for i in range(11) if i not in (5, 7)]
    torch.testing.assert_close(logits[:, rest], others[:, rest])


def test_configs_without_the_new_options_build_the_old_model():
    model = create("caption-soft", **MODELS["caption-soft"])  # a config saved before where/deep_output
    assert model.encoder.coords and not model.where and model.deep_output == "full"
    assert model.cell.input_size == 6 + 8 and not hasattr(model, "out_loc")
    assert "content" not in model.state_dict()
    with pytest.raises(ValueError, match="content_ids"):
        SoftCaptioner(**{**MODELS["caption-soft"], "deep_output": "context"})
    with pytest.raises(ValueError, match="deep_output"):
        SoftCaptioner(**{**MODELS["caption-soft"], "deep_output": "items"})
    with pytest.raises(ValueError, match="content_ids"):
        SoftCaptioner(**{**MODELS["caption-soft"], "deep_output": "context", "content_ids": [11]})


def test_circular_padding_makes_the_encoder_equivariant_to_cell_shifts(gen):
    """With circular padding an item gives the same features in every cell: shifting a 32x32 image by 8 pixels
    (one grid cell) shifts the 4x4 feature grid by one position, exactly; zero padding does not."""
    torch.manual_seed(5)
    x = torch.rand(2, 1, 32, 32, generator=gen, dtype=torch.float64)
    for padding, equivariant in (("circular", True), ("zeros", False)):
        enc = GridEncoder(1, (4, 4, 6, 8), coords=False, padding=padding).double().eval()
        with torch.no_grad():
            a, grid = enc(x)
            shifted, _ = enc(torch.roll(x, shifts=(8, 16), dims=(2, 3)))
        expected = torch.roll(a.reshape(2, *grid, -1), shifts=(1, 2), dims=(1, 2)).reshape_as(a)
        assert torch.allclose(shifted, expected, atol=1e-10) is equivariant
    with pytest.raises(ValueError, match="padding"):
        GridEncoder(1, (4, 4, 6, 8), padding="mirror")


def test_key_positions_go_into_the_keys_not_the_values(gen):
    torch.manual_seed(6)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "coords": False, "padding": "circular", "where": True,
                             "keys": "both"}).eval()
    images = torch.rand(2, 1, 24, 24, generator=gen)
    with torch.no_grad():
        state = model.encode(images)
        coords = grid_coords(3, 3)
        keys = model.attend.score.prepare_key(state["a"] + model.key_pos(coords))
        torch.testing.assert_close(state["keys"], keys)
        torch.testing.assert_close(state["values"], torch.cat([state["a"], coords.expand(2, -1, -1)], -1))
        z, alpha, _, extras = model.context(state)
        by_hand = extras["beta"][:, None] * torch.einsum("bl,bld->bd", alpha, state["a"])
        torch.testing.assert_close(z, by_hand)
        # the keys depend on where a feature is: the same features at other positions score differently
        assert not torch.allclose(state["keys"], model.attend.score.prepare_key(state["a"]))


def test_position_keys_score_the_query_against_positions_plus_a_salience_of_the_features(gen):
    """keys='positions': alpha = softmax(v . tanh(W_q h + W_k p_l) + s(a_l)); the salience s sees the features
    only, so with circular padding it moves with an item from cell to cell, exactly."""
    torch.manual_seed(7)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "coords": False, "padding": "circular", "where": True,
                             "keys": "positions"}).double().eval()
    images = torch.rand(2, 1, 32, 32, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        state = model.encode(images)
        p = model.key_pos(grid_coords(4, 4, dtype=torch.float64))
        s = model.attend.score
        raw = torch.tanh(s.query_proj(state["h"])[:, None] + s.key_proj(p)) @ s.v.weight[0]  # (B, L)
        expected = (raw + model.salience(state["a"])[..., 0]).softmax(-1)
        _, alpha, _, _ = model.context(state)
        torch.testing.assert_close(alpha, expected)
        moved = model.encode(torch.roll(images, shifts=(16, 8), dims=(2, 3)))
        shifted = torch.roll(state["salience"].reshape(2, 4, 4), shifts=(2, 1), dims=(1, 2))
        torch.testing.assert_close(moved["salience"].reshape(2, 4, 4), shifted)
    with pytest.raises(ValueError, match="keys"):
        SoftCaptioner(**{**MODELS["caption-soft"], "keys": "values"})


def test_learned_initial_state_knows_nothing_of_the_image(gen):
    torch.manual_seed(8)
    images = torch.rand(2, 1, 16, 16, generator=gen)
    learned = SoftCaptioner(**{**MODELS["caption-soft"], "init_state": "learned"}).eval()
    mean = SoftCaptioner(**MODELS["caption-soft"]).eval()
    with torch.no_grad():
        state, paper = learned.encode(images), mean.encode(images)
        torch.testing.assert_close(state["h"][0], state["h"][1])
        torch.testing.assert_close(state["c"], torch.tanh(learned.c0).expand(2, -1))
        torch.testing.assert_close(paper["h"], torch.tanh(mean.init_h(paper["a"].mean(1))))
    assert not hasattr(learned, "init_h") and not hasattr(mean, "h0")
    with pytest.raises(ValueError, match="init_state"):
        SoftCaptioner(**{**MODELS["caption-soft"], "init_state": "zeros"})


def test_grounded_output_keeps_the_items_out_of_the_decoder_state(gen):
    """deep_output='grounded': item words from L_o(E y + L_z z); the LSTM sees [E' y, loc, found] with one
    embedding E' for every item word, so naming another item leaves the state and the other words unchanged."""
    torch.manual_seed(9)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "deep_output": "grounded",
                             "content_ids": [5, 7], "keys": "positions", "padding": "circular"}).eval()
    state = model.encode(_images(gen))
    y = torch.tensor([BOS_ID, 5, 9])
    with torch.no_grad():
        z, alpha, loc, _ = model.context(state)
        logits, _, new, _ = model.step(y, state)
        e = model.embed(y)
        e_state = torch.stack([e[0], model.item_embed, e[2]])
        found = (alpha * model.salience(state["a"])[..., 0]).sum(-1, keepdim=True)
        h, _ = model.cell(torch.cat([e_state, loc, found], -1), (state["h"], state["c"]))
        torch.testing.assert_close(new["h"], h)
        items = model.out(e + model.out_z(z))
        rest = model.out(e_state + model.out_loc(loc) + model.out_h(h))
        torch.testing.assert_close(logits[:, [5, 7]], items[:, [5, 7]])
        others = [i for i in range(11) if i not in (5, 7)]
        torch.testing.assert_close(logits[:, others], rest[:, others])
        other_item, _, other_state, _ = model.step(torch.tensor([BOS_ID, 7, 9]), state)
        torch.testing.assert_close(other_state["h"], new["h"])  # which item was named does not reach the state
        torch.testing.assert_close(other_item[1, others], logits[1, others])
    with pytest.raises(ValueError, match="where"):
        SoftCaptioner(**{**MODELS["caption-soft"], "deep_output": "grounded", "content_ids": [5]})


def test_glimpse_reads_the_items_through_a_window_at_the_attended_location(gen):
    torch.manual_seed(10)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "deep_output": "grounded", "glimpse": True,
                             "content_ids": [5, 7], "keys": "positions", "padding": "circular"}).double().eval()
    state = model.encode(torch.rand(2, 1, 32, 32, generator=gen, dtype=torch.float64))
    y = torch.tensor([BOS_ID, 6])
    with torch.no_grad():
        _, alpha, loc, extras = model.context(state)
        logits, attn, _, _ = model.step(y, state)
        coords, sigma = grid_coords(4, 4, dtype=torch.float64), float(model.log_sigma.exp())
        window = torch.stack([torch.exp(-((coords - loc[b]) ** 2).sum(-1) / (2 * sigma ** 2)) for b in range(2)])
        w = window * model.salience(state["a"])[..., 0].exp()
        w = w / w.sum(-1, keepdim=True)
        z = extras["beta"][:, None] * torch.einsum("bl,bld->bd", w, state["a"])
        items = model.out(model.embed(y) + model.out_z(z))
    torch.testing.assert_close(logits[:, [5, 7]], items[:, [5, 7]])
    torch.testing.assert_close(attn, w)  # the step's map: the weights the item word was read with
    with pytest.raises(ValueError, match="glimpse"):
        SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "glimpse": True})


def test_hard_attention_trains_a_share_of_captions_on_the_expected_context(gen):
    torch.manual_seed(11)
    images = _images(gen)
    for share in (0.0, 1.0):
        model = HardCaptioner(**{**MODELS["caption-hard"], "where": True, "expected_share": share}).train()
        state = model.encode(images)
        z, alpha, loc, extras = model.context(state)
        soft_z = torch.einsum("bl,bld->bd", alpha, state["a"])
        expected = grid_coords(*state["grid"]).T @ alpha.T
        if share == 1.0:  # the expectation: no sample, no REINFORCE term
            torch.testing.assert_close(z, soft_z)
            torch.testing.assert_close(loc, expected.T)
            assert torch.all(extras["log_prob"] == 0)
        else:  # one sampled location per caption: z is one of the annotation vectors
            assert all(any(torch.equal(z[b], state["a"][b, i]) for i in range(state["a"].shape[1])) for b in range(3))
            assert torch.all(extras["log_prob"] < 0)
    with pytest.raises(ValueError, match="expected_share"):
        HardCaptioner(**{**MODELS["caption-hard"], "expected_share": 1.5})


def test_capture_records_alpha_and_the_glimpse_apart(gen):
    from qkv.capture import capture_attention

    torch.manual_seed(12)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "deep_output": "grounded", "glimpse": True,
                             "content_ids": [5, 7], "keys": "positions", "padding": "circular"}).eval()
    tgt = torch.randint(4, 11, (2, 5), generator=gen)
    tgt[:, 0] = BOS_ID
    with torch.no_grad(), capture_attention(model) as records:
        out = model(_images(gen, 2), tgt)
    by_name = {r.name: r for r in records}
    assert set(by_name) == {"SoftCaptioner", "window"}
    assert all(r.weights.shape[-2:] == (5, 4) for r in records)  # one row per word, not two
    torch.testing.assert_close(by_name["window"].weights[:, 0], out.attention)  # the maps the words report


def test_local_salience_reads_what_each_place_holds_itself(gen):
    torch.manual_seed(13)
    model = SoftCaptioner(**{**MODELS["caption-soft"], "coords": False, "where": True, "keys": "positions",
                             "padding": "circular", "salience": "local"}).eval()
    images = torch.rand(2, 1, 32, 32, generator=gen)
    with torch.no_grad():
        state = model.encode(images)
        stage2 = model.encoder.net[:4](images)  # conv, pool, conv, pool: (B, widths[1], 8, 8)
        local = torch.nn.functional.avg_pool2d(stage2, 2).flatten(2).transpose(1, 2)  # onto the 4x4 grid
        torch.testing.assert_close(state["salience"], model.salience(local).transpose(1, 2))
        far = images.clone()
        far[:, :, :8, :8] = torch.rand(2, 1, 8, 8, generator=gen)  # change one corner of the image
        changed = model.encode(far)
    # a place two cells from the change keeps its salience; the grid features, which see the whole image, do not
    torch.testing.assert_close(changed["salience"].reshape(2, 4, 4)[:, 2, 2],
                               state["salience"].reshape(2, 4, 4)[:, 2, 2])
    assert not torch.allclose(changed["a"].reshape(2, 4, 4, -1)[:, 2, 2], state["a"].reshape(2, 4, 4, -1)[:, 2, 2])
    with pytest.raises(ValueError, match="salience"):
        SoftCaptioner(**{**MODELS["caption-soft"], "salience": "pixels"})


def test_each_captioner_owns_its_loss_terms(gen):
    """`auxiliary_loss`: the soft model's penalty (weighted, none at 0), the hard model's REINFORCE terms against its
    baseline (set by the first batch, then a moving average), nothing for the fixed and Transformer captioners —
    each equal to the terms computed by hand from the same forward pass."""
    x = torch.rand(3, 1, 32, 32, generator=gen)
    tgt = torch.randint(4, 11, (3, 5), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    ll = -torch.rand(3, generator=gen) * 10
    soft = SoftCaptioner(**MODELS["caption-soft"])
    out = soft(x, tgt)
    loss, stats = soft.auxiliary_loss(out, ll, mask, doubly_stochastic=0.3)
    by_hand = doubly_stochastic_penalty(out.attention.float(), mask)
    assert torch.allclose(loss, 0.3 * by_hand) and torch.allclose(stats["penalty"], by_hand)
    assert soft.auxiliary_loss(out, ll, mask, doubly_stochastic=0.0) == (None, {})

    torch.manual_seed(0)
    hard = HardCaptioner(**MODELS["caption-hard"], expected_share=0.0).train()
    out = hard(x, tgt)
    assert not bool(hard.baseline_ready)
    loss, _ = hard.auxiliary_loss(out, ll, mask, reward_weight=0.7, entropy_weight=0.05, baseline_decay=0.8)
    expect = reinforce_loss(ll, out.sample_log_prob.float(), out.entropy.float(), mask, ll.mean(), reward_weight=0.7,
                            entropy_weight=0.05)  # the first batch's baseline is its own mean
    assert torch.allclose(loss, expect)
    assert float(hard.baseline) == pytest.approx(float(ll.mean()))  # 0.8 b + 0.2 mean, with b = mean
    ll2 = ll - 3
    loss2, _ = hard.auxiliary_loss(out, ll2, mask, reward_weight=0.7, entropy_weight=0.05, baseline_decay=0.8)
    expect2 = reinforce_loss(ll2, out.sample_log_prob.float(), out.entropy.float(), mask, ll.mean(),
                             reward_weight=0.7, entropy_weight=0.05)
    assert torch.allclose(loss2, expect2)
    assert float(hard.baseline) == pytest.approx(0.8 * float(ll.mean()) + 0.2 * float(ll2.mean()))
    assert hard.eval().auxiliary_loss(hard(x, tgt), ll, mask) == (None, {})  # no sample outside training

    for name, images in (("caption-fixed", x), ("caption-transformer", x[..., :16, :16])):  # a 2x2 grid
        model = create(name, **MODELS[name])
        assert model.auxiliary_loss(model(images, tgt), ll, mask, doubly_stochastic=1.0) == (None, {})


def _seen(output: torch.Tensor, images: torch.Tensor, place: int) -> tuple[int, int]:
    """``(rows, columns)`` of pixels of ``images`` that the scalar ``output`` of grid ``place`` (of 8x8) depends on:
    the extent of the gradient's support (the receptive field measured, not computed), on the canvas torus (the
    place's cell rolled to the middle)."""
    (grad,) = torch.autograd.grad(output, images, retain_graph=True)
    r, c = divmod(place, 8)
    seen = torch.roll(grad.abs().sum((0, 1)) > 0, (28 - 8 * r, 28 - 8 * c), (0, 1))
    rows, cols = seen.any(1).nonzero().flatten(), seen.any(0).nonzero().flatten()
    return int(rows.max() - rows.min() + 1), int(cols.max() - cols.min() + 1)


@pytest.mark.parametrize("widths", [(4, 4, 6, 8), (3, 5, 4, 6, 7)])
def test_the_local_glimpse_reads_features_that_see_less_than_an_item(gen, widths):
    """glimpse_features='local': the window reads features whose receptive field (measured by the gradient of one
    grid place with respect to the pixels) is at most 22 pixels, less than a scene's item (24-32): a window beside
    an item cannot read it. The grid features the keys and the salience see, and the 'grid' glimpse read, see more
    than an item."""
    torch.manual_seed(14)
    base = {**MODELS["caption-soft"], "widths": widths, "coords": False, "where": True, "deep_output": "grounded",
            "glimpse": True, "content_ids": [5, 7], "keys": "positions", "padding": "circular"}
    model = SoftCaptioner(**base, glimpse_features="local").double().eval()  # BN on running stats: per image
    images = torch.rand(2, 1, 64, 64, generator=gen, dtype=torch.float64, requires_grad=True)
    state = model.encode(images)
    for place in (0, 27, 36):  # a corner (wrapped by the circular padding) and the middle of the 8x8 grid
        assert max(_seen(state["items"][1, place].sum(), images, place)) <= 22
        assert min(_seen(state["a"][1, place].sum(), images, place)) > 32
    # the step's item words read exactly these features through the window
    with torch.no_grad():
        y = torch.tensor([BOS_ID, 6])
        _, _, loc, extras = model.context(state)
        logits, attn, _, _ = model.step(y, state)
        third = model.encoder.net[:6](images.detach())  # conv, pool, conv, pool, conv, pool: the grid's stride
        items = model.read(third.flatten(2).transpose(1, 2))
        torch.testing.assert_close(state["items"], items)
        z = extras["beta"][:, None] * torch.einsum("bl,bld->bd", attn, items)
        torch.testing.assert_close(logits[:, [5, 7]], model.out(model.embed(y) + model.out_z(z))[:, [5, 7]])
    grid = SoftCaptioner(**base).double().eval()  # the grid glimpse: the window reads features that see an item
    assert grid.glimpse_features == "grid" and "items" not in grid.encode(images)


@pytest.mark.parametrize("widths", [(4, 4, 6, 8), (3, 5, 4, 6, 7)])
def test_the_mid_glimpse_reads_features_that_see_about_an_item(gen, widths):
    """glimpse_features='mid': the window reads the first convolution after the third stage, whose receptive field
    (measured) is more than the third stage's 22 pixels and at most 38, about a scene's item (24-32)."""
    torch.manual_seed(15)
    base = {**MODELS["caption-soft"], "widths": widths, "coords": False, "where": True, "deep_output": "grounded",
            "glimpse": True, "content_ids": [5, 7], "keys": "positions", "padding": "circular"}
    model = SoftCaptioner(**base, glimpse_features="mid").double().eval()
    images = torch.rand(2, 1, 64, 64, generator=gen, dtype=torch.float64, requires_grad=True)
    state = model.encode(images)
    for place in (0, 27, 36):
        assert 22 < max(_seen(state["items"][1, place].sum(), images, place)) <= 38
    with torch.no_grad():
        mid = model.encoder.net[:7](images.detach())  # the third stage, then one convolution at the grid's stride
        torch.testing.assert_close(state["items"], model.read(mid.flatten(2).transpose(1, 2)))


def test_glimpse_features_are_checked():
    with pytest.raises(ValueError, match="glimpse_features"):
        SoftCaptioner(**{**MODELS["caption-soft"], "where": True, "deep_output": "grounded", "glimpse": True,
                         "content_ids": [5], "glimpse_features": "pixels"})
    with pytest.raises(ValueError, match="glimpse_features"):  # nothing reads them without the glimpse
        HardCaptioner(**{**MODELS["caption-hard"], "glimpse_features": "local"})


@pytest.mark.parametrize("glimpse_features", ["grid", "mid"])
def test_naming_reads_each_word_again_from_the_third_stage_through_the_glimpse_window(gen, glimpse_features):
    """naming=True: in training, each step's word is read again from the third stage's features through the very
    window the glimpse read with (the step's attention map); nothing of it in evaluation or decoding."""
    torch.manual_seed(16)
    base = {**MODELS["caption-soft"], "where": True, "deep_output": "grounded", "glimpse": True,
            "content_ids": [5, 7], "keys": "positions", "padding": "circular", "glimpse_features": glimpse_features,
            "coords": False}
    model = SoftCaptioner(**base, naming=True).double().train()
    model.dropout.p = 0.0
    images = torch.rand(2, 1, 32, 32, generator=gen, dtype=torch.float64)
    tgt = torch.tensor([[BOS_ID, 5, 6, 7], [BOS_ID, 7, 8, 5]])
    out = model(images, tgt)
    assert out.naming.shape == out.logits.shape
    third = model.encoder.net[:6](images)  # conv, pool, conv, pool, conv, pool: the third stage at the grid
    read = model.name_read(third.flatten(2).transpose(1, 2))  # (B, L, D)
    expected = model.name_out(torch.einsum("btl,bld->btd", out.attention, read))
    torch.testing.assert_close(out.naming, expected)
    (grad,) = torch.autograd.grad(out.naming[:, 1:].logsumexp(-1).sum(), model.log_sigma)  # through the window
    assert grad.abs() > 0
    assert model.eval()(images, tgt).naming is None  # evaluation: the captions' own reading only
    with pytest.raises(ValueError, match="naming"):
        SoftCaptioner(**{**base, "glimpse": False, "glimpse_features": "grid"}, naming=True)
