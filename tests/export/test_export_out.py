"""Where ``qkv export`` writes: never inside the run (its folder, or a checkpoint's, whichever the run is named
by), and an export over an earlier one leaves none of its files behind, a user's own files kept."""

from __future__ import annotations

import json
import shutil

import pytest

from qkv.cli import main

pytestmark = pytest.mark.slow  # an export traces a model (seconds)
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_out_inside_the_run_is_refused_and_the_run_untouched(tiny_run, tmp_path, capsys):
    run = shutil.copytree(tiny_run("sentiment"), tmp_path / "run")
    before = _files(run)
    for named, out in [(run, run / "best"), (run, run), (run, run / "checkpoint" / "onnx"), (run, run / "onnx"),
                       (run / "best", run / "best"), (run / "best", run), (run / "best", run / "exported"),
                       (run / "checkpoint", run / "best")]:
        assert main(["export", str(named), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"qkv: error: --out {out}: inside the run") and "\n" not in err, err
        assert "same file" not in err
    assert _files(run) == before


def test_an_export_over_another_leaves_none_of_its_files(tiny_run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["export", str(tiny_run("translate")), "--out", str(out)]) == 0
    first = json.loads((out / "export.json").read_text(encoding="utf-8"))
    (out / "mine.txt").write_text("a user's own file", encoding="utf-8")
    assert main(["export", str(tiny_run("sentiment")), "--out", str(out)]) == 0
    second = json.loads((out / "export.json").read_text(encoding="utf-8"))
    written = {g["file"] for g in second["graphs"].values()} | set(second["assets"])
    assert {g["file"] for g in first["graphs"].values()} - written  # the translation wrote graphs it does not
    top = {p.name for p in out.iterdir()}
    assert top == written | {"export.json", "config.json", "mine.txt"}, top
    # an export that fails after clearing leaves no manifest naming files that are gone
    import qkv.apps.export as export

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "to_onnx", broken)
    assert main(["export", str(tiny_run("translate")), "--out", str(out)]) == 2
    capsys.readouterr()
    assert not (out / "export.json").exists() and (out / "mine.txt").exists()
