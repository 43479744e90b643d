"""qkv as the attention backend of Hugging Face models (qkv.integrations.transformers), offline on tiny random
models made from configs (tests/integrations/hf_models.py): BERT, GPT-2, Llama (grouped-query), Mistral (sliding
window), Gemma 2 (soft-capping) and BART (cross-attention).

The reference is the same model on transformers' ``eager`` implementation; tolerances are tied to eager's own
error against the model run in float64 where that run is finite (the Llama family softmaxes float64 scores in
float32, so a fully masked padding row becomes NaN and reaches every row; there, a fixed float32 tolerance).
"""

import copy
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

import qkv  # noqa: E402
from qkv.integrations.transformers import attention_kind, register, registered  # noqa: E402
from qkv.integrations.transformers_view import is_hf_model_dir, view_page_input  # noqa: E402
from qkv.viz.page import save_attention_page  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402

NAMES = list(hf.MODELS)
from tests import ROOT  # noqa: E402


@pytest.fixture(autouse=True)
def _backend(one_thread):
    register()


def _real_rows(name: str, field: str, x: dict) -> torch.Tensor:
    """``(B, T)`` True at the positions of real tokens of the sequence a field's rows (queries) belong to."""
    if name == "bart" and field.startswith(("decoder", "cross", "logits")):
        return torch.ones_like(x["decoder_input_ids"], dtype=torch.bool)
    return x["attention_mask"].bool()


def _fields(out) -> dict[str, list[torch.Tensor]]:
    """The tensors of a model output to compare: logits, hidden states and attentions of every layer."""
    got = {}
    for k, v in out.items():
        if isinstance(v, torch.Tensor):
            got[k] = [v]
        elif isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v):
            got[k] = list(v)
    return got


