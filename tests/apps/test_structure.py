"""What the application layer promises of its structure: generic modules never name an application, the command
line imports an application only when its command is used, a run's folder is resolved and its ``config.json`` read
once per command, and every application's declaration (``about.json``, read without importing it) matches what it
is."""

import ast
import json
import pathlib
import subprocess
import sys
from unittest import mock

import pytest

import qkv.train.checkpoint as checkpoint
from qkv.apps import application, catalogue
from qkv.cli import main
from tests import ROOT

GENERIC = ("cli", "export", "viz", "train")


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of ``tree`` that are code (docstrings left out)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def _imports(tree: ast.AST, package: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def test_no_generic_module_names_an_application():
    names = set(catalogue())
    found = []
    for folder in GENERIC:
        for path in sorted((ROOT / "qkv" / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
            where = path.relative_to(ROOT)
            found += [f"{where}:{c.lineno}: {c.value!r}" for c in _code_strings(tree) if c.value in names]
            found += [f"{where}: imports {m}" for m in _imports(tree, package)
                      if m.startswith("qkv.apps.") and m.split(".")[2] in names]
    assert found == []


def test_the_checker_sees_a_name_and_an_import(tmp_path):
    tree = ast.parse('"""translate is fine in a docstring."""\nfrom ..apps.speech import x\nif task == "translate":'
                     '\n    pass\n')
    assert [c.value for c in _code_strings(tree)] == ["translate"]
    assert "qkv.apps.speech" in _imports(tree, "qkv.cli")


def _apps_imported(argv: list[str]) -> list[str]:
    """The applications a fresh process has imported after ``qkv ARGV``."""
    code = ("import sys\nfrom qkv.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('imported:', *sorted({m.split('.')[2] for m in sys.modules if m.startswith('qkv.apps.')}))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, check=True)
    line = next(line for line in out.stdout.splitlines() if line.startswith("imported:"))
    return sorted(set(line.split()[1:]) & set(catalogue()))


@pytest.mark.parametrize("argv", [["--help"], ["predict", "--help"], ["train", "--help"], ["view", "--help"],
                                  ["evaluate", "--help"], ["export", "--help"]])
def test_help_imports_no_application(argv):
    assert _apps_imported(argv) == []


def test_a_command_imports_only_its_application():
    assert _apps_imported(["transcribe", "--help"]) == ["speech"]
    assert _apps_imported(["train", "lm", "--help"]) == ["lm"]


@pytest.mark.parametrize("name", list(catalogue()))
def test_about_matches_the_application(name):
    about, app = catalogue()[name], application(name)
    assert (about.help, about.commands) == (app.help, {c: cmd.help for c, cmd in app.commands.items()})
    folder = ROOT / "qkv" / "apps" / name
    for command in app.commands.values():  # an application's command lives in its own folder
        assert pathlib.Path(sys.modules[command.options.__module__].__file__).parent == folder
    if app.export is not None:
        assert pathlib.Path(sys.modules[app.export.__module__].__file__).parent == folder


def _counting():
    """Patches that count how often a run folder is resolved and a ``config.json`` is read."""
    resolved, read = [], []
    real_candidates, real_read_text, real_open = checkpoint._candidates, pathlib.Path.read_text, open

    def candidates(path, prefer):
        resolved.append(path)
        return real_candidates(path, prefer)

    def read_text(self, *args, **kwargs):
        if self.name == "config.json":
            read.append(self)
        return real_read_text(self, *args, **kwargs)

    def opening(file, *args, **kwargs):
        if pathlib.Path(str(file)).name == "config.json" and not isinstance(file, int):
            read.append(file)
        return real_open(file, *args, **kwargs)

    patches = [mock.patch.object(checkpoint, "_candidates", candidates),
               mock.patch.object(pathlib.Path, "read_text", read_text),
               mock.patch("builtins.open", opening)]
    return resolved, read, patches


@pytest.mark.slow
@pytest.mark.parametrize("command", ["view", "evaluate", "predict"])
def test_a_command_resolves_the_run_and_reads_its_config_once(command, tiny_run, tmp_path, capsys, one_thread):
    run = tiny_run("sentiment")
    argv = {"view": ["view", str(run), "a fine film", "--out", str(tmp_path / "p.html")],
            "evaluate": ["evaluate", str(run), "--max-examples", "2"],
            "predict": ["predict", str(run), "a fine film"]}[command]
    resolved, read, patches = _counting()
    with patches[0], patches[1], patches[2]:
        assert main(argv) == 0, capsys.readouterr().err
    assert len(resolved) == 1, resolved
    assert len([p for p in read if pathlib.Path(str(p)).parent.parent == run]) == 1, read


def test_abouts_are_data_packaged_with_qkv():
    """Each application's ``about.json`` is read without importing it, and ships in the wheel."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"qkv.apps" = ["*/about.json"]' in pyproject
    for name in catalogue():
        about = json.loads((ROOT / "qkv" / "apps" / name / "about.json").read_text(encoding="utf-8"))
        assert set(about) == {"help", "commands"} and about["help"]
