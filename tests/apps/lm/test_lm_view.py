"""`qkv view LMRUN "text"`: the language model's generation step by step (the page input shared with Hugging Face
models' recorded generation) and its induction-head table."""

import json
import re

import pytest
import torch

from qkv.apps import ViewInput
from qkv.apps.lm import LanguageModel
from qkv.cli import main
from qkv.integrations.generation import GenerationView

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_run):
    return tiny_run("lm")


def page_data(path):
    text = path.read_text(encoding="utf-8")
    m = re.search(r'"generation":(\{.*?\}|null),"statistics"', text)
    return text, m


def test_generation_step_by_step_is_the_models_greedy_continuation(lm):
    model = LanguageModel.load(lm, "cpu")
    prompt = "The film"
    page = model.viewing(generate=6).view(ViewInput(text=prompt))
    assert isinstance(page, GenerationView)
    steps, first = page.generation["steps"], page.generation["first_row"]
    ids = [model.tokenizer.eos_id] + model.tokenizer.encode(prompt)
    assert first == len(ids) - 1 and 1 <= len(steps) <= 6
    # each step: the most probable token after what came before (greedy), its probability from the cached steps
    caches = model.model.new_caches()
    with torch.no_grad():
        logits = model.model.step(torch.tensor([ids]), caches)[0, -1]
    for step in steps:
        p = logits.softmax(-1)
        best = int(p.argmax())
        assert step["token"] == model.tokenizer.tokens_of_ids([best])[0]
        assert step["p"] == pytest.approx(float(p[best]), abs=1e-4)
        assert step["top"][0][0] == step["token"]
        with torch.no_grad():
            logits = model.model.step(torch.tensor([[best]]), caches)[0, -1]
    n = len(page.tokens["tokens"])
    assert n == len(ids) + len(steps) - 1
    for record in page.records:  # row t: the attention of the token fed at position t, causal
        assert record.weights.shape[-2:] == (n, n)
        assert torch.all(record.weights[0].triu(1) == 0)


def test_sampling_with_a_seed_is_reproducible(lm):
    model = LanguageModel.load(lm, "cpu")
    a = model.viewing(generate=8, strategy="sample", seed=4).view(ViewInput(text="A"))
    b = model.viewing(generate=8, strategy="sample", seed=4).view(ViewInput(text="A"))
    assert a.generation["steps"] == b.generation["steps"] and a.title == b.title
    with pytest.raises(ValueError, match="greedy or sample"):
        model.viewing(generate=3, strategy="beam")


def test_qkv_view_writes_the_generation_and_the_induction_table(lm, tmp_path, tiny_run, capsys):
    page = tmp_path / "gen.html"
    assert main(["view", str(lm), "The movie", "--generate", "5", "--out", str(page)]) == 0
    text, m = page_data(page)
    generation = json.loads(m.group(1))
    assert 1 <= len(generation["steps"]) <= 5 and generation["strategy"] == "greedy"
    plain = tmp_path / "plain.html"
    assert main(["view", str(lm), "The movie", "--out", str(plain)]) == 0
    text, _ = page_data(plain)
    layers = LanguageModel.load(lm, "cpu").options.num_layers
    heads = LanguageModel.load(lm, "cpu").options.num_heads
    assert "induction heads:" in text
    assert len(re.findall(r"head \d+\.\d+: induction [0-9.]+, previous [0-9.]+, copying [0-9.]+", text)) == \
        layers * heads
    capsys.readouterr()
    assert main(["view", str(tiny_run("sentiment")), "a film", "--generate", "3", "--out", str(page)]) == 2
    err = capsys.readouterr().err
    assert "--generate apply to Hugging Face models and language-model runs" in err
    assert "sentiment run" in err


def test_the_induction_table_of_a_run(lm):
    table = LanguageModel.load(lm, "cpu").induction_table(length=10, seed=1)
    assert table.induction.shape == table.previous.shape == table.copying.shape
    assert torch.all((table.induction >= 0) & (table.induction <= 1))
    assert table.length == 10 and table.loss_first > 0