def _rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of real tokens: ``(B, T, ...)`` -> ``(n, ...)``; attentions ``(B, H, T, Tk)`` -> ``(n, H, Tk)``."""
    return t.transpose(1, 2)[rows] if t.dim() == 4 else t[rows]


def _run(model, impl: str, x: dict, **kw):
    model.set_attn_implementation(impl)
    return _fields(model(**x, output_attentions=True, output_hidden_states=True, **kw))


def _assert_like_eager(name, ours, eager, ref, x):
    assert ours.keys() == eager.keys() and len(ours) >= 3
    for field in ours:
        assert len(ours[field]) == len(eager[field]), field
        rows = _real_rows(name, field, x)
        for i, (a, e, r) in enumerate(zip(ours[field], eager[field], ref[field], strict=True)):
            a, e, r = _rows(a, rows), _rows(e, rows), _rows(r, rows)
            assert a.shape == e.shape
            if not torch.isfinite(r).all():  # eager's float64 softmax of a fully masked row (padding) is NaN, and
                torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)  # 0 * NaN reaches the real rows: float32
                continue
            bound = 4 * (e.double() - r).abs().max().item() + 1e-6
            err = (a.double() - r).abs().max().item()
            assert err <= bound, f"{name} {field}[{i}]: qkv is {err:.2e} from float64, eager {bound:.2e}"


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", NAMES)
def test_hidden_states_and_attentions_equal_eager(name, padded, gen):
    model = hf.model(name, "qkv")
    x = hf.inputs(name, padded, gen)
    ref_model = copy.deepcopy(model).double()
    with torch.no_grad():
        ours = _run(model, "qkv", x)
        eager = _run(model, "eager", x)
        ref = _run(ref_model, "eager", x)
    _assert_like_eager(name, ours, eager, ref, x)
    n_att = sum(len(v) for k, v in ours.items() if k.endswith("attentions"))
    layers = model.config.num_hidden_layers if name != "bart" else 3 * model.config.encoder_layers
    assert n_att == layers


@pytest.mark.parametrize("name", NAMES)
def test_without_output_attentions_the_fused_path_gives_no_weights(name, gen, monkeypatch):
    """The weights are only computed when the model asks for them."""
    import qkv.integrations.transformers as backend

    asked = []
    real = backend.attention
    monkeypatch.setattr(backend, "attention", lambda *a, **kw: asked.append(kw["return_weights"]) or real(*a, **kw))
    model = hf.model(name, "qkv")
    with torch.no_grad():
        out = model(**hf.inputs(name, True, gen))
    assert asked and not any(asked)
    assert out.get("attentions") is None


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "gemma2", "bart"])
def test_greedy_generation_with_the_cache_gives_eager_tokens(name, gen):
    model = hf.model(name, "qkv")
    x = hf.inputs(name, True, gen)
    x.pop("decoder_input_ids", None)
    args = dict(max_new_tokens=8, do_sample=False, num_beams=1, use_cache=True, pad_token_id=hf.PAD)
    with torch.no_grad():
        ours = model.generate(**x, **args)
        model.set_attn_implementation("eager")
        eager = model.generate(**x, **args)
    assert ours.shape[1] > x["input_ids"].shape[1] or name == "bart"
    assert torch.equal(ours, eager)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_eager_in_a_training_step(name, gen):
    x = hf.inputs(name, True, gen)
    labels = (x["decoder_input_ids"] if name == "bart" else x["input_ids"]).clone()
    if name != "bart":  # no loss at padding (a padding query of a decoder sees no key: zeros, not eager's mean),
        pad = x["attention_mask"] == 0  # nor at the first token, predicted from the last padding position
        labels[pad | torch.nn.functional.pad(pad[:, :-1], (1, 0))] = -100
    grads = {}
    for impl in ("qkv", "eager"):
        model = hf.model(name, impl).train()  # the same seed: the same weights
        loss = model(**x, labels=labels).loss
        loss.backward()
        grads[impl] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    assert grads["qkv"].keys() == grads["eager"].keys() and grads["qkv"]
    for k, g in grads["qkv"].items():
        torch.testing.assert_close(g, grads["eager"][k], atol=1e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_capture_records_every_layer_and_head(name, gen):
    model = hf.model(name, "qkv")
    x = hf.inputs(name, False, gen)
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(**x, output_attentions=True)
        model.set_attn_implementation("qkv")
        with qkv.capture_attention(model) as records:
            model(**x)
    expected = [("encoder_attentions", "self"), ("decoder_attentions", "self"), ("cross_attentions", "cross")] \
        if name == "bart" else [("attentions", "self")]
    want = [(f, kind, w) for f, kind in expected for w in eager[f]]
    by_kind = {kind: [r for r in records if r.kind == kind] for kind in ("self", "cross")}
    assert len(records) == len(want)
    for kind in ("self", "cross"):
        assert len(by_kind[kind]) == sum(k == kind for _, k, _ in want), [(r.name, r.kind) for r in records]
    for r, (_, kind, w) in zip(records if name != "bart" else _bart_order(records), want, strict=True):
        assert r.kind == kind and r.weights.shape == w.shape == (2, model.config.num_attention_heads
                                                                  if name != "bart" else 4, *w.shape[2:])
        torch.testing.assert_close(r.weights, w, atol=1e-5, rtol=1e-4)
    if name == "bart":
        assert {r.name for r in by_kind["cross"]} == {f"model.decoder.layers.{i}.encoder_attn" for i in range(2)}


def _bart_order(records):
    """Encoder self-attention, then decoder self-attention, then cross-attention, each by layer."""
    def key(r):
        return ("decoder" in r.name) + (r.kind == "cross"), r.layer
    return sorted(records, key=key)


def test_attention_kind_of_the_modules():
    bart = hf.model("bart", "qkv")
    kinds = {n: attention_kind(m) for n, m in bart.named_modules() if type(m).__name__ == "BartAttention"}
    assert {n for n, k in kinds.items() if k == "cross"} == {f"model.decoder.layers.{i}.encoder_attn"
                                                              for i in range(2)}
    assert all(m.attention_kind == kinds[n] for n, m in bart.named_modules() if n in kinds)
    llama = hf.model("llama", "qkv")
    assert {attention_kind(layer.self_attn) for layer in llama.model.layers} == {"self"}


def test_unsupported_arguments_are_errors_naming_them(gen):
    model = hf.model("llama", "qkv")
    fn = transformers.AttentionInterface._global_mapping["qkv"]
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 8, generator=gen)
    kv = torch.randn(1, 2, 5, 8, generator=gen)
    for name, value in [("s_aux", torch.zeros(4)), ("cu_seq_lens_q", torch.tensor([0, 5])),
                        ("something_new", 3)]:
        with pytest.raises(ValueError, match=re.escape(f"{name}=")):
            fn(attn, q, kv, kv, None, scaling=0.35, **{name: value})
    out, w = fn(attn, q, kv, kv, None, scaling=0.35, position_ids=torch.arange(5)[None], use_cache=True)
    assert out.shape == (1, 5, 4, 8) and w is None
    with pytest.raises(ValueError, match="H a multiple of Hkv"):
        fn(attn, torch.randn(1, 3, 5, 8), kv, kv, None)


def test_register_is_idempotent_and_keeps_transformers_names():
    assert register() == register() == "qkv"
    assert "qkv" in registered()
    for name in ("sdpa", "eager", "flex_attention", ""):
        with pytest.raises(ValueError, match="new attention name"):
            register(name)
    with pytest.raises(ValueError, match="scale"):
        register("qkv-bad", scale=-1.0)


def test_another_score_through_a_registered_name(gen):
    """register(NAME, score=...) runs the model's attention with that score: the module's call is qkv.attention
    with the score and scale given, on the repeated grouped heads."""
    name = register("qkv-cosine", score="cosine", scale=10.0)
    fn = transformers.AttentionInterface._global_mapping[name]
    attn = hf.model("llama", "qkv").model.layers[0].self_attn
    q, k, v = torch.randn(2, 4, 6, 8, generator=gen), torch.randn(2, 2, 6, 8, generator=gen), \
        torch.randn(2, 2, 6, 8, generator=gen)
    out, w = fn(attn, q, k, v, None, scaling=0.35, output_attentions=True)
    rep = (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    want, want_w = qkv.attention(q, *rep, score="cosine", scale=10.0, is_causal=True, return_weights=True,
                                 impl="reference")
    torch.testing.assert_close(out, want.transpose(1, 2))
    torch.testing.assert_close(w, want_w)
    model = hf.model("llama", name)
    x = hf.inputs("llama", True, gen)
    with torch.no_grad():
        other = model(**x).logits
        model.set_attn_implementation("qkv")
        assert not torch.allclose(other, model(**x).logits)


def test_a_mask_modifier_makes_llama_a_mistral(gen):
    """Llama with register(mask_mod=qkv.mods.sliding_window(4)) is Mistral with sliding_window=4 (same weights),
    with and without padding, also when generating with the cache."""
    name = register("qkv-window4", mask_mod=qkv.mods.sliding_window(4))
    llama = hf.model("llama", name)
    mistral = hf.model("mistral", "eager")
    mistral.load_state_dict(llama.state_dict())
    for padded in (False, True):
        x = hf.inputs("llama", padded, gen)
        with torch.no_grad():
            a, b = llama(**x).logits, mistral(**x).logits
        rows = x["attention_mask"].bool()
        torch.testing.assert_close(a[rows], b[rows], atol=1e-5, rtol=1e-4)
    args = dict(max_new_tokens=6, do_sample=False, pad_token_id=hf.PAD)
    with torch.no_grad():
        assert torch.equal(llama.generate(**x, **args), mistral.generate(**x, **args))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every test model saved with save_pretrained, with its tokenizer: {name: directory}."""
    register()
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in NAMES:
        out[name] = root / name
        hf.save(name, out[name])
    return out


