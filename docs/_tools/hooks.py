"""The site's build hook (``mkdocs.yml``: ``hooks``): pages made from the code while the site is built.

- ``reference/cli.md``: every ``qkv`` command, its usage, options and help, read from ``qkv.cli.build_parser()``
  (:mod:`cli_reference`), so the page says what ``--help`` says.
- The pictures of the pages whose front matter says ``execute: true``: their Python blocks run (``mdexec``) in a
  scratch directory, and every file they write there (PNG, SVG, HTML) is added to the site beside the page.
- ``tutorials/*.ipynb``: the tutorial scripts (jupytext's percent format) as notebooks to download.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cli_reference  # noqa: E402
import mdexec  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

log = logging.getLogger("mkdocs.hooks.qkv")
OUTPUTS = {".png", ".svg", ".html", ".json"}


def _add(files, config, src_uri: str, content: str | bytes) -> None:
    old = files.get_file_from_path(src_uri)
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, src_uri, content=content))


def on_files(files, config):
    docs = Path(config["docs_dir"])
    root = docs.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the qkv of this checkout
    _add(files, config, "reference/cli.md", cli_reference.markdown())
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if mdexec.front_matter(text).get("execute") != "true":
            continue
        rel = page.relative_to(docs).parent
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="qkv-docs-") as tmp:
            mdexec.run_page(page, Path(tmp), text=text)
            made = sorted(p for p in Path(tmp).rglob("*") if p.suffix in OUTPUTS and p.is_file())
            for p in made:
                _add(files, config, (rel / p.relative_to(tmp)).as_posix(), p.read_bytes())
        log.info("ran %s: %d files in %.1f s", page.relative_to(docs), len(made), time.perf_counter() - start)
    for script in sorted((docs / "tutorials").glob("*.py")):
        import jupytext

        notebook = jupytext.read(script)
        _add(files, config, f"tutorials/{script.stem}.ipynb", jupytext.writes(notebook, fmt="ipynb"))
    return files
