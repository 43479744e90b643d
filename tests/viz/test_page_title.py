"""A page's title is one short line: a long input (a 6,000-token prompt) is shortened there, its start and end kept,
in the page's ``<title>`` and its heading alike, for a page written directly and for ``qkv view`` of a run."""

from __future__ import annotations

import json
import re

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.viz.page import TITLE_MAX, attention_page, shortened_title


def _titles(text: str) -> tuple[str, str]:
    data = json.loads(re.search(r'id="qkv-data">(.*?)</script>', text, re.S).group(1))
    return re.search(r"<title>(.*?)</title>", text, re.S).group(1), data["title"]


def test_a_long_title_is_shortened_keeping_its_start_and_end():
    long = "start " + " ".join(f"w{i}" for i in range(6000)) + " end"
    short = shortened_title(long)
    assert len(short) == TITLE_MAX and "\u2026" in short
    assert short.startswith("start w0") and short.endswith("w5999 end")
    assert shortened_title("Tom chase Jerry") == "Tom chase Jerry"
    assert shortened_title("two\nlines\t here") == "two lines here"
    records = [qkv.AttentionRecord("enc.attn", "A", "self", 0, torch.softmax(torch.randn(1, 1, 4, 4), -1))]
    head, heading = _titles(attention_page(records, tokens=list("abcd"), title=long))
    assert len(heading) == TITLE_MAX and len(head) <= TITLE_MAX + 10 and heading.startswith("start")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sentiment", "translate", "lm"])
def test_qkv_view_of_a_long_input_has_a_short_title(name, tiny_run, tmp_path):
    words = " ".join(["the movie was long"] * (12 if name == "lm" else 200))
    page = tmp_path / "page.html"
    assert main(["view", str(tiny_run(name)), words, "--out", str(page), "--device", "cpu"]) == 0
    head, heading = _titles(page.read_text(encoding="utf-8"))
    assert len(heading) <= TITLE_MAX and heading.startswith("the movie was long")
