"""The attention page in a real browser (headless Chromium driven by Playwright), as a person would use it.

Skips with the reason when Playwright or Chromium is missing (`make test` installs Debian's `chromium` where it can;
set QKV_CHROMIUM to use another executable).
"""

import io
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import qkv
from qkv.layers import TransformerLayer
from qkv.models import create
from qkv.vision import CBAM, NonLocal
from qkv.viz.page import save_attention_page

playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(not CHROMIUM, reason="no Chromium here (apt-get install chromium)"),
              pytest.mark.xdist_group("browser")]


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Opened:
    """A page opened from a file, with what it logged and requested."""

    def __init__(self, browser, path):
        self.page = browser.new_page(accept_downloads=True)
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)

    def drawn(self) -> str:
        return self.page.inner_html("#view")

    def check_clean(self):
        assert self.errors == []
        assert [u for u in self.requests if u != self.url and not u.startswith(("data:", "blob:"))] == []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.page.close()
        return False


def not_blank(png: bytes) -> bool:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    lo, hi = img.getextrema()
    return hi - lo > 100 and len(set(img.tobytes())) > 20


def translation_page(tmp_path):
    torch.manual_seed(0)
    model = create("transformer", src_vocab=30, tgt_vocab=30, dim=32, num_heads=4, num_layers=2).eval()
    src, tgt = torch.randint(4, 30, (1, 7)), torch.randint(4, 30, (1, 5))
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(src, torch.ones(1, 7, dtype=torch.bool), tgt)
    tokens = {"source": ["<b>Tom</b>", "chase", "Jerry", "in", "the", "</script>", "."],
              "target": ["汤姆", "追逐", "杰瑞", "。", "</s>"]}
    return save_attention_page(tmp_path / "translation.html", records, tokens=tokens, title="Tom chase Jerry")


def sentiment_page(tmp_path):
    torch.manual_seed(0)
    model = create("bigru-classifier", vocab_size=40, num_classes=2, embed_dim=8, hidden_dim=16).eval()
    words = ["a", "wonderful", "film", "with", "a", "dull", "ending"]
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(torch.randint(4, 40, (1, len(words))), torch.ones(1, len(words), dtype=torch.bool))
    return save_attention_page(tmp_path / "sentiment.html", records, tokens=words, title="sentiment")


def image_page(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), CBAM(8, reduction=2), NonLocal(8)).eval()
    image = torch.zeros(16, 16)
    image[4:12, 5:11] = 1.0
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(image[None, None])
    return save_attention_page(tmp_path / "image.html", records, image=image, title="image")


def caption_page(tmp_path):
    torch.manual_seed(0)
    model = create("caption-soft", vocab_size=20, widths=[4, 4, 4, 8], embed_dim=8, hidden_dim=16, attn_dim=8).eval()
    image = torch.zeros(1, 1, 32, 32)
    image[..., 4:14, 18:30] = 1.0
    words = ["a", "bag", "at", "the", "top", "right"]
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(image, torch.randint(4, 20, (1, len(words))))
    return save_attention_page(tmp_path / "caption.html", records, tokens={"target": words}, image=image[0, 0],
                               title="a bag at the top right")


def user_model_page(tmp_path):
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 16)
            self.layers = nn.ModuleList(TransformerLayer(16, 2) for _ in range(3))

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = Tiny().eval()
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(torch.arange(6)[None])
    return save_attention_page(tmp_path / "mine.html", records, tokens=list("abcdef"), title="my model")


@pytest.mark.parametrize("make", [translation_page, sentiment_page, image_page, caption_page, user_model_page])
@pytest.mark.slow
def test_page_loads_offline_and_draws(browser, tmp_path, make):
    with Opened(browser, make(tmp_path)) as opened:
        opened.check_clean()
        assert opened.page.locator("#view *").count() > 5
        assert not_blank(opened.page.locator("#view").screenshot())
        options = opened.page.locator("#attention option").all_inner_texts()
        if len(options) > 1:
            before = opened.drawn()
            opened.page.select_option("#attention", index=len(options) - 1)
            assert opened.drawn() != before  # another attention draws something else
        drawings = set()
        for view in opened.page.locator("#view-kind option").all_inner_texts():
            opened.page.select_option("#view-kind", view)
            assert opened.page.locator("#view *").count() > 3
            drawings.add(opened.drawn())
        assert len(drawings) == opened.page.locator("#view-kind option").count()  # each view draws its own
        opened.check_clean()