def test_is_hf_model_dir(saved, tmp_path):
    assert all(is_hf_model_dir(p) for p in saved.values())
    assert not is_hf_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert not is_hf_model_dir(tmp_path)
    (tmp_path / "config.json").write_text('{"task": "translate"}')
    assert not is_hf_model_dir(tmp_path)
    assert not is_hf_model_dir(tmp_path / "missing")


@pytest.mark.parametrize("name", NAMES)
def test_view_writes_the_page_of_a_saved_model(name, saved, tmp_path):
    view = view_page_input(saved[name], "the big cat sat on a red mat", device="auto" if name == "gpt2" else "cpu")
    kinds = {r.kind for r in view.records}
    assert kinds == ({"self", "cross"} if name == "bart" else {"self"})
    layers = hf.config(name).num_hidden_layers
    assert len(view.records) == (3 * 2 if name == "bart" else layers)
    if name == "bart":
        assert view.tokens["source"][:3] == ["the", "big", "cat"]
        assert all(r.weights.shape[-2] == len(view.tokens["target"]) for r in view.records if "decoder" in r.name)
    else:
        assert view.tokens[:3] == ["the", "big", "cat"] or view.tokens[1:4] == ["the", "big", "cat"]
    page = save_attention_page(tmp_path / f"{name}.html", view.records, **view.page_kwargs())
    text = page.read_text(encoding="utf-8")
    assert "qkv-data" in text and "the big cat" in text
    with pytest.raises(ValueError, match="text"):
        view_page_input(saved[name], "  ")


