"""``qkv view DIR "prompt" --generate N`` and :func:`view_generation`: the page of a generation (steps, tokens,
probabilities, the kept records), and its bad input as one-line errors."""

import json
import re

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

from qkv.cli import main  # noqa: E402
from qkv.integrations.generation import view_generation  # noqa: E402
from qkv.integrations.transformers import register  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402

PROMPT = "the big cat sat on a red mat"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    register()
    root = tmp_path_factory.mktemp("gen")
    for name in ("gpt2", "llama", "t5", "bert"):
        hf.save(name, root / name)
    return root


def _data(path):
    return json.loads(re.search(r'id="qkv-data">(.*?)</script>', path.read_text(encoding="utf-8"), re.S).group(1))


@pytest.mark.parametrize("name,strategy", [("gpt2", "greedy"), ("llama", "beam"), ("t5", "sample")])
def test_generate_writes_the_steps_of_a_generation(saved, name, strategy, tmp_path, capsys):
    out = tmp_path / "gen.html"
    extra = ["--beam", "3"] if strategy == "beam" else ["--seed", "7"] if strategy == "sample" else []
    code = main(["view", str(saved / name), PROMPT, "--generate", "5", "--strategy", strategy, *extra,
                 "--out", str(out), "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    data = _data(out)
    g = data["generation"]
    assert 1 <= len(g["steps"]) <= 5 and g["strategy"] == strategy
    for s in g["steps"]:
        assert 0 <= s["p"] <= 1 and len(s["top"]) == 5
        assert s["top"] == sorted(s["top"], key=lambda a: -a[1])
        if strategy == "greedy":
            assert s["top"][0][0] == s["token"]
    seq2seq = name == "t5"
    rows = [r for r in data["records"] if r["kind"] == ("cross" if seq2seq else "self") and r["layer"] is not None]
    assert rows and all(r["tq"] == g["first_row"] + len(g["steps"]) for r in rows)
    if seq2seq:
        assert data["tokens"]["source"][:3] == ["the", "big", "cat"] and g["encoder_decoder"]
    else:
        assert data["tokens"]["tokens"][:3] == ["the", "big", "cat"]
        assert data["tokens"]["tokens"][g["first_row"] + 1:] == [s["token"] for s in g["steps"]][:-1]
    assert all("stats" in r for r in data["records"] if r["kind"] in ("self", "cross") and "rollout" not in r["name"])


def test_layers_and_heads_restrict_what_is_recorded(saved):
    view = view_generation(saved / "llama", PROMPT, 3, layers=[1], heads=[2, 3])
    assert {r.layer for r in view.records} == {1} and {r.weights.shape[1] for r in view.records} == {2}
    assert any("layers 1" in n for n in view.notes)


@pytest.mark.parametrize("args,needle", [
    (["--generate", "0"], "--generate"),
    (["--generate", "3", "--layers", "9"], "--layers 9"),
    (["--generate", "3", "--heads", "4"], "--heads 4"),
    (["--generate", "3", "--heads", "x"], "--heads"),
    (["--strategy", "beam"], "--generate"),
    (["--generate", "3", "--beam", "3"], "--beam"),
    (["--generate", "70"], "positions"),
])
def test_bad_generation_options_are_one_line_errors(saved, args, needle, tmp_path, capsys):
    out = tmp_path / "x.html"
    assert main(["view", str(saved / "gpt2"), PROMPT, *args, "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qkv: error:") and needle in err[0], err
    assert not out.exists()


def test_an_empty_prompt_and_a_model_without_a_generation_head_are_refused(saved, tmp_path, capsys):
    out = tmp_path / "x.html"
    assert main(["view", str(saved / "gpt2"), "   ", "--generate", "3", "--out", str(out)]) == 2
    assert main(["view", str(saved / "bert"), PROMPT, "--generate", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("qkv: error:") for e in err)
    assert "generat" in err[1] and str(saved / "bert") in err[1]
    assert not out.exists()


def test_generation_options_on_a_qkv_run_are_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert main(["view", str(run), "text", "--generate", "3"]) == 2
    assert "Hugging Face" in capsys.readouterr().err
