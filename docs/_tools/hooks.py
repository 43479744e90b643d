"""The site's build hook (``mkdocs.yml``: ``hooks``): pages made from the code while the site is built.

- ``reference/cli.md``: every ``qkv`` command, its usage, options and help, read from ``qkv.cli.build_parser()``
  (:mod:`cli_reference`), so the page says what ``--help`` says.
- The executed pages: every page under ``concepts/`` and ``apps/`` (and any page whose front matter says
  ``execute: true``; ``execute: false`` opts a page out) runs its Python blocks, and its ``<!-- run -->`` shell
  blocks, in order in one namespace (``mdexec``), and what each block prints and every figure it draws without
  saving it are shown under it (an output block, the figures as PNG files in ``outputs/`` beside the page).
  The files the code of an ``execute: true`` page writes (PNG, SVG, HTML, JSON) are added to the site beside it.
- The diagrams (:mod:`diagrams`): SVG drawings made with matplotlib, put beside the pages that show them.
- The formulas: ``$...$`` and ``$$...$$`` (``pymdownx.arithmatex``, generic mode) become SVG while the site is
  built (``ziamath``, pure Python, with its own STIX Two Math font), so a page shows its maths without a script,
  a web font or a request.
- ``tutorials/*.ipynb``: the tutorial scripts (jupytext's percent format) as notebooks to download.
"""

from __future__ import annotations

import html
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cli_reference  # noqa: E402
import diagrams  # noqa: E402
import mdexec  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

log = logging.getLogger("mkdocs.hooks.qkv")
OUTPUTS = {".png", ".svg", ".html", ".json"}
EXECUTED = ("concepts/", "apps/")  # the sections whose pages run and show their outputs
MAX_LINES = 60  # a longer output shows its first and last lines
#: the outputs of the executed pages (by the page's path under docs/), from on_files to on_page_markdown
_outputs: dict[str, list[mdexec.Output]] = {}


def _add(files, config, src_uri: str, content: str | bytes) -> None:
    old = files.get_file_from_path(src_uri)
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, src_uri, content=content))


def _executed(rel: str, text: str) -> bool:
    flag = mdexec.front_matter(text).get("execute")
    return flag == "true" or (flag != "false" and rel.startswith(EXECUTED))


def _figure_uri(rel: str, out: mdexec.Output, n: int) -> str:
    """Where the ``n``-th figure of a block goes, relative to the page (``outputs/PAGE-LINE-N.png``)."""
    return f"outputs/{Path(rel).stem}-{out.block.line}-{n}.png"


def on_files(files, config):
    docs = Path(config["docs_dir"])
    root = docs.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the qkv of this checkout
    _add(files, config, "reference/cli.md", cli_reference.markdown())
    for uri, svg in diagrams.all_diagrams().items():
        _add(files, config, uri, svg)
    _outputs.clear()
    for page in sorted(docs.rglob("*.md")):
        rel = page.relative_to(docs).as_posix()
        text = page.read_text(encoding="utf-8")
        if rel.startswith("_tools/") or not _executed(rel, text):
            continue
        parent = page.relative_to(docs).parent
        start, outputs = time.perf_counter(), []
        with tempfile.TemporaryDirectory(prefix="qkv-docs-") as tmp:
            mdexec.run_page(page, Path(tmp), text=text, outputs=outputs)
            made = []
            if mdexec.front_matter(text).get("execute") == "true":
                made = sorted(p for p in Path(tmp).rglob("*") if p.suffix in OUTPUTS and p.is_file())
            for p in made:
                _add(files, config, (parent / p.relative_to(tmp)).as_posix(), p.read_bytes())
        for out in outputs:
            for n, png in enumerate(out.figures, 1):
                _add(files, config, (parent / _figure_uri(rel, out, n)).as_posix(), png)
        _outputs[rel] = outputs
        log.info("ran %s: %d blocks, %d files in %.1f s", rel, len(outputs), len(made), time.perf_counter() - start)
    for script in sorted((docs / "tutorials").glob("*.py")):
        import jupytext

        notebook = jupytext.read(script)
        _add(files, config, f"tutorials/{script.stem}.ipynb", jupytext.writes(notebook, fmt="ipynb"))
    return files


