"""Generation recorded through qkv's backend (qkv.integrations.generation) against ``eager``'s
``generate(output_attentions=True, return_dict_in_generate=True)``: the same tokens, and at every step the same
self- and cross-attention of the kept hypothesis, greedy, sampling and beam search, on tiny random GPT-2, Llama
(grouped-query), Qwen2, T5, Marian and BART models built from configs."""

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

import qkv.integrations.transformers as backend  # noqa: E402
from qkv.integrations.generation import record_generation  # noqa: E402
from qkv.integrations.transformers import register  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402


@pytest.fixture(autouse=True)
def _backend(one_thread):
    register()


def _prompt(gen, n=7):
    return torch.randint(len(hf.SPECIALS), hf.VOCAB, (1, n), generator=gen)


def _eager(name, ids, strategy, new, beams=3, seed=0):
    model = hf.model(name, "eager")
    if strategy == "sample":
        torch.manual_seed(seed)
    return model.generate(input_ids=ids, max_new_tokens=new, do_sample=strategy == "sample",
                          num_beams=beams if strategy == "beam" else 1, output_attentions=True,
                          return_dict_in_generate=True, pad_token_id=hf.PAD)


def _by(records, part, kind):
    """The records of one part (encoder / decoder) and kind, by layer."""
    def is_part(r):
        return ("encoder" in r.name) == (part == "encoder")
    return sorted([r for r in records if r.kind == kind and is_part(r)], key=lambda r: r.layer)


def _rows(s, beam_indices):
    return 0 if beam_indices is None else int(beam_indices[0, s])


CASES = [(name, s) for name in hf.GENERATORS for s in ("greedy", "beam")] + [("gpt2", "sample"), ("t5", "sample")]


