"""Hugging Face models by their hub id, resolved offline from a hub-layout cache the tests write
(``models--org--name/snapshots/<hash>/``, ``refs/<branch>``), with ``HF_HUB_OFFLINE=1``: nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")
pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (pip install 'qkv[hf]')")

from qkv.cli import main  # noqa: E402
from qkv.integrations.hf_load import load_model  # noqa: E402
from qkv.integrations.hub import ALLOW_PATTERNS, is_hub_id, resolve_model  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402

MAIN = "a" * 40
TAGGED = "b" * 40


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-models")
    for name in ("gpt2", "llama", "bert"):
        hf.save(name, root / name)
    return root


def _put(cache: Path, repo: str, folder: Path, commit: str, *refs: str) -> Path:
    """``folder`` as the snapshot ``commit`` of ``repo`` in the hub cache ``cache``, named by ``refs``."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    shutil.copytree(folder, snap)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (base / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "hf-home" / "hub"
    c.mkdir(parents=True)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return c


def _view(name, tmp_path, capsys, *args, text="the cat sat on the mat"):
    out = tmp_path / "page.html"
    code = main(["view", name, text, "--out", str(out), "--device", "cpu", *args])
    return code, capsys.readouterr(), out


def _one_line_error(code, captured, out, *needles) -> str:
    err = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(err) == 1 and err[0].startswith("qkv: error:"), err
    for n in needles:
        assert str(n) in err[0], err[0]
    assert "Traceback" not in captured.err and not out.exists()
    return err[0]


def _page_json(out: Path) -> dict:
    text = out.read_text(encoding="utf-8")
    start = text.index('id="qkv-data">') + len('id="qkv-data">')
    return json.loads(text[start:text.index("</script>", start)])


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_hub_id_in_the_cache_is_viewed_offline_as_its_folder_would_be(saved, cache, name, tmp_path, capsys):
    _put(cache, f"tiny-org/{name}", saved / name, MAIN, "main")
    code, captured, out = _view(f"tiny-org/{name}", tmp_path, capsys)
    assert code == 0, captured.err
    by_id = _page_json(out)
    (tmp_path / "dir").mkdir()
    code, captured, out2 = _view(str(saved / name), tmp_path / "dir", capsys)
    assert code == 0, captured.err
    by_dir = _page_json(out2)
    assert [r["name"] for r in by_id["records"]] == [r["name"] for r in by_dir["records"]]
    assert [r["data"] for r in by_id["records"]] == [r["data"] for r in by_dir["records"]]


def test_a_revision_picks_its_snapshot_by_tag_or_commit(saved, cache, tmp_path, capsys):
    _put(cache, "tiny-org/lm", saved / "gpt2", MAIN, "main")
    _put(cache, "tiny-org/lm", saved / "llama", TAGGED, "v1")
    assert resolve_model("tiny-org/lm").endswith(MAIN)
    assert resolve_model("tiny-org/lm", revision="v1").endswith(TAGGED)
    assert resolve_model("tiny-org/lm", revision=TAGGED).endswith(TAGGED)
    model, _ = load_model("tiny-org/lm", revision="v1")
    assert model.config.model_type == "llama"
    code, captured, out = _view("tiny-org/lm", tmp_path, capsys, "--revision", "v1")
    assert code == 0, captured.err
    assert any("Llama" in n for n in _page_json(out)["notes"])


def test_a_model_missing_from_the_cache_offline_is_one_line_saying_how_to_fetch_it(cache, tmp_path, capsys):
    line = _one_line_error(*_view("tiny-org/absent", tmp_path, capsys), "tiny-org/absent", "HF_HUB_OFFLINE=1",
                           "hf download tiny-org/absent", str(cache))
    assert "not in the Hugging Face cache" in line


def test_an_unknown_revision_offline_is_one_line(saved, cache, tmp_path, capsys):
    _put(cache, "tiny-org/lm", saved / "gpt2", MAIN, "main")
    _one_line_error(*_view("tiny-org/lm", tmp_path, capsys, "--revision", "no-such-tag"), "tiny-org/lm",
                    "no-such-tag", "--revision no-such-tag")


@pytest.mark.parametrize("bad", ["org//name", "org/na me", "-org/name", "org/name/extra/", "a/b/c"])
def test_a_name_that_is_neither_a_folder_nor_a_hub_id_is_one_line(cache, bad, tmp_path, capsys):
    assert not is_hub_id(bad)
    with pytest.raises(ValueError, match="not a Hugging Face hub id"):
        resolve_model(bad, revision="main")


def test_a_revision_with_a_local_folder_is_refused(saved, cache, tmp_path, capsys):
    _one_line_error(*_view(str(saved / "gpt2"), tmp_path, capsys, "--revision", "main"), "--revision main",
                    "local directory")


def test_every_folder_check_applies_to_a_snapshot(saved, cache, tmp_path, capsys):
    snap = _put(cache, "tiny-org/cut", saved / "gpt2", MAIN, "main")
    weights = snap / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    _one_line_error(*_view("tiny-org/cut", tmp_path, capsys), "model.safetensors", "truncated")


def test_a_model_that_needs_its_own_code_is_refused_without_running_it(saved, cache, tmp_path, capsys):
    snap = _put(cache, "tiny-org/custom", saved / "gpt2", MAIN, "main")
    config = json.loads((snap / "config.json").read_text())
    config.update(model_type="my-own-model", auto_map={"AutoModelForCausalLM": "modeling_mine.MyModel"})
    (snap / "config.json").write_text(json.dumps(config))
    (snap / "modeling_mine.py").write_text("raise SystemExit('remote code ran')\n")
    _one_line_error(*_view("tiny-org/custom", tmp_path, capsys), "trust_remote_code is off", "its own code")


def test_only_weights_configs_and_tokenizer_files_are_fetched():
    from huggingface_hub.utils import filter_repo_objects

    files = ["model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
             "config.json", "tokenizer.json", "vocab.txt", "preprocessor_config.json", "pytorch_model.bin",
             "modeling_mine.py", "tf_model.h5", "flax_model.msgpack", "model.onnx", "README.md"]
    kept = set(filter_repo_objects(files, allow_patterns=ALLOW_PATTERNS))
    assert kept == {"model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                    "config.json", "tokenizer.json", "vocab.txt", "preprocessor_config.json"}


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_a_tokenizer_past_the_embedding_table_is_refused_naming_both_sizes(saved, name, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    d = tmp_path / name
    shutil.copytree(saved / name, d)
    config = json.loads((d / "config.json").read_text())
    config["vocab_size"] = hf.VOCAB - 5
    (d / "config.json").write_text(json.dumps(config))
    weights = load_file(d / "model.safetensors")
    for k, v in weights.items():
        if v.shape[0] == hf.VOCAB and v.dim() >= 1 and ("wte" in k or "word_embeddings" in k or "lm_head" in k
                                                         or k.endswith("decoder.weight") or k.endswith(".bias")):
            weights[k] = v[:hf.VOCAB - 5].contiguous()
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    _one_line_error(*_view(str(d), tmp_path, capsys), f"tokenizer has {hf.VOCAB} ids",
                    f"embedding table has {hf.VOCAB - 5} rows")