def test_view_refuses_pickled_weights(saved, tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    for f in Path(saved["gpt2"]).iterdir():
        if not f.name.endswith(".safetensors"):
            (d / f.name).write_bytes(f.read_bytes())
    (d / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="safetensors"):
        view_page_input(d, "the cat")


def test_the_generation_page_examples_run(tmp_path, monkeypatch):
    """The Python blocks of docs/generation.md run as written, on a tiny GPT-2 saved as ``my-gpt2``."""
    text = (ROOT / "docs" / "generation.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    hf.save("gpt2", tmp_path / "my-gpt2")
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/generation.md[block {i}]", "exec"), {"__name__": "docs"})
    assert (tmp_path / "gen.html").is_file()


def test_t5_position_bias_equals_eager(gen):
    """T5 passes its relative position bias as position_bias: it joins the mask (padded encoder input)."""
    cfg = transformers.T5Config(vocab_size=hf.VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=hf.PAD, pad_token_id=hf.PAD,
                                eos_token_id=hf.EOS)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="qkv").eval()
    x = hf.inputs("bart", True, gen)
    out = {}
    with torch.no_grad():
        for impl in ("qkv", "eager"):
            model.set_attn_implementation(impl)
            out[impl] = (_fields(model(**x, output_attentions=True)),
                         model.generate(input_ids=x["input_ids"], attention_mask=x["attention_mask"],
                                        max_new_tokens=6, do_sample=False))
    ours, eager = out["qkv"][0], out["eager"][0]
    assert len(ours["cross_attentions"]) == 2
    for field in ("logits", "encoder_attentions", "decoder_attentions", "cross_attentions"):
        for a, e in zip(ours[field], eager[field], strict=True):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-5)
    assert torch.equal(out["qkv"][1], out["eager"][1])


@pytest.mark.parametrize("name", ["bert", "bart"])
def test_qkv_view_takes_a_hugging_face_directory(saved, name, tmp_path, capsys):
    """`qkv view DIR "text"`: a saved Hugging Face model gets the same page as a qkv run (every layer; BART's
    cross-attention too); what it cannot take is a one-line error."""
    from qkv.cli import main

    out = tmp_path / "page"
    assert main(["view", str(saved[name]), "the cat sat on the mat", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}.html" in printed and (tmp_path / "page.html").is_file()
    import json
    import re

    text = (tmp_path / "page.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="qkv-data">(.*?)</script>', text, re.S).group(1))
    kinds = {r["kind"] for r in data["records"]}
    assert "self" in kinds and ("cross" in kinds) == (name == "bart")
    assert main(["view", str(saved[name]), "--index", "0", "--out", str(out)]) == 2
    assert "texts only" in capsys.readouterr().err
