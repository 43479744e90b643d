"""Hostile Hugging Face model directories given to ``qkv view DIR``: every damage ends in one line naming the file
(or the option), exit 2, and nothing written; texts longer than the model's positions are cut at the model's own
limit and the cut is said on stderr and on the page; random bytes in every file of the directory never give a
traceback."""

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

from qkv.cli import main  # noqa: E402
from qkv.integrations.hf_load import load_model  # noqa: E402
from qkv.integrations.transformers import register  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402

FUZZ = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    register()
    root = tmp_path_factory.mktemp("hostile")
    for name in ("gpt2", "llama", "bert", "t5"):
        hf.save(name, root / name)
    return root


def _copy(saved, name, tmp_path, *, drop=()) -> Path:
    d = tmp_path / name
    shutil.copytree(saved / name, d)
    for f in drop:
        for p in d.glob(f):
            p.unlink()
    return d


def _view(d, capsys, *args, text="the cat sat on the mat"):
    out = d.parent / "page.html"
    code = main(["view", str(d), text, "--out", str(out), "--device", "cpu", *args])
    captured = capsys.readouterr()
    return code, captured, out


def _one_line_error(code, captured, out, *needles):
    err = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(err) == 1 and err[0].startswith("qkv: error:"), err
    for n in needles:
        assert str(n) in err[0], err[0]
    assert "Traceback" not in captured.err and not out.exists()
    return err[0]


def _config(d) -> dict:
    return json.loads((d / "config.json").read_text())


def _write_config(d, **changes):
    c = _config(d)
    c.update(changes)
    (d / "config.json").write_text(json.dumps(c))


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_a_directory_without_tokenizer_files_is_an_error(saved, name, tmp_path, capsys):
    d = _copy(saved, name, tmp_path, drop=["tokenizer*", "vocab*", "special_tokens_map.json", "merges.txt"])
    _one_line_error(*_view(d, capsys), str(d), "tokenizer")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_config_that_does_not_fit_the_weights_names_config_json(saved, name, tmp_path, capsys):
    d = _copy(saved, name, tmp_path)
    _write_config(d, **({"n_embd": 64} if name == "gpt2" else {"intermediate_size": 96}))
    _one_line_error(*_view(d, capsys), "config.json", "does not fit")


def test_more_layers_in_the_config_than_in_the_weights_names_config_json(saved, tmp_path, capsys):
    d = _copy(saved, "llama", tmp_path)
    _write_config(d, num_hidden_layers=3)
    _one_line_error(*_view(d, capsys), "config.json", "missing")


@pytest.mark.parametrize("cut", [0.0, 0.001, 0.5, 0.999])
def test_a_truncated_or_damaged_safetensors_file_is_named(saved, cut, tmp_path, capsys):
    d = _copy(saved, "gpt2", tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:int(len(data) * cut)])
    _one_line_error(*_view(d, capsys), "model.safetensors")


def test_a_damaged_safetensors_header_is_named(saved, tmp_path, capsys):
    d = _copy(saved, "gpt2", tmp_path)
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:40] = b"#" * 32
    f.write_bytes(bytes(data))
    _one_line_error(*_view(d, capsys), "model.safetensors")


@pytest.mark.parametrize("damage", ["unknown", "not json", "no type", "bad value"])
def test_a_bad_config_json_is_named(saved, damage, tmp_path, capsys):
    d = _copy(saved, "gpt2", tmp_path)
    if damage == "unknown":
        _write_config(d, model_type="no-such-model")
    elif damage == "not json":
        (d / "config.json").write_text('{"model_type": "gpt2", ')
    elif damage == "no type":
        c = _config(d)
        del c["model_type"]
        (d / "config.json").write_text(json.dumps(c))
    else:
        _write_config(d, n_head=5)  # 32 is not a multiple of 5
    line = _one_line_error(*_view(d, capsys), "config.json")
    if damage == "unknown":
        assert "no-such-model" in line


def test_a_saved_causal_lm_loads_without_transformers_load_report(saved, capsys, caplog):
    code, captured, out = _view(saved / "llama", capsys)
    assert code == 0 and out.is_file()
    assert "LOAD REPORT" not in captured.err + captured.out and "lm_head" not in captured.err
    assert captured.err.strip() == ""


