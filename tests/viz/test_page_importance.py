"""Head importance on the page: the layers x heads grid coloured by it, the table sorted by it, the note of what
each measure means; importance that names no record or has the wrong length is refused."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from qkv.capture import AttentionRecord
from qkv.viz.head_stats import MEASURES
from qkv.viz.page import attention_page, save_attention_page

CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _records(layers: int = 3, heads: int = 4, t: int = 6) -> list[AttentionRecord]:
    g = torch.Generator().manual_seed(0)
    return [AttentionRecord(f"blocks.{i}.attn", "Attention", "self", i,
                            torch.softmax(torch.randn(1, heads, t, t, generator=g), -1)) for i in range(layers)]


def _importance(layers: int = 3, heads: int = 4) -> dict[str, list[float]]:
    values = torch.arange(layers * heads, dtype=torch.float32).reshape(layers, heads) / 10 - 0.5
    return {f"blocks.{i}.attn": values[i].tolist() for i in range(layers)}


def _data(page: str) -> dict:
    start = page.index('id="qkv-data">') + len('id="qkv-data">')
    return json.loads(page[start:page.index("</script>", start)])


def test_importance_reaches_each_record_of_the_page_with_the_note_of_each_measure():
    data = _data(attention_page(_records(), importance=_importance()))
    got = {r["name"]: r.get("importance") for r in data["records"] if r["kind"] == "self"}
    assert got == {k: [round(v, 5) for v in vs] for k, vs in _importance().items()}
    assert data["measures"] == MEASURES
    assert "importance" not in _data(attention_page(_records()))["records"][0]


def test_importance_that_does_not_fit_the_records_is_refused():
    with pytest.raises(ValueError, match="not one of the records"):
        attention_page(_records(), importance={"other.attn": [0.0] * 4})
    with pytest.raises(ValueError, match="3 values for 4 heads"):
        attention_page(_records(), importance={"blocks.0.attn": [0.0] * 3})


@pytest.mark.skipif(not CHROMIUM, reason="no Chromium here (apt-get install chromium)")
def test_the_grid_is_coloured_by_importance_and_the_table_sorts_by_it(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    path = save_attention_page(tmp_path / "p.html", _records(), importance=_importance())
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri())
            cells = page.query_selector_all("#importance-grid .icell")
            assert len(cells) == 12
            colours = {c.get_attribute("data-rec") + "/" + c.get_attribute("data-head"):
                       c.evaluate("e => getComputedStyle(e).backgroundColor") for c in cells}
            assert colours["2/3"] == "rgb(255, 0, 0)"  # the largest rise: full red
            assert colours["0/0"] != colours["2/3"] and "255)" in colours["0/0"]  # a fall: blue
            page.click("#head-stats th[data-col=importance]")
            first = page.query_selector_all("#head-stats tbody tr")[0].inner_text().split("\t")
            assert first[:3] == ["blocks.2.attn", "2", "3"]
            notes = page.inner_text("#heads .hint")
            assert "importance: " + MEASURES["importance"] in notes
            assert errors == []
        finally:
            browser.close()
