"""Highlighted text: ANSI colours only when asked, valid self-contained HTML that escapes its input."""

from html.parser import HTMLParser

import pytest
import torch

from qkv.viz.text import HighlightedText, highlight_ansi, relative_weights, render_html, save_html, top_tokens

VOID = {"meta", "br", "img", "link", "input", "hr"}


class Checker(HTMLParser):
    """Collects tags, checks that they nest and close, and gathers the visible text of the token spans."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.tags, self.tokens, self.titles, self.errors = [], [], [], [], []
        self.in_token = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "span" and attrs.get("class") == "tok":
            self.in_token = True
            self.tokens.append("")
            self.titles.append(float(attrs["title"]))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "span":
            self.in_token = False

    def handle_data(self, data):
        if self.in_token:
            self.tokens[-1] += data


def parse(page: str) -> Checker:
    c = Checker()
    c.feed(page)
    c.close()
    assert not c.errors and not c.stack, (c.errors, c.stack)
    return c


def test_html_is_valid_and_self_contained():
    items = [HighlightedText(["A", "great", "film"], [0.1, 0.8, 0.1], caption="positive 0.970",
                             details=[("negative", "0.030"), ("positive", "0.970")]),
             HighlightedText(["Dull"], torch.tensor([1.0]), caption="negative 0.880")]
    page = render_html(items, title="Reviews")
    assert page.startswith("<!DOCTYPE html>")
    c = parse(page)
    assert c.tags[:2] == ["html", "head"] and "body" in c.tags
    assert c.tokens == ["A", "great", "film", "Dull"]
    assert c.titles == pytest.approx([0.1, 0.8, 0.1, 1.0])
    assert "script" not in c.tags and "link" not in c.tags and "src=" not in page  # nothing external, no code
    assert "rgb(255, 120, 0)" in page  # the top word is fully shaded


def test_html_escapes_the_input_text():
    evil = ['<script>alert("x")</script>', "&", '"><img src=x onerror=alert(1)>']
    page = render_html([HighlightedText(evil, [0.2, 0.3, 0.5], caption="<b>caption</b>",
                                        details=[("<i>", "</div>")])], title="<script>t</script>")
    c = parse(page)
    assert "script" not in c.tags and "img" not in c.tags and "b" not in c.tags and "i" not in c.tags
    assert c.tokens == evil  # shown as text, exactly
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_save_html(tmp_path):
    path = save_html(tmp_path / "sub" / "out.html", [HighlightedText(["été", "好"], [0.5, 0.5])])
    text = path.read_text(encoding="utf-8")
    assert "été" in text and "好" in text and '<meta charset="utf-8">' in text


def test_ansi_colours_only_when_asked():
    coloured = highlight_ansi(["a", "great", "film"], [0.01, 0.9, 0.3])
    assert "\x1b[" in coloured and coloured.count("\x1b[0m") == 2  # "a" is below the threshold: plain
    assert coloured.startswith("a ")
    plain = highlight_ansi(["a", "great", "film"], [0.01, 0.9, 0.3], color=False)
    assert plain == "a great film"


def test_weights_helpers_and_errors():
    assert relative_weights([0.2, 0.4, 0.0]) == [0.5, 1.0, 0.0]
    assert relative_weights([0.0, 0.0]) == [0.0, 0.0]
    assert top_tokens(["a", "b", "c"], [0.2, 0.5, 0.3], 2) == [("b", 0.5), ("c", 0.3)]
    with pytest.raises(ValueError, match="2 tokens but 3 weights"):
        HighlightedText(["a", "b"], [0.1, 0.2, 0.7])
    with pytest.raises(ValueError, match="one number per token"):
        HighlightedText(["a", "b"], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(TypeError):
        render_html([("a", 1.0)])