def test_pickled_weights_only_is_refused(saved, tmp_path, capsys):
    d = _copy(saved, "gpt2", tmp_path, drop=["*.safetensors"])
    (d / "pytorch_model.bin").write_bytes(b"never unpickled")
    _one_line_error(*_view(d, capsys), "safetensors")


def _page_tokens(out) -> list[str]:
    data = json.loads(re.search(r'id="qkv-data">(.*?)</script>', out.read_text(encoding="utf-8"), re.S).group(1))
    return data, data["tokens"]


@pytest.mark.parametrize("name,field,limit", [("gpt2", "n_positions", 40), ("llama", "max_position_embeddings", 33),
                                              ("bert", "max_position_embeddings", 30)])
def test_a_long_text_is_cut_at_the_models_own_limit_and_said(saved, name, field, limit, tmp_path, capsys, caplog):
    d = _copy(saved, name, tmp_path)
    _write_config(d, **{field: limit})  # the weights of the positions: only GPT-2 and BERT have them
    if name in ("gpt2", "bert"):
        from safetensors.torch import load_file, save_file
        w = load_file(d / "model.safetensors")
        key = next(k for k in w if "wpe" in k or "position_embeddings" in k)
        w[key] = w[key][:limit].clone()
        save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    text = " ".join(hf.WORDS * 4)  # 76 words
    code, captured, out = _view(d, capsys, text=text)
    assert code == 0, captured.err
    data, tokens = _page_tokens(out)
    assert len(tokens["tokens"]) == limit
    said = captured.err + caplog.text  # the warning is logged (the command line's handler writes it to stderr)
    assert f"cut to the first {limit}" in said and field in said
    assert any(f"cut to the first {limit}" in n for n in data["notes"])


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_model_with_more_positions_than_the_text_needs_is_not_cut(saved, name, tmp_path, capsys, caplog):
    """64 positions (GPT-2) or relative positions (T5): a 60-word text is whole, with no word of a cut."""
    text = " ".join((hf.WORDS * 4)[:60])
    code, captured, out = _view(saved / name, capsys, *(["--generate", "2"] if name == "t5" else []), text=text)
    assert code == 0, captured.err
    data, tokens = _page_tokens(out)
    words = tokens["tokens"] if name == "gpt2" else tokens["source"]
    assert len([t for t in words if t in hf.WORDS]) == 60
    assert "cut" not in captured.err + caplog.text and not any("cut" in n for n in data["notes"])


def test_a_text_beyond_a_fixed_512_tokens_is_not_cut_when_the_model_takes_it(tmp_path, capsys):
    import transformers as tf

    cfg = hf.config("gpt2")
    cfg.n_positions = 1024
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "m")
    hf.tokenizer().save_pretrained(tmp_path / "m")
    text = " ".join((hf.WORDS * 40)[:700])
    code, captured, out = _view(tmp_path / "m", capsys, "--generate", "1", "--layers", "0", "--heads", "0", text=text)
    assert code == 0, captured.err
    data, tokens = _page_tokens(out)
    assert len(tokens["tokens"]) == 700  # the whole prompt (the one generated token is not fed back)
    assert "cut" not in captured.err


def test_register_refuses_an_unknown_score_at_once():
    with pytest.raises(ValueError, match="no-such-score") as e:
        register("qkv-bad-score", score="no-such-score")
    assert "scaled_dot" in str(e.value) and "cosine" in str(e.value)
    with pytest.raises(ValueError, match="normalize"):
        register("qkv-bad-norm", normalize="nope")


FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize("file", FILES)
@FUZZ
@given(data=st.binary(max_size=200), cut=st.none() | st.floats(0.0, 1.0))
def test_random_bytes_in_any_file_of_the_directory_end_cleanly(saved, file, data, cut, tmp_path_factory):
    """Random bytes, or a truncation, in any one file: the model loads (a harmless file) or one ValueError names
    a file of the directory; never another exception."""
    d = tmp_path_factory.mktemp("fuzz") / "gpt2"
    shutil.copytree(saved / "gpt2", d)
    f = d / file
    f.write_bytes(data if cut is None else f.read_bytes()[:int(cut * f.stat().st_size)])
    try:
        load_model(d, "cpu")
    except ValueError as e:
        assert "\n" not in str(e) and str(d) in str(e), str(e)
