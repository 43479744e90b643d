"""The attention page in a notebook (qkv.notebook): the object Jupyter draws inline, the page it saves, the
tutorial notebook executed by a Jupyter kernel (nbclient), and its inline output opened in headless Chromium as a
notebook's output area holds it (the page inside an iframe's srcdoc, sandboxed, nothing fetched)."""

from __future__ import annotations

import html
import os
import re
import shutil

import pytest
import torch
from torch import nn

import qkv
from qkv.apps import ViewInput, load_predictor
from qkv.layers import TransformerLayer
from qkv.notebook import AttentionPage, page_of_records, show
from qkv.viz.page import attention_page
from tests import ROOT

TUTORIAL = ROOT / "docs" / "tutorials" / "attention-in-a-notebook.py"
CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(TransformerLayer(16, 2) for _ in range(2))

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return x


def _srcdoc(shown: str) -> str:
    m = re.fullmatch(r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts allow-downloads" .*</iframe>', shown, re.S)
    assert m, shown[:200]
    return html.unescape(m.group(1))


def test_the_inline_page_is_the_page_of_qkv_view(tmp_path):
    torch.manual_seed(0)
    model = TwoLayers().eval()
    ids = torch.randint(50, (1, 5))
    words = ["<b>a</b>", '"quoted"', "&amp;", "</script>", "汤姆"]
    page = show(model, ids, tokens=words, title="two <layers>")
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(ids)
    expected = attention_page(records, tokens=words, title="two <layers>")
    assert page.html == expected  # one implementation: the page qkv view writes
    assert _srcdoc(page._repr_html_()) == expected  # the escaped srcdoc holds the page exactly
    written = page.save(tmp_path / "out")
    assert written.suffix == ".html" and written.read_text(encoding="utf-8") == expected
    assert page_of_records(records, tokens=words, title="two <layers>").html == expected


def test_the_page_of_a_run(tiny_run):
    run = tiny_run("sentiment")
    page = show(run, "a gorgeous movie")
    given = load_predictor(run, "cpu").view(ViewInput(text="a gorgeous movie"))
    assert page.html == attention_page(given.records, **given.page_kwargs())
    assert show(run, "a gorgeous movie", title="mine").html != page.html


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no such run or model directory"):
        show(tmp_path / "missing", "text")
    with pytest.raises(ValueError, match="ran no qkv attention"):
        show(nn.Linear(3, 3), torch.randn(1, 3))
    with pytest.raises(ValueError, match="give the model's inputs"):
        show(TwoLayers())
    with pytest.raises(ValueError, match="a torch.nn.Module"):
        show(42, "text")
    with pytest.raises(ValueError, match="one input at a time"):
        show(tmp_path, "a", "b")
    with pytest.raises(ValueError, match="HTML of a page"):
        AttentionPage("not a page")


@pytest.fixture(scope="module")
def executed_tutorial(tmp_path_factory):
    jupytext = pytest.importorskip("jupytext", reason="jupytext is not installed (the docs extra)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (the docs extra)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (the docs extra)")
    work = tmp_path_factory.mktemp("tutorial")
    notebook = jupytext.read(TUTORIAL)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel is a child process: it inherits these
    try:
        nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(work)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return notebook, work


@pytest.mark.slow
def test_the_tutorial_runs_and_shows_the_page_inline(executed_tutorial):
    notebook, work = executed_tutorial
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1 and shown[0].startswith("<iframe srcdoc=")
    saved = (work / "tiny-attention.html").read_text(encoding="utf-8")
    assert _srcdoc(shown[0]) == saved


@pytest.mark.xdist_group("browser")
@pytest.mark.skipif(not CHROMIUM, reason="no Chromium here (apt-get install chromium)")
@pytest.mark.slow
def test_the_inline_output_draws_in_a_browser(executed_tutorial, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    notebook, _ = executed_tutorial
    (shown,) = [o["data"]["text/html"] for c in notebook.cells if c.cell_type == "code"
                for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    host = tmp_path / "notebook.html"  # an output area, as Jupyter and VS Code hold a cell's HTML output
    host.write_text(f'<!DOCTYPE html><html><body><div class="output">{shown}</div></body></html>', encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        errors, requests = [], []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.context.on("request", lambda r: requests.append(r.url))
        page.goto(host.as_uri())
        frame = page.frame_locator("iframe")
        frame.locator("#view line").first.wait_for(state="attached", timeout=10_000)  # the lines view, drawn
        drawn = frame.locator("#view").inner_html()
        assert ">cat<" in drawn and ">mat<" in drawn  # with the tutorial's tokens
        browser.close()
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "about:", "data:", "blob:"))] == []


def test_the_page_of_a_hugging_face_model(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the hf extra)")
    from qkv.integrations.transformers import register
    from qkv.integrations.transformers_view import view_page_input
    from tests.integrations import hf_models

    hf_models.save("gpt2", tmp_path / "gpt2")  # a saved directory: the page qkv view writes for it
    page = show(tmp_path / "gpt2", "the cat sat")
    given = view_page_input(tmp_path / "gpt2", "the cat sat")
    assert page.html == attention_page(given.records, **given.page_kwargs())

    register()  # a model object on qkv's backend: every layer's attention, as given
    model = hf_models.model("llama", "qkv")
    ids = torch.randint(3, hf_models.VOCAB, (1, 6))
    page = show(model, ids, tokens=[f"t{i}" for i in range(6)])
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(ids)
    assert len(records) == model.config.num_hidden_layers
    assert page.html == attention_page(records, tokens=[f"t{i}" for i in range(6)], title=type(model).__name__)
    with pytest.raises(ValueError, match="ran no qkv attention"):
        show(hf_models.model("llama", "eager"), ids)


def _page_data(page_html: str) -> dict:
    import json

    start = page_html.index('id="qkv-data">') + len('id="qkv-data">')
    return json.loads(page_html[start:page_html.index("</script>", start)])


def test_a_transformers_model_object_with_its_tokenizer_is_shown_and_put_back(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the hf extra)")
    from tests.integrations import hf_models

    hf_models.save("gpt2", tmp_path / "gpt2")
    model, tok = hf_models.model("gpt2", "eager"), hf_models.tokenizer()
    from_dir = _page_data(show(tmp_path / "gpt2", "the cat sat on the mat").html)
    page = _page_data(show(model, tok, "the cat sat on the mat").html)
    assert model.config._attn_implementation == "eager"
    assert [r["data"] for r in page["records"]] == [r["data"] for r in from_dir["records"]]
    assert page["tokens"] == from_dir["tokens"]

    generated = _page_data(show(model, tok, "the cat sat", generate=4).html)
    want = _page_data(show(tmp_path / "gpt2", "the cat sat", generate=4).html)
    assert model.config._attn_implementation == "eager"
    assert generated["generation"]["steps"] == want["generation"]["steps"]
    assert len(generated["generation"]["steps"]) == 4
    assert [r["data"] for r in generated["records"]] == [r["data"] for r in want["records"]]

    measured = _page_data(show(model, tok, "the cat sat on the mat", importance=True).html)
    assert [len(r["importance"]) for r in measured["records"] if "importance" in r] == [4, 4]
    with pytest.raises(ValueError, match="one text after the tokenizer"):
        show(model, tok)


def test_a_transformers_image_model_object_is_shown_on_an_image(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the hf extra)")
    from PIL import Image

    from tests.integrations import hf_models

    hf_models.save("vit", tmp_path / "vit")
    model = hf_models.model("vit", "eager")
    picture = Image.fromarray((torch.rand(32, 32, 3) * 255).to(torch.uint8).numpy())
    from qkv.integrations.transformers_view import view_image_input

    page = _page_data(show(model, image=picture).html)
    want = view_image_input(tmp_path / "vit", picture)
    assert model.config._attn_implementation == "eager"
    assert [r["name"] for r in page["records"]][:2] == [r.name for r in want.records][:2]
    assert page["title"] == want.title


def test_a_hub_id_from_the_cache_is_shown_offline(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not installed (the hf extra)")
    from tests.integrations import hf_models

    snapshot = tmp_path / "hub" / "models--tiny--gpt2" / "snapshots" / ("c" * 40)
    hf_models.save("gpt2", snapshot)
    (tmp_path / "hub" / "models--tiny--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny--gpt2" / "refs" / "main").write_text("c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert show("tiny/gpt2", "the cat sat").html == show(snapshot, "the cat sat").html
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1"):
        show("tiny/absent", "the cat sat")
