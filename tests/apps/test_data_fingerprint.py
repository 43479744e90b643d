"""A run keeps the fingerprint of the data it was trained and split on, and an evaluation that scores changed or
other data says so, naming the split it scores, in ``qkv evaluate`` and every application's ``--evaluate`` (one
shared ``evaluation``), never a silent "test" figure."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from qkv.apps import application, catalogue
from qkv.apps.base import ApplicationTask
from qkv.apps.fingerprint import data_fingerprint, data_note
from qkv.cli import main
from tests.helpers import SENTIMENT_TINY_TRANSFORMER, single_thread, write_reviews


class _Options:
    def __init__(self, data):
        self.data = data


def test_a_file_or_folder_has_a_fingerprint_and_generated_data_none(tmp_path):
    f = tmp_path / "a.tsv"
    f.write_text("x\t1\n", encoding="utf-8")
    assert data_fingerprint(_Options(str(f)))["sha256"] == data_fingerprint(_Options(str(f)))["sha256"]
    for name in ("dates", "facts", "digits", "scenes", "", None):
        assert data_fingerprint(_Options(name)) is None
    folder = tmp_path / "books"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "a.flac").write_bytes(b"12")
    before = data_fingerprint(_Options(str(folder)))
    (folder / "1" / "b.flac").write_bytes(b"3")
    assert data_fingerprint(_Options(str(folder)))["sha256"] != before["sha256"]
    kept = {"data": data_fingerprint(_Options(str(f)))}
    assert data_note(kept, _Options(str(f)), None, "test") is None
    copy = shutil.copy(f, tmp_path / "copy.tsv")
    assert data_note(kept, _Options(str(f)), str(copy), "test") is None  # the same bytes elsewhere
    f.write_text("x\t0\n", encoding="utf-8")
    assert "changed since this run was trained" in data_note(kept, _Options(str(f)), None, "valid")
    assert "'valid' split" in data_note(kept, _Options(str(f)), None, "valid")
    assert "scoring 'test' of" in data_note(kept, _Options(str(f)), str(tmp_path / "other.tsv"), "test")
    assert data_note({}, _Options(str(f)), None, "test") is None  # a run that kept none: nothing to compare


@pytest.mark.parametrize("name", list(catalogue()))
def test_every_application_keeps_the_fingerprint_in_its_config(name):
    task_class = application(name).task
    assert issubclass(task_class, ApplicationTask) and task_class.config is ApplicationTask.config


@pytest.mark.slow
def test_evaluate_says_the_data_changed_or_is_another_and_names_the_split(tmp_path, capsys):
    data = write_reviews(tmp_path / "reviews.tsv", n=300)
    run = tmp_path / "run"
    with single_thread(), contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "sentiment", "--data", str(data), "--model", "transformer", "--epochs", "1",
                     *SENTIMENT_TINY_TRANSFORMER, "--out", str(run)]) == 0
    kept = json.loads((run / "best" / "config.json").read_text(encoding="utf-8"))["config"]["data"]
    assert kept["sha256"] == data_fingerprint(_Options(str(data)))["sha256"]
    capsys.readouterr()
    commands = [["evaluate", str(run)], ["evaluate", str(run), "--split", "valid"]]
    for argv in commands:
        assert main([*argv, "--device", "cpu"]) == 0
        assert "changed since" not in capsys.readouterr().err
    lines = data.read_text(encoding="utf-8").splitlines()  # every label flipped: the ratings negated
    flipped = [lines[0]] + ["\t".join([i, str(-float(r)), t]) for i, r, t in (x.split("\t") for x in lines[1:])]
    data.write_text("\n".join(flipped) + "\n", encoding="utf-8")
    for argv in commands:
        assert main([*argv, "--device", "cpu"]) == 0
        err = capsys.readouterr().err
        split = argv[-1] if argv[-2] == "--split" else "test"
        assert "qkv: warning:" in err and "changed since this run was trained" in err and f"'{split}' split" in err
    other = write_reviews(tmp_path / "other.tsv", n=120)
    assert main(["evaluate", str(run), "--data", str(other), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert f"of {other}, not of the data this run was trained on" in err
