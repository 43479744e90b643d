"""What the executed pages show: each code block of the concept and application pages is followed by what it
printed and drew (docs/_tools/hooks.py with mdexec's outputs), formulas are SVG drawn when the site is built, and
the concept pages' diagrams are part of the site.

The site tests skip with the reason when MkDocs (the docs extra) is not installed."""

from __future__ import annotations

import re
import sys

import pytest

from tests import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_tools"))
import mdexec  # noqa: E402

PAGE = """# A page

```python
print("first", 1 + 1)
```

Text.

```python
import matplotlib.pyplot as plt

fig, ax = plt.subplots()
ax.plot([0, 1], [1, 0])
fig.savefig("saved.png")          # shown by the page's text, not under the block
plt.subplots()[1].bar([0, 1], [2, 3])   # drawn, not saved: shown under the block
```

<!-- not run: an example of the convention -->
```python
raise RuntimeError
```

```python
x = 3
```
"""


def test_outputs_are_recorded_per_block(tmp_path):
    pytest.importorskip("matplotlib")
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    outputs = []
    ran = mdexec.run_page(page, tmp_path, outputs=outputs)
    assert len(ran) == 3 and [o.index for o in outputs] == [0, 1, 3]
    first, drawn, silent = outputs
    assert first.text == "first 2" and first.figures == []
    assert drawn.text == "" and len(drawn.figures) == 1 and drawn.figures[0].startswith(b"\x89PNG")
    assert (tmp_path / "saved.png").exists()
    assert silent.text == "" and silent.figures == []


def test_output_html_and_maths():
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("ziamath", reason="ziamath is not installed (pip install -e '.[docs]')")
    import hooks

    block = mdexec.Block("python", "print('<b>')\n", 12)
    shown = hooks.output_html("concepts/page.md", mdexec.Output(0, block, "<b>\n\nend", [b"png"]))
    assert shown.startswith('<div class="qkv-output">') and "&lt;b&gt;\n\nend" in shown
    assert '<img src="outputs/page-12-1.png"' in shown
    assert hooks.output_html("concepts/page.md", mdexec.Output(0, block)) == ""
    svg = hooks.math_svg(r"\sum_i a_i v_i", display=False)
    assert svg.startswith("<svg ") and 'class="qkv-math"' in svg and re.search(r'width="[0-9.]+em"', svg)
    assert "vertical-align: -" in svg and 'fill="currentColor"' in svg and "<text" not in svg


@pytest.mark.slow
@pytest.mark.xdist_group("browser")  # the same worker as the browser tests: one build of the site
def test_the_built_pages_show_outputs_maths_and_diagrams(site):
    stages = (site / "concepts" / "stages.html").read_text(encoding="utf-8")
    assert len(re.findall(r'<svg [^>]*class="qkv-math"', stages)) >= 10
    assert 'class="arithmatex"' not in stages and "\\(" not in re.sub(r"<pre\b.*?</pre>", "", stages, flags=re.S)
    # the normalisers' block prints the sparsemax weights: an output block right after the code block
    assert re.search(r'</code></pre></div>\s*<div class="qkv-output">\s*<pre><code>tensor\(\[\[0\.5667', stages)
    assert '<img alt="the three stages' in stages and (site / "concepts" / "stages.svg").stat().st_size > 10_000
    for page, svg in (("encoder-decoder", "context.svg"), ("vision", "se-cbam.svg")):
        assert f'src="{svg}"' in (site / "concepts" / f"{page}.html").read_text(encoding="utf-8")
        assert (site / "concepts" / svg).read_text(encoding="utf-8").lstrip().startswith("<?xml")
    explain = (site / "concepts" / "self-attention.html").read_text(encoding="utf-8")
    assert "qkv explain: the three stages" in explain  # a `<!-- run -->` shell block shows its output too
    for app in ("images", "qa", "summarize"):  # the application pages' blocks run and show what they print
        assert '<div class="qkv-output">' in (site / "apps" / f"{app}.html").read_text(encoding="utf-8"), app
