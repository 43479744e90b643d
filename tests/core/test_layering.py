"""The import layers of ``qkv/``: no import cycle, and no import from a lower layer into a higher one.

:data:`LAYERS` is the one place where the order is written. Data flows one way, core -> layers -> models -> train ->
apps -> cli (the architecture of ``docs/apps/training.md``), and the core itself is ordered: the observer point and
the small pieces at the bottom, then tiling, the scores, the execution paths, FlexAttention's path, the functions
that validate and dispatch, and the capture that subscribes to the observer point. ``data`` stands apart (it
imports no qkv module but the utilities); ``viz`` draws tensors and records and imports nothing above the core.

Every import counts: ``import a.b``, ``from .a import b``, at module level or inside a function (a late import
breaks a cycle at run time, not in the design). An import of a module's own parent package (``from .. import
hooks`` also loads ``qkv/__init__.py``) is not an edge: loading a submodule always loads its parents. Imports built
at run time (``importlib.import_module``) are not seen.

How it fails: adding ``from .capture import capture_attention`` to ``qkv/functional.py`` (an upward import) reports
``qkv.functional (core.functional) imports qkv.capture (core.capture), a higher layer or one it may not use``; an
import that closes a loop also reports the cycle and the edges that tie it
(:func:`test_the_checker_reports_cycles_and_upward_imports` shows both on a tiny package made for the test).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import ROOT as REPO  # noqa: E402

ROOT = REPO / "qkv"

#: layer -> (its modules: a package stands for all of its submodules, the root package for its __init__.py only;
#: the layers it may import, besides its own).
#: Whatever a layer may import, the layers above it may import as well (the relation is closed transitively).
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "util": (("qkv.options", "qkv.metrics"), ()),
    "core.base": (("qkv.hooks", "qkv.compiled", "qkv.compile_cache", "qkv.background", "qkv.memory", "qkv.masks",
                   "qkv.normalize", "qkv.mods", "qkv.mod_checks", "qkv.eager_form"), ()),
    "core.tiling": (("qkv.tiling",), ("core.base",)),
    "core.scores": (("qkv.scores", "qkv.location"), ("core.tiling",)),
    "core.paths": (("qkv.paths",), ("core.scores",)),
    "core.flex": (("qkv.flex",), ("core.paths",)),
    "core.table": (("qkv.path_table",), ("core.flex",)),  # the ordered table of paths, above every path
    "core.functional": (("qkv.functional",), ("core.table",)),
    "core.capture": (("qkv.capture",), ("core.functional",)),
    "data": (("qkv.data",), ("util",)),
    "viz": (("qkv.viz",), ("core.capture", "util")),
    "layers": (("qkv.layers", "qkv.vision"), ("core.capture",)),
    "api": (("qkv",), ("layers",)),  # the package's own exports (qkv/__init__.py)
    "models": (("qkv.models", "qkv.explain"), ("layers", "data", "util")),
    "train": (("qkv.train",), ("models",)),
    "export": (("qkv.export",), ("models", "api")),  # graphs of modules; a run's export is its application's
    "apps": (("qkv.apps", "qkv.integrations"), ("train", "viz", "export")),
    "notebook": (("qkv.notebook",), ("apps",)),  # the page of a run, a saved model or a model object
    "cli": (("qkv.cli", "qkv.__main__"), ("apps", "api", "export")),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """``module -> modules it imports`` among the modules of the package at ``root`` (every import statement)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # `from a import b` imports a.b when it is a module, else the name b of a
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r and r != mod and not mod.startswith(r + "."):  # a parent package: loaded anyway
                    edges[mod].add(r)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def layer_of(module: str, layers: dict) -> str | None:
    """The layer whose module list names ``module`` or its closest enclosing package."""
    best, depth = None, -1
    for layer, (mods, _) in layers.items():
        for m in mods:
            inside = "." in m and module.startswith(m + ".")  # the root package stands for itself only
            if (module == m or inside) and m.count(".") > depth:
                best, depth = layer, m.count(".")
    return best


