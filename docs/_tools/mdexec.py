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
- While the site is built (``run_page(..., outputs=[...])``), what each block prints (standard output and error)
  and every matplotlib figure it leaves open without saving it is recorded, to be shown under the block; a figure
  the code saves (``fig.savefig("x.png")``) is shown where the page's text puts ``![...](x.png)``, not twice.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from dataclasses import dataclass, field
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


@dataclass
class Output:
    """What one block showed when it ran: ``index`` is its place among the page's blocks (``blocks(text)``)."""

    index: int
    block: Block
    text: str = ""
    figures: list[bytes] = field(default_factory=list)  # PNG files, in the order the figures were made


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


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Figures:
    """Tells the figures a block saved itself (shown by the page's text) from those it only drew (shown under it)."""

    def __init__(self):
        self.seen: set[int] = set()  # ids of figures saved or already shown
        self._original = None

    def __enter__(self):
        try:
            from matplotlib.figure import Figure
        except ImportError:
            return self
        original, seen = Figure.savefig, self.seen

        def savefig(fig, *args, **kwargs):
            seen.add(id(fig))
            return original(fig, *args, **kwargs)

        self._original, Figure.savefig = original, savefig
        return self

    def __exit__(self, *exc):
        if self._original is not None:
            from matplotlib.figure import Figure

            Figure.savefig = self._original

    def new(self) -> list[bytes]:
        """The open figures not saved nor shown yet, as PNG; they are closed."""
        import sys

        if "matplotlib.pyplot" not in sys.modules:
            return []
        import matplotlib.pyplot as plt

        out = []
        for number in plt.get_fignums():
            fig = plt.figure(number)
            if id(fig) in self.seen:
                continue
            buf = io.BytesIO()
            self._original(fig, buf, format="png", dpi=100, bbox_inches="tight")
            self.seen.add(id(fig))
            out.append(buf.getvalue())
            plt.close(fig)
        return out


def _run_commands(block: Block) -> None:
    from qkv.cli import main

    for command in commands(block):
        code = main(shlex.split(command))
        if code not in (0, None):
            raise RuntimeError(f"line {block.line}: 'qkv {command}' exited with {code}")


def run_page(path: Path, workdir: Path, *, text: str | None = None, outputs: list[Output] | None = None) -> list[Block]:
    """Run the Python blocks of the page at ``path`` in ``workdir`` (in order, one namespace); returns them.
    An exception names the page and the line of the block's fence.

    With ``outputs`` (a list), each block's printed text and new figures are appended to it as an :class:`Output`,
    and the shell blocks marked ``<!-- run -->`` are run too, their commands' output recorded the same way."""
    text = path.read_text(encoding="utf-8") if text is None else text
    ran = []
    namespace = {"__name__": f"docs:{path.name}"}
    with _quiet_environment(workdir), _Figures() as figures:
        for index, block in enumerate(blocks(text)):
            shell = outputs is not None and block.lang in ("sh", "bash", "console") and block.directive == "run"
            if not (block.runs or shell):
                continue
            printed = io.StringIO()
            with contextlib.ExitStack() as stack:
                if outputs is not None:
                    stack.enter_context(contextlib.redirect_stdout(printed))
                    stack.enter_context(contextlib.redirect_stderr(printed))
                if shell:
                    _run_commands(block)
                else:
                    # the code is compiled with its page's line numbers, so a traceback points into the page
                    code = compile("\n" * block.line + block.code, f"{path}", "exec")
                    exec(code, namespace)
            if outputs is not None:
                shown = ANSI.sub("", printed.getvalue()).rstrip()
                outputs.append(Output(index, block, shown, figures.new()))
            ran.append(block)
    return ran
