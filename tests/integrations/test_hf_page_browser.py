"""The attention page of a saved Hugging Face model (``qkv view DIR "text"``) in a real browser: headless Chromium
driven by Playwright, as tests/viz/test_page_browser.py does for qkv's own models.

Skips with the reason when transformers, Playwright or Chromium is missing.
"""

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

from qkv.integrations.transformers_view import view_page_input  # noqa: E402
from qkv.viz.page import save_attention_page  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402
from tests.viz.test_page_browser import CHROMIUM, Opened, browser, not_blank  # noqa: E402,F401

pytestmark = [pytest.mark.skipif(not CHROMIUM, reason="no Chromium here (apt-get install chromium)"),
              pytest.mark.xdist_group("browser")]


@pytest.mark.parametrize("name", list(hf.MODELS))
@pytest.mark.slow
def test_the_page_of_a_saved_model_draws_every_attention(browser, tmp_path, name, one_thread):  # noqa: F811
    hf.save(name, tmp_path / name)
    view = view_page_input(tmp_path / name, "the big cat sat on a red mat")
    page_path = save_attention_page(tmp_path / f"{name}.html", view.records, **view.page_kwargs())
    with Opened(browser, page_path) as opened:
        opened.check_clean()
        page = opened.page
        assert not_blank(page.locator("#view").screenshot())
        names = page.locator("#attention option").all_inner_texts()
        assert len(names) >= len(view.records)  # every record, and the rollouts
        if name == "bart":
            assert any("encoder_attn" in n for n in names)
        drawn = set()
        for i in range(len(names)):
            page.select_option("#attention", index=i)
            assert page.locator("#view *").count() > 3
            drawn.add(opened.drawn())
        assert len(drawn) == len(names)  # each attention draws its own weights
        page.select_option("#attention", index=0)
        page.select_option("#view-kind", "lines")
        tokens = page.locator("#view text.tok").all_text_contents()
        assert {"big", "cat", "mat"} <= set(tokens)
        opened.check_clean()