@pytest.mark.parametrize("name,strategy", CASES)
def test_recorded_generation_equals_eager_at_every_step(name, strategy, gen):
    ids = _prompt(gen)
    new = 6
    ours = record_generation(hf.model(name, "qkv"), ids, max_new_tokens=new, strategy=strategy, beams=3, seed=3)
    eager = _eager(name, ids, strategy, new, seed=3)
    seq2seq = name in hf.SEQ2SEQ
    n = len(ours.generated)
    assert n >= 1 and len(ours.steps) == n
    assert torch.equal(ours.sequence, eager.sequences[0, :len(ours.sequence)])
    assert [s.token_id for s in ours.steps] == ours.generated.tolist()
    bi = getattr(eager, "beam_indices", None)
    t0 = ids.shape[1]
    dec_self = _by(ours.records, "decoder", "self")
    assert len(dec_self) == hf.config(name).num_hidden_layers if not seq2seq else len(dec_self) == 2
    for s in range(n):
        row = _rows(s, bi)
        assert ours.steps[s].beam == row
        eager_self = eager.decoder_attentions[s] if seq2seq else eager.attentions[s]
        for layer, r in enumerate(dec_self):
            e = eager_self[layer][row]  # (H, q, k)
            if seq2seq:
                got = r.weights[0, :, s:s + 1, :s + 1]
            elif s == 0:
                got = r.weights[0, :, :t0, :t0]
            else:
                got = r.weights[0, :, t0 - 1 + s:t0 + s, :t0 + s]
            torch.testing.assert_close(got, e.float(), atol=2e-6, rtol=1e-4)
            if s == 0 and not seq2seq:  # keys not there yet are zero
                assert not r.weights[0, :, :t0, t0:].any()
        if seq2seq:
            for layer, r in enumerate(_by(ours.records, "decoder", "cross")):
                torch.testing.assert_close(r.weights[0, :, s], eager.cross_attentions[s][layer][row, :, 0],
                                           atol=2e-6, rtol=1e-4)
    if seq2seq:
        for layer, r in enumerate(_by(ours.records, "encoder", "self")):
            torch.testing.assert_close(r.weights[0], eager.encoder_attentions[layer][0], atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("name,strategy", [("llama", "beam"), ("marian", "greedy")])
def test_weights_computed_a_few_rows_at_a_time_are_the_same(name, strategy, gen, monkeypatch):
    """A prompt's (and an encoder's) weights are computed in pieces of rows: pieces of 3 rows give the same."""
    ids = _prompt(gen, 8)
    whole = record_generation(hf.model(name, "qkv"), ids, max_new_tokens=4, strategy=strategy, beams=3)
    monkeypatch.setattr(backend, "RECORD_ROWS", 3)
    pieces = record_generation(hf.model(name, "qkv"), ids, max_new_tokens=4, strategy=strategy, beams=3)
    assert torch.equal(whole.sequence, pieces.sequence) and len(whole.records) == len(pieces.records)
    for a, b in zip(whole.records, pieces.records, strict=True):
        assert a.name == b.name
        torch.testing.assert_close(a.weights, b.weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_steps_carry_the_probability_of_the_chosen_token(name, gen):
    ids = _prompt(gen)
    model = hf.model(name, "qkv")
    ours = record_generation(model, ids, max_new_tokens=4, strategy="greedy", top=3)
    seq = ours.sequence[None]
    with torch.no_grad():  # the model run by hand on the produced sequence gives the same distributions
        if name in hf.SEQ2SEQ:
            logits = model(input_ids=ids, decoder_input_ids=seq[:, :-1]).logits[0]
        else:
            logits = model(input_ids=seq[:, :-1]).logits[0, ids.shape[1] - 1:]
    p = logits.softmax(-1)
    for s, step in enumerate(ours.steps):
        assert step.probability == pytest.approx(p[s, step.token_id].item(), abs=1e-5)
        assert step.top[0][0] == step.token_id  # greedy: the most probable
        assert [i for i, _ in step.top] == p[s].topk(3).indices.tolist()


@pytest.mark.parametrize("name", ["llama", "marian"])
def test_only_the_layers_and_heads_asked_for_are_computed(name, gen, monkeypatch):
    ids = _prompt(gen)
    full = record_generation(hf.model(name, "qkv"), ids, max_new_tokens=4)
    shapes, rebuilt = [], []
    real = backend.attention
    monkeypatch.setattr(backend, "attention", lambda q, *a, **kw: (
        shapes.append((q.shape[1], kw["return_weights"])), real(q, *a, **kw))[1])
    real_fused = backend.fused_and_record

    def fused(recorder, module, *args):  # the weights rebuilt from the fused kernel's log-sum-exp
        out = real_fused(recorder, module, *args)
        if out is not None:
            rebuilt.append(len(args[-1]))
        return out

    monkeypatch.setattr(backend, "fused_and_record", fused)
    part = record_generation(hf.model(name, "qkv"), ids, max_new_tokens=4, layers=[1], heads=[0, 2])
    assert torch.equal(part.sequence, full.sequence)
    assert {r.layer for r in part.records} == {1}
    assert all(r.weights.shape[1] == 2 for r in part.records)
    for r in part.records:
        twin = next(f for f in full.records if f.name == r.name)
        torch.testing.assert_close(r.weights, twin.weights[:, [0, 2]], atol=1e-6, rtol=1e-5)
    weights_calls = [h for h, want in shapes if want] + rebuilt
    assert weights_calls and set(weights_calls) == {2}  # weights for 2 heads of one layer only
    assert rebuilt  # on the CPU, from the fused kernel's log-sum-exp
    fused_calls = [h for h, want in shapes if not want] + rebuilt  # every module's output, on the fused path
    assert len(weights_calls) * 2 == len(fused_calls)  # 2 layers: one in two modules' weights computed


@pytest.mark.parametrize("given,match", [(dict(layers=[5]), "layers 5"), (dict(heads=[4]), "heads 4"),
                                         (dict(max_new_tokens=0), "generate"), (dict(strategy="nope"), "strategy"),
                                         (dict(layers=[]), "layers")])
def test_bad_selection_is_a_one_line_error(given, match, gen):
    args = {"max_new_tokens": 3, **given}
    with pytest.raises(ValueError, match=match) as e:
        record_generation(hf.model("gpt2", "qkv"), _prompt(gen), **args)
    assert "\n" not in str(e.value)


def test_a_model_without_a_generation_head_is_refused(gen):
    with pytest.raises(ValueError, match="generat"):
        record_generation(hf.model("bert", "qkv"), _prompt(gen), max_new_tokens=3)


@pytest.mark.parametrize("name", list(hf.MODELS))
def test_one_forward_recorded_equals_the_capture(name, gen):
    """record_forward (what qkv view records of one text) gives the weights qkv.capture_attention gives, for the
    layers and heads asked for only."""
    import qkv
    from qkv.integrations.generation import record_forward

    model = hf.model(name, "qkv")
    x = hf.inputs(name, False, gen)
    with torch.no_grad(), qkv.capture_attention(model) as captured:
        model(**x)
    got = record_forward(model, **x)
    assert [r.name for r in got] == [r.name for r in captured] or sorted(r.name for r in got) == \
        sorted(r.name for r in captured)
    by_name = {r.name: r for r in captured}
    for r in got:
        c = by_name[r.name]
        assert r.kind == c.kind
        torch.testing.assert_close(r.weights, c.weights[:1], atol=1e-6, rtol=1e-5)
    part = record_forward(model, layers=[1], heads=[3], **x)
    assert part and all(r.weights.shape[1] == 1 for r in part)
    for r in part:
        torch.testing.assert_close(r.weights[0, 0], by_name[r.name].weights[0, 3], atol=1e-6, rtol=1e-5)