def _shorten(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= MAX_LINES:
        return text
    head, tail = MAX_LINES * 2 // 3, MAX_LINES // 4
    return "\n".join([*lines[:head], f"... ({len(lines) - head - tail} more lines)", *lines[-tail:]])


def output_html(rel: str, out: mdexec.Output) -> str:
    """The output block shown under a block that ran: its printed text, then its figures."""
    parts = []
    if out.text:
        parts.append(f"<pre><code>{html.escape(_shorten(out.text))}</code></pre>")
    for n in range(1, len(out.figures) + 1):
        parts.append(f'<img src="{_figure_uri(rel, out, n)}" alt="the figure drawn by the code above">')
    if not parts:
        return ""
    return '<div class="qkv-output">\n' + "\n".join(parts) + "\n</div>"


def on_page_markdown(markdown, page, config, files):
    """Each block that ran is followed by what it showed (the page's text itself is left as it is)."""
    outputs = _outputs.get(page.file.src_uri)
    if not outputs:
        return markdown
    fences = list(mdexec.FENCE.finditer(markdown))
    for out in reversed(outputs):
        m = fences[out.index] if out.index < len(fences) else None
        if m is None or m.group(2) != out.block.code:
            log.warning("%s: the block at line %d moved; its output is not shown", page.file.src_uri, out.block.line)
            continue
        shown = output_html(page.file.src_uri, out)
        if shown:
            end = m.end()
            markdown = f"{markdown[:end].rstrip()}\n\n{shown}\n\n{markdown[end:].lstrip(chr(10))}"
    return markdown


MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
MATH_SIZE = 20.0  # the formulas are drawn at this size, then scaled to the text's
MATH_EM = 1.1  # STIX Two's letters are smaller than the text's sans-serif at the same size: 1.1em reads alike


def math_svg(tex: str, display: bool) -> str:
    """A formula as inline SVG, sized in ``em`` and sitting on the text's baseline, in the text's colour."""
    import ziamath

    math = ziamath.Latex(tex, size=MATH_SIZE, inline=not display, color="currentColor")
    svg = math.svg()
    box = math.node.bbox
    depth = math.margin - box.ymin  # below the baseline
    width, height = (box.xmax - box.xmin + 2 * math.margin), (box.ymax - box.ymin + 2 * math.margin)
    label = html.escape(tex.strip(), quote=True)
    em = MATH_EM / MATH_SIZE
    attrs = (f'class="qkv-math" role="img" aria-label="{label}" width="{width * em:.3f}em" '
             f'height="{height * em:.3f}em" style="vertical-align: {-depth * em:.3f}em"')
    svg = re.sub(r'^<svg ([^>]*?) width="[^"]*" height="[^"]*"', lambda m: f"<svg {m.group(1)} {attrs}", svg, count=1)
    return svg


def on_page_content(content, page, config, files):
    """``pymdownx.arithmatex``'s inline and display formulas -> SVG (one that does not parse is left as text)."""

    def render(m: re.Match) -> str:
        tag, body = m.group(1), html.unescape(m.group(2)).strip()
        display = tag == "div"
        tex = body[2:-2] if body[:2] in ("\\(", "\\[") else body
        try:
            svg = math_svg(tex, display)
        except Exception as e:  # noqa: BLE001 - ziamath raises several kinds on a formula it cannot read
            log.warning("%s: cannot draw the formula %r: %s", page.file.src_uri, tex, e)
            return m.group(0)
        return f'<div class="qkv-math-display">{svg}</div>' if display else svg

    return MATH.sub(render, content)
