"""The documentation site in headless Chromium: built by `mkdocs build` as `make docs` does, served from a local
server and opened from file://. The start page and an application page render with their pictures, navigation
and search work, and no request leaves the machine.

Skips with the reason when MkDocs (the docs extra), Playwright or Chromium is missing."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading

import pytest

pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install -e '.[docs]')")
pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(not CHROMIUM, reason="no Chromium here (apt-get install chromium)"),
              pytest.mark.xdist_group("browser"), pytest.mark.slow]


# `site`: the built site (tests/docs/conftest.py), once per worker whatever order the browser group runs in


@pytest.fixture(scope="session")
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def heading(v) -> str:
    return v.page.locator("article h1").first.inner_text().rstrip("¶").strip()  # without the permalink sign


class Visit:
    """A browser page that records its errors and every request it makes."""

    def __init__(self, browser):
        self.page = browser.new_page()
        self.errors, self.requests = [], []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.context.on("request", lambda r: self.requests.append(r.url))

    def outside(self, base: str) -> list[str]:
        return [u for u in self.requests if not u.startswith((base, "data:", "blob:"))]

    def images_loaded(self) -> bool:
        return self.page.evaluate("[...document.querySelectorAll('article img')].every(i => i.naturalWidth > 0)")


def test_start_page_renders_with_its_picture(browser, served):
    v = Visit(browser)
    v.page.goto(f"{served}/index.html")
    assert heading(v) == "qkv"
    assert v.page.locator("article img").count() >= 1 and v.images_loaded()
    assert "qkv.attention" in v.page.locator("article").inner_text()
    assert v.errors == [] and v.outside(served) == []


def test_navigation_reaches_every_section(browser, served):
    v = Visit(browser)
    v.page.goto(f"{served}/index.html")
    v.page.locator("nav.md-nav--primary a", has_text="Translation").first.click()
    v.page.wait_for_url("**/apps/translate.html")
    assert heading(v) == "Translation"
    v.page.locator("nav.md-nav--primary a", has_text="Speech recognition").first.click()
    v.page.wait_for_url("**/apps/speech.html")
    assert v.images_loaded() and v.page.locator("article img").count() >= 2
    v.page.goto(f"{served}/concepts/stages.html")
    assert v.images_loaded() and v.page.locator("article img[src='scores.png']").count() == 1  # made at build
    v.page.goto(f"{served}/reference/cli.html")
    assert "--max-minutes" in v.page.locator("article").inner_text()
    assert v.errors == [] and v.outside(served) == []


def test_a_concept_page_shows_maths_outputs_and_diagrams(browser, served):
    """Formulas are SVG drawn into the page (no script, no font fetched), outputs sit under their blocks, the
    diagram loads, and nothing is requested from outside the site."""
    v = Visit(browser)
    v.page.goto(f"{served}/concepts/stages.html")
    v.page.wait_for_load_state("networkidle")
    maths = v.page.locator("article svg.qkv-math")
    assert maths.count() >= 10
    box = maths.first.bounding_box()
    assert box and box["width"] > 5 and 8 < box["height"] < 60  # drawn at the text's size
    output = v.page.locator("article .qkv-output").first
    assert output.is_visible() and "0.5667" in output.inner_text()
    assert v.page.locator("article img[src='stages.svg']").count() == 1 and v.images_loaded()
    assert v.errors == [] and v.outside(served) == []


def test_search_finds_pages(browser, served):
    v = Visit(browser)
    v.page.goto(f"{served}/index.html")
    box = v.page.locator("input.md-search__input")
    box.click()
    # the index is built in a worker, slowly on a busy machine: wait until it says it is ready, then type key by
    # key as a person does (the search listens to key events; a value set at once is not seen once it is ready)
    meta = v.page.locator(".md-search-result__meta")
    v.page.wait_for_function("m => !/initiali[sz]ing/i.test(m.textContent)", arg=meta.element_handle(),
                             timeout=90_000)
    box.press_sequentially("sparsemax")
    results = v.page.locator(".md-search-result__item a")
    results.first.wait_for(timeout=60_000)
    hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    assert any(page in h for h in hrefs for page in ("concepts/stages.html", "api/core.html")), hrefs
    results.first.click()
    v.page.wait_for_load_state()
    assert "sparsemax" in v.page.locator("article").inner_text().lower()
    assert v.errors == [] and v.outside(served) == []


def test_the_site_opens_from_files(browser, site):
    v = Visit(browser)
    v.page.goto((site / "index.html").as_uri())
    v.page.locator("nav.md-nav--primary a", has_text="Captioning").first.click()
    v.page.wait_for_url("**/apps/caption.html")
    assert heading(v).startswith("Image captioning")
    assert v.images_loaded()
    assert v.outside("file://") == []
