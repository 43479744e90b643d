"""The built site reads as Markdown, not as the reStructuredText the docstrings are written in: no raw Sphinx role
(``:class:`X```) and no ``>>>`` example shown as nested quotes, anywhere; the API reference links its cross-references
and highlights its examples; tables have no empty header bar. The conversion itself (``docs/_tools/griffe_sphinx.py``)
is tested on strings.

The site tests skip with the reason when MkDocs (the docs extra) is not installed."""

from __future__ import annotations

import re
import sys

import pytest

from tests import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_tools"))

RAW_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|const):(?:`|<code>)")
PRE = re.compile(r"<pre\b.*?</pre>", re.S)


def _pages(site):
    for path in sorted(site.rglob("*.html")):
        yield path.relative_to(site).as_posix(), path.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.xdist_group("browser")  # the same worker as the browser tests: one build of the site
def test_no_raw_role_and_no_quoted_prompt_in_the_site(site):
    found = []
    for name, html in _pages(site):
        prose = PRE.sub("", html)  # highlighted code may show a prompt
        found += [f"{name}: raw role {m.group(0)}" for m in RAW_ROLE.finditer(prose)]
        if "&gt;&gt;&gt;" in prose or re.search(r"<blockquote>\s*<blockquote>", prose):
            found.append(f"{name}: a >>> example rendered as nested quotes")
    assert not found, "\n".join(found[:40])


@pytest.mark.slow
@pytest.mark.xdist_group("browser")
def test_the_reference_links_and_highlights(site):
    layers = (site / "reference" / "api" / "layers.html").read_text(encoding="utf-8")
    # "a :class:`qkv.scores.Score` or a callable": a link to the entry of Score on the scores page
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="core\.html#qkv\.scores\.Score"', layers)
    # the example of Attention: a highlighted block, its code without prompts
    example = layers.split('id="qkv.layers.Attention"', 1)[1].split('id="qkv.layers.Attention.forward"', 1)[0]
    assert '<div class="highlight">' in example and "Attention" in PRE.findall(example)[0]


@pytest.mark.slow
@pytest.mark.xdist_group("browser")
def test_tables_have_headers_or_none(site):
    """A table written with an empty header row (`| | |`) shows no empty bar above its rows."""
    css = "\n".join(p.read_text(encoding="utf-8") for p in (site / "stylesheets").glob("*.css"))
    index = (site / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<thead>\s*<tr>\s*<th></th>", index), "the start page's first table changed: update the test"
    assert "thead:not(:has(th:not(:empty)))" in re.sub(r"\s+", "", css)


def test_roles_become_optional_links():
    griffe = pytest.importorskip("griffe", reason="griffe (the docs extra) is not installed")
    import griffe_sphinx

    module = griffe.Module("m")
    text = griffe_sphinx.roles_to_links("a :class:`~qkv.layers.SelfAttention`, :func:`qkv.attention` and "
                                        ":mod:`qkv.scores`", module)
    assert ":class:" not in text and ":func:" not in text and ":mod:" not in text
    assert '<autoref identifier="qkv.layers.SelfAttention" optional><code>SelfAttention</code></autoref>' in text
    assert '<autoref identifier="qkv.attention" optional><code>qkv.attention()</code></autoref>' in text
    assert '<autoref identifier="qkv.scores" optional><code>qkv.scores</code></autoref>' in text


def test_prompts_and_literal_blocks_become_fenced_code():
    pytest.importorskip("griffe", reason="griffe (the docs extra) is not installed")
    import griffe_sphinx

    doc = "Example:\n    >>> x = 1 + 1  # doctest: +SKIP\n    >>> x\n    2\n\nAfter."
    fenced = "Example:\n    ```python\n    x = 1 + 1\n    x\n    # 2\n    ```\n\nAfter."
    assert griffe_sphinx.examples_to_code(doc) == fenced
    doc = "Example::\n\n    import qkv\n    qkv.attention(q, k, v)\n\nA directory::\n\n    config.json   its settings\n"
    out = griffe_sphinx.literal_blocks_to_code(doc)
    assert out.startswith("Example:\n\n```python\nimport qkv\nqkv.attention(q, k, v)\n```\n")
    assert "A directory:\n\n```text\nconfig.json   its settings\n```" in out