def allowed(layers: dict) -> dict[str, set[str]]:
    """Each layer's importable layers, closed transitively (and itself)."""
    out = {}
    for layer in layers:
        seen, todo = {layer}, list(layers[layer][1])
        while todo:
            below = todo.pop()
            if below not in seen:
                seen.add(below)
                todo.extend(layers[below][1])
        out[layer] = seen
    return out


def cycle_problems(edges: dict[str, set[str]]) -> list[str]:
    """One line per import cycle, with the edges that tie it."""
    out = []
    for comp in cycles(edges):
        ties = [f"{a} -> {b}" for a in comp for b in sorted(edges[a] & set(comp))]
        out.append(f"import cycle of {len(comp)} modules: {', '.join(comp)} ({'; '.join(ties)})")
    return out


def layer_problems(edges: dict[str, set[str]], layers: dict) -> list[str]:
    """One line per module with no layer and per import of a higher (or unrelated) layer."""
    out = []
    may = allowed(layers)
    for mod in sorted(edges):
        here = layer_of(mod, layers)
        if here is None:
            out.append(f"{mod} has no layer: add it to LAYERS in tests/core/test_layering.py")
            continue
        for target in sorted(edges[mod]):
            there = layer_of(target, layers)
            if there is not None and there not in may[here]:
                out.append(f"{mod} ({here}) imports {target} ({there}), a higher layer or one it may not use")
    return out


def problems(root: Path, layers: dict) -> list[str]:
    edges = import_graph(root)
    return cycle_problems(edges) + layer_problems(edges, layers)


def test_no_import_cycles():
    found = cycle_problems(import_graph(ROOT))
    assert not found, "\n".join(found)


def test_no_import_from_a_lower_layer_into_a_higher_one():
    found = layer_problems(import_graph(ROOT), LAYERS)
    assert not found, "\n".join(found)


def test_every_layer_is_known_and_named_once():
    for layer, (_, below) in LAYERS.items():
        assert set(below) <= set(LAYERS), layer
    named = [m for mods, _ in LAYERS.values() for m in mods]
    assert len(named) == len(set(named))


def test_the_checker_reports_cycles_and_upward_imports(tmp_path):
    """A tiny package with a cycle (closed by an import inside a function) and an import from a lower layer into a
    higher one: the checker names both; with the two imports taken out it finds nothing."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from . import top\n",
        "low.py": "import math\n\ndef f():\n    from .sub import mid  # an upward import, inside a function\n",
        "sub/__init__.py": "",
        "sub/mid.py": "from .. import low\nfrom ..low import f\n",
        "top.py": "from .sub.mid import f\n",
        "a.py": "from . import low\nfrom .b import g\n",
        "b.py": "def g():\n    from .a import low  # closes the cycle a -> b -> a at run time\n    return low\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    layers = {
        "low": (("pkg.low",), ()),
        "mid": (("pkg.sub", "pkg.a", "pkg.b"), ("low",)),
        "top": (("pkg.top", "pkg"), ("mid",)),
    }
    found = problems(pkg, layers)
    assert any(p.startswith("import cycle of 2 modules: pkg.a, pkg.b") and "pkg.b -> pkg.a" in p for p in found)
    assert any("pkg.low (low) imports pkg.sub.mid (mid)" in p for p in found)
    assert len(found) == 3  # the two above, and pkg.low <-> pkg.sub.mid is itself a cycle
    assert any(p.startswith("import cycle of 2 modules: pkg.low, pkg.sub.mid") for p in found)

    (pkg / "low.py").write_text("import math\n")
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    assert problems(pkg, layers) == []
    (pkg / "c.py").write_text("")
    assert problems(pkg, layers) == ["pkg.c has no layer: add it to LAYERS in tests/core/test_layering.py"]
