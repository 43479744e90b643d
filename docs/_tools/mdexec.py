"""The code blocks of the documentation's Markdown pages: found, run, and checked.

Used by the site's build hook (``docs/_tools/hooks.py``: pages whose front matter says ``execute: true`` are run
while the site is built, and the pictures their code writes become part of the site) and by the tests
(``tests/docs/test_examples.py``: every page's blocks run in ``make test``).

Conventions, written once here:

- A ```` ```python ```` block runs. The blocks of one page run in order, in one namespace, in a fresh working
  directory, on one CPU thread, with matplotlib's ``Agg`` backend.
- An HTML comment on the line before a block, ``<!-- not run: REASON -->``, keeps it from running (the reason is
  required: it is what the tests report).
- A ```` ```sh ```` block holds command lines. Every line that starts with ``qkv `` is parsed by ``qkv``'s own
  parser with the options classes' checks (an unknown flag or a bad value fails the tests); a block preceded by
  ``<!-- run -->`` is also run, line by line, with ``qkv.cli.main`` (keep those to seconds).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w+)?[^\n]*\n(.*?)^```\s*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*(not run|run)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass
class Block:
    """One fenced code block of a page."""

    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    directive: str | None = None  # "run" or "not run"
    reason: str | None = None

    @property
    def runs(self) -> bool:
        return self.lang == "python" and self.directive != "not run"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with the directive of the comment just above each one."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rpartition("\n")[2]
        d = DIRECTIVE.search(before)
        block = Block(m.group(1) or "", m.group(2), line, d.group(1) if d else None, d.group(2) if d else None)
        if block.directive == "not run" and not block.reason:
            raise ValueError(f"line {line}: '<!-- not run -->' needs a reason: '<!-- not run: REASON -->'")
        out.append(block)
    return out


def front_matter(text: str) -> dict[str, str]:
    """The ``key: value`` lines of a page's YAML front matter (flat values only)."""
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    if not m:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in m.group(1).splitlines()) if k}


def commands(block: Block) -> list[str]:
    """The ``qkv ...`` command lines of a shell block (continuations joined, comments dropped), without ``qkv``."""
    joined = re.sub(r"\\\n\s*", " ", block.code)
    out = []
    for line in joined.splitlines():
        line = re.split(r"\s#\s", line, maxsplit=1)[0].strip()
        if line.startswith("qkv "):
            out.append(line[4:])
    return out


@contextlib.contextmanager
def _quiet_environment(workdir: Path):
    import torch

    os.environ.setdefault("MPLBACKEND", "Agg")
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()  # a page may switch gradients off
    torch.set_num_threads(1)
    old = Path.cwd()
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(old)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
        with contextlib.suppress(ImportError):
            import matplotlib.pyplot as plt

            plt.close("all")


def run_page(path: Path, workdir: Path, *, text: str | None = None) -> list[Block]:
    """Run the Python blocks of the page at ``path`` in ``workdir`` (in order, one namespace); returns them.
    An exception names the page and the line of the block's fence."""
    text = path.read_text(encoding="utf-8") if text is None else text
    ran = []
    namespace = {"__name__": f"docs:{path.name}"}
    with _quiet_environment(workdir):
        for block in blocks(text):
            if not block.runs:
                continue
            # the code is compiled with its page's line numbers, so a traceback points into the page
            code = compile("\n" * block.line + block.code, f"{path}", "exec")
            exec(code, namespace)
            ran.append(block)
    return ran
