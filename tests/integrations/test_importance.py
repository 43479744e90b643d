"""Which heads matter: head importance against a brute-force ablation by hooks on each attention's output
projection (one forward pass per head, transformers' own eager attention), value-weighted maps against the float64
formula, attention x gradient against eager attention's weights and their gradient."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

from qkv.integrations.importance import (  # noqa: E402
    attention_gradient,
    head_importance,
    objective_of,
    value_weighted,
    value_weighted_records,
)
from tests.integrations import hf_models as hf  # noqa: E402

#: the input of each model's output projection of attention (heads side by side: (B, T, H * D))
PROJECTIONS = {"gpt2": "attn.c_proj", "llama": "self_attn.o_proj", "bert": "attention.output.dense"}


def _ids(t: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(len(hf.SPECIALS), hf.VOCAB, (1, t), generator=torch.Generator().manual_seed(seed))


def _loss(model, name, ids, masked=None) -> float:
    with torch.no_grad():
        if name == "bert":
            x = torch.where(masked, hf.SPECIALS.index("<unk>"), ids)
            logits = model(input_ids=x).logits[0].double()
            return float(torch.nn.functional.cross_entropy(logits[masked], ids[0][masked]))
        logits = model(input_ids=ids).logits[0].double()
        return float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]))


def _brute_force(model, name, ids, masked=None) -> torch.Tensor:
    """One forward pass per head on eager attention, that head's slice of the output projection's input zeroed."""
    config = model.config
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    width = config.hidden_size // heads
    base = _loss(model, name, ids, masked)
    out = torch.zeros(layers, heads, dtype=torch.float64)
    projections = [m for n, m in model.named_modules() if n.endswith(PROJECTIONS[name])]
    assert len(projections) == layers
    for layer in range(layers):
        for head in range(heads):
            def zero(module, args, h=head):
                x = args[0].clone()
                x[..., h * width:(h + 1) * width] = 0
                return (x,)

            handle = projections[layer].register_forward_pre_hook(zero)
            try:
                out[layer, head] = _loss(model, name, ids, masked) - base
            finally:
                handle.remove()
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_head_importance_equals_one_ablation_per_head_by_hooks(name, batch):
    model = hf.model(name, "eager").double()
    ids = _ids()
    masked = None
    if name == "bert":
        masked = torch.zeros(ids.shape[1], dtype=torch.bool)
        masked[[2, 5, 9]] = True
    got = head_importance(model, ids, mask_token_id=hf.SPECIALS.index("<unk>"), masked=masked, batch=batch)
    want = _brute_force(model, name, ids, masked)
    assert got.shape == (model.config.num_hidden_layers, model.config.num_attention_heads)
    assert want.abs().max() > 1e-4  # the heads matter to this random model: the comparison can fail
    torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=1e-6)  # (float32 output)
    assert model.config._attn_implementation == "eager"  # put back as it was


def test_head_importance_in_float32_is_within_1e_5_of_float64():
    model = hf.model("llama", "eager")
    ids = _ids(20, seed=3)
    got = head_importance(model, ids, batch=5)
    want = head_importance(model.double(), ids, batch=8)
    torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=0)


def test_a_classifier_is_measured_on_its_predicted_class_or_the_label_given():
    import transformers as tf

    torch.manual_seed(0)
    config = hf.config("bert")
    config.num_labels = 3
    model = tf.BertForSequenceClassification(config).eval().double()
    ids = _ids()
    predicted = int(model(input_ids=ids).logits.argmax())
    auto = head_importance(model, ids)
    given = head_importance(model, ids, labels=predicted)
    other = head_importance(model, ids, labels=(predicted + 1) % 3)
    torch.testing.assert_close(auto, given)
    assert not torch.allclose(auto, other)


def test_models_without_a_loss_are_refused_in_one_line():
    import transformers as tf

    bare = tf.BertModel(hf.config("bert")).eval()
    with pytest.raises(ValueError, match="no language-model or classification head"):
        head_importance(bare, _ids())
    with pytest.raises(ValueError, match="encoder-decoder"):
        objective_of(hf.model("bart", "eager"))
    with pytest.raises(ValueError, match="mask_token_id"):
        head_importance(hf.model("bert", "eager"), _ids())
    with pytest.raises(ValueError, match=r"\(1, T\)"):
        head_importance(hf.model("gpt2", "eager"), _ids()[0])


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_value_weighted_maps_equal_the_float64_formula(name):
    model = hf.model(name, "eager")
    ids = _ids(10, seed=1)
    records, weighted = value_weighted_records(model, input_ids=ids)
    assert len(weighted) == len(records) == model.config.num_hidden_layers
    # the reference: eager attention's weights and the values computed from the hidden states, in float64
    model64 = hf.model(name, "eager").double()
    values = []
    hooks = []
    for n, m in model64.named_modules():
        if n.endswith(("attn.c_attn", "self_attn.v_proj", "attention.self.value")):
            def grab(module, args, out, n=n):
                v = out[..., 2 * out.shape[-1] // 3:] if n.endswith("c_attn") else out
                values.append(v)
            hooks.append(m.register_forward_hook(grab))
    with torch.no_grad():
        att = model64(input_ids=ids, output_attentions=True).attentions
    for h in hooks:
        h.remove()
    heads, kv = model.config.num_attention_heads, getattr(model.config, "num_key_value_heads", None)
    kv = kv or heads
    for layer, (a, v, got) in enumerate(zip(att, values, weighted, strict=True)):
        v = v[0].reshape(v.shape[1], kv, -1).transpose(0, 1).norm(dim=-1)  # (Hkv, T)
        v = v.repeat_interleave(heads // kv, dim=0)
        want = a[0] * v[:, None, :]
        want = want / want.sum(-1, keepdim=True)
        assert got.name == f"value-weighted {records[layer].name}"
        torch.testing.assert_close(got.weights[0].double(), want, atol=2e-6, rtol=1e-4)
        assert not torch.allclose(got.weights[0].double(), a[0], atol=1e-3)  # the norms change the map


def test_value_weighted_refuses_shapes_that_do_not_fit_and_keeps_empty_rows_zero():
    w = torch.softmax(torch.randn(2, 3, 4, 5, dtype=torch.float64), -1)
    w[0, 0, 1] = 0
    n = torch.rand(2, 3, 5, dtype=torch.float64) + 0.1
    out = value_weighted(w, n)
    assert (out[0, 0, 1] == 0).all()
    ref = w * n[..., None, :]
    ref = ref / ref.sum(-1, keepdim=True)
    torch.testing.assert_close(out[0, 0, 0], ref[0, 0, 0])
    torch.testing.assert_close(value_weighted(w, n, normalize=False), w * n[..., None, :])
    with pytest.raises(ValueError, match="value_norms"):
        value_weighted(w, n[..., :4])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attention_gradient_equals_eager_weights_times_their_gradient(name):
    model = hf.model(name, "eager").double()
    ids = _ids(9, seed=2)
    got, token = attention_gradient(model, ids, position=5)
    out = model(input_ids=ids, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    logp = torch.log_softmax(out.logits[0, 5], -1)
    assert token == int(logp.argmax())
    logp[token].backward()
    for g, a in zip(got, out.attentions, strict=True):
        torch.testing.assert_close(g.double(), (a * a.grad)[0], atol=1e-8, rtol=1e-6)
    assert any(g.abs().max() > 1e-6 for g in got)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_the_layers_below_the_ablated_one_are_kept_not_run_again(name):
    from qkv.integrations import importance

    model = hf.model(name, "eager").double()
    names = {m: n for n, m in model.named_modules()}
    assert sorted(importance._Prefix(model, names).blocks) == list(range(model.config.num_hidden_layers))
    calls = []
    real = importance._Ablation.__call__
    importance._Ablation.__call__ = lambda self, module, value: (calls.append(value.shape[0]),
                                                                 real(self, module, value))[1]
    try:
        kept = head_importance(model, _ids(), mask_token_id=3, batch=4)
        n_kept = len(calls)
        calls.clear()
        every = head_importance(model, _ids(), mask_token_id=3, batch=4, reuse=False)
    finally:
        importance._Ablation.__call__ = real
    torch.testing.assert_close(kept, every, atol=1e-7, rtol=1e-6)
    layers = model.config.num_hidden_layers
    assert len(calls) == layers * layers and n_kept == layers * (layers + 1) // 2  # one batch per layer here