@pytest.mark.slow
def test_heads_hover_and_save(browser, tmp_path):
    with Opened(browser, translation_page(tmp_path)) as opened:
        page = opened.page
        page.select_option("#attention", index=3)  # decoder.0.cross_attn
        assert "cross" in page.inner_text("#info") and page.locator("#head option").count() == 5
        page.select_option("#view-kind", "lines")
        mean = opened.drawn()
        page.select_option("#head", "2")
        assert opened.drawn() != mean  # one head is not the mean
        assert page.locator("#view line.hl").count() == 0
        page.hover("#view text.tok[data-side='data-q'][data-i='1']")  # a target token: its row of weights
        highlighted = page.locator("#view line.hl")
        assert highlighted.count() > 0 and "focus" in page.get_attribute("#view", "class")
        assert {highlighted.nth(i).get_attribute("data-q") for i in range(highlighted.count())} == {"1"}
        page.mouse.move(0, 0)
        assert page.locator("#view line.hl").count() == 0
        tokens = page.locator("#view text.tok").all_text_contents()
        assert "</script>" in tokens and "<b>Tom</b>" in tokens and "汤姆" in tokens  # text, not markup
        with page.expect_download() as svg_download:
            page.click("#save-svg")
        svg = Path(svg_download.value.path()).read_text(encoding="utf-8")
        assert svg.startswith("<svg") and "汤姆" in svg
        with page.expect_download() as png_download:
            page.click("#save-png")
        png = Path(png_download.value.path()).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and not_blank(png)
        opened.check_clean()


def test_caption_words_over_the_image(browser, tmp_path):
    with Opened(browser, caption_page(tmp_path)) as opened:
        page = opened.page
        assert page.input_value("#view-kind") == "image" and page.locator("#view image").count() == 1
        assert page.locator("#query option").all_inner_texts() == ["a", "bag", "at", "the", "top", "right"]
        first = opened.drawn()
        page.select_option("#query", "1")  # another word: another map over the image
        assert opened.drawn() != first
        opened.check_clean()


def test_image_view_follows_the_query(browser, tmp_path):
    with Opened(browser, image_page(tmp_path)) as opened:
        page = opened.page
        names = page.locator("#attention option").all_inner_texts()
        page.select_option("#attention", index=next(i for i, n in enumerate(names) if n.startswith("2 ")))
        assert page.input_value("#view-kind") == "image" and page.locator("#view image").count() == 1
        first = opened.drawn()
        page.select_option("#query", "100")
        assert opened.drawn() != first
        spatial = next(i for i, n in enumerate(names) if "spatial" in n)
        page.select_option("#attention", index=spatial)
        assert page.locator("#view image").count() == 1
        opened.check_clean()


# ---------------------------------------------------------------------------------------------------------------------
# every head at a glance, a generation's steps, long inputs


@pytest.mark.slow
def test_head_grid_and_sortable_statistics(browser, tmp_path):
    with Opened(browser, translation_page(tmp_path)) as opened:
        page = opened.page
        thumbs = page.locator("#heads img.thumb")
        assert thumbs.count() == 3 * 2 * 4  # encoder self, decoder self, cross: 2 layers x 4 heads each
        thumbs.nth(6).click()  # the first stack, layer 1, head 2
        assert page.input_value("#head") == "2" and "layer 1" in page.inner_text("#info")
        rows = page.locator("#head-stats tbody tr")
        assert rows.count() == 3 * 2 * 4
        col = page.locator("#head-stats th").all_inner_texts().index("entropy")
        page.click("#head-stats th[data-col='entropy']")

        def column():
            return [float(rows.nth(i).locator("td").nth(col).inner_text()) for i in range(rows.count())]
        assert column() == sorted(column(), reverse=True)
        page.click("#head-stats th[data-col='entropy']")  # again: the other way
        assert column() == sorted(column())
        before = opened.drawn()
        rows.nth(0).click()
        assert opened.drawn() != before or page.input_value("#head") != "2"
        opened.check_clean()


