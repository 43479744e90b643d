"""`qkv view` on runs of every application, the page's data and escaping, and `qkv faithfulness`."""

import base64
import json
import re

import pytest
import torch

import qkv
from qkv.apps import ViewInput, load_predictor
from qkv.apps.sentiment import SentimentClassifier, comprehensiveness
from qkv.cli import main
from qkv.viz.page import attention_page, save_attention_page
from tests.helpers import sentences

pytestmark = pytest.mark.usefixtures("one_thread")

def page_data(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', text, re.S)
    assert m, "the page holds its data in one JSON script element"
    return json.loads(m.group(1))


class _Runs:
    """The session's tiny runs by application name (trained on first use, shared with other test modules)."""

    def __init__(self, tiny_run):
        self.tiny_run = tiny_run

    def __getitem__(self, name: str):
        if name == "reviews":
            self.tiny_run("sentiment")
            return self.tiny_run.root / "reviews.tsv"
        return self.tiny_run(name)


@pytest.fixture
def runs(tiny_run):
    return _Runs(tiny_run)


@pytest.mark.slow
def test_view_translation(runs, tmp_path, capsys):
    page = tmp_path / "t.html"
    assert main(["view", str(runs["translate"]), "7 mars 2019", "--out", str(page)]) == 0
    assert "wrote" in capsys.readouterr().out
    data = page_data(page.read_text(encoding="utf-8"))
    kinds = {(r["name"], r["kind"]) for r in data["records"]}
    assert {("encoder.0.self_attn", "self"), ("encoder.1.self_attn", "self"), ("decoder.1.cross_attn", "cross"),
            ("decoder.0.self_attn", "self")} <= kinds
    assert any(r["kind"] == "rollout" for r in data["records"])
    source = data["tokens"]["source"]
    assert "".join(source).replace("\u2581", " ").strip().startswith("7")
    cross = next(r for r in data["records"] if r["name"] == "decoder.1.cross_attn")
    assert cross["qtok"] == "target" and cross["ktok"] == "source" and cross["tk"] == len(source)
    w = torch.frombuffer(bytearray(base64.b64decode(cross["data"])), dtype=torch.uint8).float()
    rows = w.view(cross["heads"], cross["tq"], cross["tk"]).sum(-1) / 255  # every row sums to 1, +- rounding
    assert torch.allclose(rows, torch.ones_like(rows), atol=cross["tk"] / 255)


def test_view_sentiment_and_images(runs, tmp_path):
    page = load_predictor(runs["sentiment"]).view(ViewInput(text="A wonderful film."))
    assert [(r.name, r.kind) for r in page.records] == [("layers.0.self_attn", "self"), ("layers.1.self_attn", "cross")]
    assert page.tokens == {"source": ["[CLS]", "A", "wonderful", "film", "."], "target": ["[CLS]"]}
    records = page_data(attention_page(page.records, **page.page_kwargs()))["records"]
    assert [(r["qtok"], r["ktok"], r["tq"], r["tk"]) for r in records[:2]] == [("source", "source", 5, 5),
                                                                                ("target", "source", 1, 5)]
    out = tmp_path / "img.html"
    assert main(["view", str(runs["images"]), "--index", "0", "--index", "3", "--out", str(out)]) == 0
    pages = sorted(tmp_path.glob("img-*.html"))
    assert [p.name for p in pages] == ["img-0.html", "img-1.html"]
    data = page_data(pages[0].read_text(encoding="utf-8"))
    nonlocal_rec = next(r for r in data["records"] if r["kind"] == "self")
    assert data["image"]["src"].startswith("data:image/png;base64,") and nonlocal_rec["grid"]
    assert nonlocal_rec["qgrid"][0] * nonlocal_rec["qgrid"][1] == nonlocal_rec["tq"]


def test_view_errors(runs, tmp_path, capsys):
    assert main(["view", str(runs["translate"]), "--out", str(tmp_path / "x.html")]) == 2
    assert main(["view", str(runs["images"]), "--index", "99999", "--out", str(tmp_path / "x.html")]) == 2
    assert main(["view", str(tmp_path / "nothing"), "text"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("qkv: error:") for line in err)
    assert not (tmp_path / "x.html").exists()


def test_page_escapes_hostile_text_and_stays_small(gen):
    hostile = ["</script><script>alert(1)</script>", "<!--", "&amp;", "\u2028", "ok"]
    w = torch.softmax(torch.randn(1, 1, 5, 5, generator=gen), -1)
    rec = qkv.AttentionRecord("enc.0.attn", "MultiHeadAttention", "self", 0, w)
    text = attention_page([rec], tokens=hostile, title="<img src=x onerror=alert(1)>")
    assert text.count("</script>") == 2 and "<script>alert" not in text and "<img src=x" not in text
    assert "<!--" not in text.split("<body>")[1]
    data = page_data(text)
    assert data["tokens"]["tokens"] == hostile and data["title"] == "<img src=x onerror=alert(1)>"
    # 100 tokens, 6 layers x 8 heads, encoder self + decoder self + cross: a few MB at most
    big = [qkv.AttentionRecord(f"{part}.{i}.attn", "MultiHeadAttention", kind, i,
                               torch.softmax(torch.randn(1, 8, 100, 100), -1), causal=part == "decoder")
           for part, kind in (("encoder", "self"), ("decoder", "self"), ("cross", "cross")) for i in range(6)]
    size = len(attention_page(big, tokens={"source": [f"w{i}" for i in range(100)]}).encode())
    assert size < 3_000_000, size
    with pytest.raises(ValueError, match="no attention to show"):
        attention_page([])
    with pytest.raises(ValueError, match="example 3 is out of range"):
        attention_page([rec], example=3)
    with pytest.raises(TypeError, match="AttentionRecord"):
        attention_page([w])


def test_page_written_atomically(tmp_path, gen):
    rec = qkv.AttentionRecord("a", "Attention", "cross", None, torch.rand(2, 1, 3, 4, generator=gen))
    path = save_attention_page(tmp_path / "sub" / "p.html", [rec], example=1)
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["p.html"]
    data = page_data(path.read_text(encoding="utf-8"))
    got = torch.frombuffer(bytearray(base64.b64decode(data["records"][0]["data"])), dtype=torch.uint8)
    assert torch.equal(got, (rec.weights[1].clamp(0, 1) * 255).round().to(torch.uint8).flatten())


def test_faithfulness_of_an_attention_that_explains(runs, capsys):
    """The model learnt that one planted word decides: removing the most attended word must hurt more than a
    random one, by a wide margin."""
    clf = SentimentClassifier.load(runs["sentiment"])
    texts = [t for t, _ in sentences(120, seed=7)]
    r = comprehensiveness(clf, texts, k=1, draws=3)
    assert r["texts"] == 120 and r["attention"] > r["random"] + 0.1 and r["wins"] > 0.6
    assert main(["faithfulness", str(runs["sentiment"]), "--k", "1", "--draws", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("k\tattention drop") and out[1].startswith("1\t")
    with pytest.raises(ValueError, match="more than k=50"):
        comprehensiveness(clf, ["short one"], k=50)


@pytest.mark.slow
def test_view_captioning_and_question_answering(runs, tmp_path):
    page = tmp_path / "c.html"
    assert main(["view", str(runs["caption"]), "--index", "1", "--out", str(page)]) == 0
    data = page_data(page.read_text(encoding="utf-8"))
    cross = [r for r in data["records"] if r["kind"] == "cross"]
    assert len(cross) == 2 and data["image"] is not None
    assert all(r["grid"][0] * r["grid"][1] == r["tk"] for r in cross)  # the words attend over the feature grid
    assert all(r["qtok"] in ("target", "words") for r in cross)
    view = load_predictor(runs["qa"]).view(ViewInput(text="Marie Curie discovered radium in 1898 in Paris.",
                                                     question="When was radium discovered?"))
    assert {r.kind for r in view.records} >= {"cross"} and view.tokens["target"][0].lower() == "when"
    assert view.tokens["source"][:2] == ["Marie", "Curie"]
    assert main(["view", str(runs["qa"]), "Marie Curie discovered radium.", "--out", str(tmp_path / "q.html")]) == 2
