"""A griffe extension for the API reference (``mkdocs.yml``: mkdocstrings' ``extensions``): qkv's docstrings are
written for ``help()`` and Sphinx, the reference renders them as Markdown.

- Sphinx roles (``:class:`~qkv.layers.SelfAttention```, ``:func:`attention```, ``:meth:`Translator.predict```)
  become cross-references: links to the object's entry where the reference shows it, its name in code otherwise.
  A bare name is looked up where the docstring is, as Python would.
- Interactive examples (``>>>`` lines and their output) become a highlighted Python block, the output as comments,
  in place of Markdown's nested quotes; reStructuredText's literal blocks (``Example::`` and an indented block)
  become fenced blocks too (Python where the block parses as Python).
"""

from __future__ import annotations

import ast
import html
import re
import textwrap

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|mod|func|meth|attr|data|exc|obj|const|type):`(?P<text>[^`]+)`")
PROMPT = re.compile(r"^(?P<indent>\s*)>>> ?")
DOCTEST_FLAG = re.compile(r"\s*#\s*doctest:.*$")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as seen from ``obj`` (unchanged when it cannot be found)."""
    name = name.lstrip(".")
    if name.startswith("qkv."):
        return name
    head, _, rest = name.partition(".")
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            found = scope.resolve(head)
        except Exception:  # noqa: BLE001 - griffe's NameResolutionError, or an alias it cannot follow
            continue
        return f"{found}.{rest}" if rest else found
    return name


def roles_to_links(text: str, obj: griffe.Object) -> str:
    """``:class:`~a.B``` -> an optional autoref to ``a.B`` titled ``B`` (its full name without the ``~``)."""

    def link(m: re.Match) -> str:
        text = m["text"].strip()
        title, _, explicit = text.partition("<")
        if explicit:  # :class:`the title <a.B>`
            name, shown = explicit.rstrip(">").strip(), title.strip()
        else:
            name = text.lstrip("~")
            shown = name.lstrip(".").rsplit(".", 1)[-1] if text.startswith("~") else name.lstrip(".")
            if m["role"] in ("func", "meth"):
                shown += "()"
        ident = html.escape(_target(obj, name), quote=True)
        return f'<autoref identifier="{ident}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(link, text)


def examples_to_code(text: str) -> str:
    """Runs of ``>>>``/``...`` lines with their output -> a fenced Python block at the same indentation."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = PROMPT.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent = m["indent"]
        if out and out[-1].strip() and not out[-1].rstrip().endswith(":"):
            out.append("")  # a fence starts a block of its own
        out.append(f"{indent}```python")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            line = lines[i][len(indent):]
            if line.startswith(">>>") or line.startswith("..."):
                out.append(indent + DOCTEST_FLAG.sub("", line[4:]))
            else:
                out.append(f"{indent}# {line}")  # what the line before prints
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def literal_blocks_to_code(text: str) -> str:
    """``Intro::``, a blank line and an indented block -> ``Intro:`` and a fenced block at the intro's indentation."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.rstrip().endswith("::") or i >= len(lines) or lines[i].strip():
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1
        block = textwrap.dedent("\n".join(lines[i + 1:j]))
        if not block.strip():
            continue
        try:
            ast.parse(block.replace("...", "pass"))
            lang = "python"
        except SyntaxError:
            lang = "text"
        stripped = line.rstrip()[:-2].rstrip()
        out[-1] = (stripped + ":") if stripped.strip() and not stripped.endswith(" ") else stripped
        pad = " " * indent
        out += ["", f"{pad}```{lang}", *(pad + b if b else "" for b in block.split("\n")), f"{pad}```"]
        i = j
    return "\n".join(out)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


class SphinxToMarkdown(griffe.Extension):
    """Rewrites every docstring of a loaded package once its tree is complete (names can then be resolved)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and obj.docstring.value:
                value = literal_blocks_to_code(examples_to_code(obj.docstring.value))
                obj.docstring.value = roles_to_links(value, obj)
