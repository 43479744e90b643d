"""The application of CONTRIBUTING.md's guide, ``examples/toy_application.py`` (a tokenizer and one setting, in one
file), registered and run through the command line: train, predict, evaluate, view and export, with nothing else
written. The guide shows that very file."""

import importlib.util
import json
import re

import pytest

from qkv.apps import register_application, unregister_application
from qkv.cli import main
from tests import ROOT

EXAMPLE = ROOT / "examples" / "toy_application.py"


@pytest.fixture
def toy():
    spec = importlib.util.spec_from_file_location("toy_application", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the application
    yield module
    unregister_application("toy")


def test_the_guide_shows_the_example_whole():
    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks
    assert len(EXAMPLE.read_text(encoding="utf-8").splitlines()) < 120


def test_the_toy_trains_predicts_evaluates_views_and_exports(toy, tmp_path, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", "toy", "--n", "60", "--epochs", "4", "--no-progress", "--out", str(run)]) == 0
    assert json.loads((run / "best" / "config.json").read_text())["task"] == "toy"
    assert (run / "best" / "assets" / "tokenizer").is_dir()  # the tokenizer kept by the base
    predictor = toy.ToyPredictor.load(run, "cpu")
    capsys.readouterr()
    assert main(["predict", str(run), "one seven two", "four four", "--threshold", "0.3"]) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    want = [predictor.result_row(r)["output"] for r in predictor.predict(["one seven two", "four four"],
                                                                          threshold=0.3)]
    assert printed == [["one seven two", want[0]], ["four four", want[1]]]
    assert main(["evaluate", str(run), "--threshold", "0.9", "--json", str(tmp_path / "f.json")]) == 0
    figures = json.loads((tmp_path / "f.json").read_text())["run"]
    assert figures["accuracy"] == pytest.approx(predictor.evaluate(threshold=0.9)["accuracy"])
    assert figures["accuracy"] != pytest.approx(predictor.evaluate(threshold=0.0)["accuracy"]) or \
        predictor.evaluate(threshold=0.0)["accuracy"] in (0.0, 1.0)
    assert main(["view", str(run), "five seven", "--out", str(tmp_path / "p.html")]) == 0
    assert "attention" in (tmp_path / "p.html").read_text(encoding="utf-8").lower()
    pytest.importorskip("onnx")
    assert main(["export", str(run), "--out", str(tmp_path / "onnx")]) == 0
    assert json.loads((tmp_path / "onnx" / "export.json").read_text())["application"] == "toy"


def test_the_toy_setting_is_checked(toy, tmp_path, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", "toy", "--n", "30", "--epochs", "1", "--no-progress", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["predict", str(run), "one", "--threshold", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "threshold" in err and "\n" not in err.strip()
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(run), "one", "--beam", "3"])
    assert stop.value.code == 2
    assert "--beam is not a setting of toy runs (their settings: threshold)" in capsys.readouterr().err
    predictor = toy.ToyPredictor.load(run, "cpu")
    with pytest.raises(ValueError, match="beam does not apply to toy runs"):
        predictor.check_settings({"beam": 3})


def test_a_name_is_registered_once(toy):
    with pytest.raises(ValueError, match="already called 'toy'"):
        register_application(toy.APPLICATION)
    with pytest.raises(ValueError, match="not a registered application"):
        unregister_application("translate")


def test_qkv_apps_names_the_file_for_the_command_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "QKV_APPS": str(EXAMPLE)}
    out = subprocess.run([sys.executable, "-m", "qkv", "train", "toy", "--help"], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0 and "--threshold" not in out.stdout and "--dim" in out.stdout, out.stderr
    env["QKV_APPS"] = str(tmp_path / "missing.py")
    out = subprocess.run([sys.executable, "-m", "qkv", "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and out.stderr.strip() == f"qkv: error: QKV_APPS: cannot import {env['QKV_APPS']} " \
        f"(FileNotFoundError: no such file: {env['QKV_APPS']})"