@pytest.fixture(scope="module")
def generation_pages(tmp_path_factory):
    pytest.importorskip("transformers")
    from qkv.integrations.generation import view_generation
    from qkv.integrations.transformers import register
    from tests.integrations import hf_models as hf

    register()
    root = tmp_path_factory.mktemp("genpages")
    out = {}
    for name in ("gpt2", "marian"):
        hf.save(name, root / name)
        view = view_generation(root / name, "the big cat sat on a red mat", 6)
        out[name] = (view, save_attention_page(root / f"{name}.html", view.records, **view.page_kwargs()))
    return out


@pytest.mark.parametrize("name", ["gpt2", "marian"])
@pytest.mark.slow
def test_generation_steps_token_by_token(browser, generation_pages, name):
    view, path = generation_pages[name]
    steps = view.generation["steps"]
    with Opened(browser, path) as opened:
        page = opened.page
        assert page.locator("#produced .gtok").count() == len(steps)
        seen = set()
        for s in range(len(steps)):
            page.click(f"#produced .gtok[data-step='{s}']")
            assert page.input_value("#step") == str(s)
            info = page.inner_text("#step-info")
            assert f"step {s}" in info and f"{steps[s]['p']:.3f}" in info
            n = page.locator("#context .ctok").count()  # the prompt and what came before (the decoder's own)
            assert n == view.generation["first_row"] + s + 1
            seen.add(page.inner_html("#context"))
        assert len(seen) == len(steps)
        page.select_option("#gen-head", "1")
        one = page.inner_html("#context")
        page.select_option("#gen-head", "mean")
        assert page.inner_html("#context") != one
        if name == "marian":  # the alignment matrix: click a row to go to its step
            cross = [o for o in page.locator("#gen-attention option").all_inner_texts() if "cross" in o]
            page.select_option("#gen-attention", label=cross[0])
            assert page.locator("#context .ctok").count() == len(view.tokens["source"])
            canvas = page.locator("#alignment canvas")
            assert canvas.count() == 1
            box = canvas.bounding_box()
            canvas.click(position={"x": 2, "y": box["height"] - 2})
            assert page.input_value("#step") == str(len(steps) - 1)
        opened.check_clean()


@pytest.mark.slow
def test_a_long_input_keeps_each_rows_top_k_and_opens_quickly(browser, tmp_path, gen):
    import time

    t = 3000
    scores = torch.randn(1, 2, t, t, generator=gen)
    scores[..., torch.arange(1, t), torch.arange(t - 1)] += 8  # a previous-token pattern to find in the zoom
    w = torch.softmax(scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")), -1)
    rec = qkv.AttentionRecord("decoder.0.self_attn", "Attn", "self", 0, w, causal=True)
    path = save_attention_page(tmp_path / "long.html", [rec], tokens=[f"w{i}" for i in range(t)], budget=2_000_000)
    assert path.stat().st_size < 4_000_000
    start = time.perf_counter()
    with Opened(browser, path) as opened:
        page = opened.page
        page.wait_for_selector("#view image#overview")
        assert time.perf_counter() - start < 15
        assert "largest weights" in page.inner_text("body")
        box = page.locator("#overview").bounding_box()
        page.locator("#overview").click(position={"x": box["width"] / 2, "y": box["height"] / 2})
        cells = page.locator("#zoom rect")
        assert cells.count() == 48 * 48
        import re

        i0, j0 = map(int, re.findall(r"queries (\d+).*keys (\d+)", page.text_content("#zoom-title"))[0])
        assert abs(i0 - t / 2) < 60 and abs(j0 - t / 2) < 60  # around the point clicked

        def weight(i, j):  # the exact weight of query i on key j, read from the zoom window
            return float(cells.nth((i - i0) * 48 + j - j0).locator("title").text_content().rsplit(": ", 1)[1])
        rows = range(max(i0, j0) + 2, min(i0, j0) + 46, 5)
        assert all(weight(i, i + 1) == 0 for i in rows)  # causal: nothing on the key just ahead
        assert all(weight(i, i - 1) > 0.3 for i in rows)  # the previous token
        page.select_option("#view-kind", "text")
        assert page.locator("#view rect.cell").count() == t
        opened.check_clean()
