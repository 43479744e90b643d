"""`qkv predict` on a tiny run of every application, and what every predicting command shares: inputs read one way
(`--file`: a blank line or a folder is a one-line error naming it), JSON written one way (never NaN), what was cut
said on stderr and in the rows, errors that advise only the command's own flags, and `qkv view` finding its viewer
by one lookup."""

import argparse
import json
import re
import shutil
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qkv.apps import ViewInput, catalogue
from qkv.apps.command import finish
from qkv.apps.console import read_lines, write_json
from qkv.cli import build_parser, main
from qkv.cli.view import HuggingFaceViewer, viewer_of

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(path: Path, size=(20, 24), seed=0) -> str:
    from PIL import Image

    Image.fromarray(np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8)).save(path)
    return str(path)


def _wav(path: Path, seconds=0.6, freq=440.0) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes())
    return str(path)


def _inputs(name: str, tmp_path: Path) -> list[str]:
    if name in ("translate", "summarize", "sentiment", "lm"):
        return ["7 mars 2019", "the plot was wonderful"]
    if name == "qa":
        return ["Marie Curie was born in 1867 in Warsaw.\tWhen was Marie Curie born?",
                "The tower is 300 metres high.\tHow high is the tower?"]
    if name == "speech":
        return [_wav(tmp_path / "a.wav"), _wav(tmp_path / "b.wav", 0.8, 300.0)]
    return [_png(tmp_path / "a.png"), _png(tmp_path / "b.png", (33, 17), 1)]


def _needs(name: str) -> None:
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")


def _strict(path: Path):
    def refuse(word):
        raise AssertionError(f"{path} holds {word}, which is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


@pytest.mark.parametrize("name", list(catalogue()))
@pytest.mark.slow
def test_predict_and_evaluate_every_application(name, tiny_run, tmp_path, capsys):
    _needs(name)
    run = tiny_run(name)
    given = _inputs(name, tmp_path)
    listed = tmp_path / "inputs.txt"
    listed.write_text("\n".join(given) + "\n", encoding="utf-8")
    assert main(["predict", str(run), given[0], "--file", str(listed), "--json", str(tmp_path / "p.json"),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = _strict(tmp_path / "p.json")
    assert len(rows) == 3 and len([line for line in out if not line.startswith("wrote ")]) == 3
    assert [r["input"] for r in rows] == [given[0], *given]
    assert all("output" in r or "text" in r or "label" in r or "answer" in r or "shares" in r for r in rows)
    assert main(["evaluate", str(run), "--max-examples", "2", "--json", str(tmp_path / "e.json"), "--device",
                 "cpu"]) == 0
    figures = _strict(tmp_path / "e.json")
    assert list(figures) == [run.name] and figures[run.name]


def test_a_blank_line_or_a_folder_given_as_file_is_named(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(str(blank))}:2: a blank line"):
        read_lines(str(blank))
    with pytest.raises(ValueError, match="is a directory"):
        read_lines(str(tmp_path))
    (tmp_path / "ok.txt").write_text("one\ntwo", encoding="utf-8")  # no newline at the end: still two lines
    assert read_lines(str(tmp_path / "ok.txt")) == ["one", "two"]


def _file_commands():
    parser = build_parser()

    def walk(p, path=()):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))
        if any(a.dest == "file" for a in p._actions):
            positionals = ["no-such-run" for a in p._actions if not a.option_strings and a.nargs in (None, "+")]
            yield pytest.param([*path, *positionals], id=" ".join(path))

    return list(walk(parser))


@pytest.mark.parametrize("command", _file_commands())
def test_every_file_option_refuses_a_blank_line_and_a_folder_before_any_work(command, tmp_path, capsys):
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n", encoding="utf-8")
    assert main([*command, "--file", str(blank)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{blank}:2: a blank line" in err
    assert main([*command, "--file", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{tmp_path} is a directory" in err and "--file" in err


@pytest.mark.parametrize("command,what", [(["caption"], "image file"), (["segment"], "image file"),
                                          (["show-attention"], "image file"), (["transcribe"], "audio file")])
def test_a_folder_given_as_an_input_file_is_a_directory_not_missing(command, what, tmp_path, capsys):
    assert main([*command, "no-such-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"qkv: error: {tmp_path} is a directory, not an {what}"
    assert main([*command, "no-such-run", str(tmp_path / "gone.png")]) == 2
    assert f"no {what} {tmp_path / 'gone.png'}: no such file" in capsys.readouterr().err


def test_json_is_written_one_way_and_never_holds_nan(tmp_path, capsys):
    path = tmp_path / "f.json"
    write_json(str(path), {"run": {"bleu": float("nan"), "loss": float("inf"), "n": 3}, "rows": [1.0, -float("inf")]})
    assert _strict(path) == {"run": {"bleu": None, "loss": None, "n": 3}, "rows": [1.0, None]}
    captured = capsys.readouterr()
    assert f"wrote {path}" in captured.out
    assert "written as null: run.bleu, run.loss, rows[1]" in captured.err
    # no command writes JSON another way
    root = Path(__file__).parents[2] / "qkv"
    commands = [*(root / "cli").glob("*.py"), *(root / "apps").glob("*/command.py"), root / "apps" / "console.py"]
    writers = [p.name for p in commands if "json.dumps" in p.read_text() or ".write_text(json" in p.read_text()]
    assert writers == ["console.py"]


def test_what_was_cut_is_said_on_stderr_and_in_the_rows(tmp_path, capsys):
    from qkv.apps.summarize import Summarizer

    summarizer = SimpleNamespace(task="summarize", result_row=lambda r: {"output": r.text, "cut": r.cut},
                                 note=lambda r, settings: Summarizer.note(None, r, settings))
    long = SimpleNamespace(text="a summary", cut=170_000, source_tokens=["w"] * 120, stopped="end", decoded=[])
    short = SimpleNamespace(text="another", cut=0, source_tokens=["w"] * 3, stopped="end", decoded=[])
    rows = finish(summarizer, ["a very long text", "short"], [long, short], str(tmp_path / "s.json"))
    err = capsys.readouterr().err
    assert "qkv: warning: a very long text: the source was cut to its first 120 words" in err and "170000" in err
    assert "short" not in err and "note" in rows[0] and "note" not in rows[1]
    assert "cut to its first 120 words" in _strict(tmp_path / "s.json")[0]["note"]
    from qkv.apps.speech import Transcriber

    speech = Transcriber.__new__(Transcriber)
    stopped = SimpleNamespace(tokens=list("x" * 12), stopped="max_len")
    assert "stopped at 12 characters" in speech.note(stopped, {"max_len": 12})
    assert speech.note(SimpleNamespace(tokens=list("xy"), stopped="end"), {"max_len": 12}) is None


@pytest.mark.slow
def test_transcripts_and_summaries_cut_on_a_real_run_are_said(tiny_run, tmp_path, capsys):
    run = tiny_run("summarize")
    long = " ".join(["the tool called dokute runs"] * 400)
    assert main(["summarize", str(run), long, "--json", str(tmp_path / "s.json"), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "qkv: warning:" in captured.err and "more were not read" in captured.err
    assert "more were not read" in _strict(tmp_path / "s.json")[0]["note"]


@pytest.mark.slow
def test_transcribe_writes_its_json_rows(tiny_run, tmp_path, capsys):
    """`qkv transcribe AUDIO --json F` writes the transcripts (it once wrote nothing); `--json` is never ignored."""
    _needs("speech")
    audio = _wav(tmp_path / "a.wav", 1.0)
    assert main(["transcribe", str(tiny_run("speech")), audio, "--json", str(tmp_path / "t.json"), "--device",
                 "cpu"]) == 0
    (row,) = _strict(tmp_path / "t.json")
    assert row["input"] == audio and "output" in row
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 't.json'}"


def test_errors_name_only_flags_the_command_has(tmp_path, monkeypatch, capsys):
    """A library's advice never names a flag the user cannot give to this command: an error that names options
    (OptionError, option_error) writes an option the command has as its flag, one it lacks as the option's name."""
    import qkv.cli.view as view_cli
    from qkv.options import OptionError, option_error, ref

    named = OptionError("bad {x!r}: " + ref("index") + " or " + ref("source_column") + " (" + ref("on_error") +
                        " skip)", "index", "source_column", "on_error", x="{braces}")
    assert str(named) == "bad '{braces}': index or source_column (on_error skip)"  # the library's words
    taken = option_error(FileExistsError, ref("out") + " is taken; " + ref("max_minutes") + " is not the cause", "out",
                         "max_minutes")
    assert isinstance(taken, FileExistsError) and str(taken) == "out is taken; max_minutes is not the cause"
    for error, line in ((named, "bad '{braces}': --index or source_column (on_error skip)"),
                        (taken, "--out is taken; max_minutes is not the cause")):
        def refuse(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(view_cli, "viewer_of", refuse)
        assert main(["view", str(tmp_path), "a text", "--out", str(tmp_path / "p.html")]) == 2
        assert capsys.readouterr().err.strip() == f"qkv: error: {line}"


def _flags_of(argv: list[str]) -> set[str]:
    """The option strings of the command ``qkv ARGV`` (its parser's and the global ones)."""
    parser = build_parser(argv)
    flags = {s for a in parser._actions for s in a.option_strings}
    for word in argv:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if action is None or word not in action.choices:
            break
        parser = action.choices[word]
        flags |= {s for a in parser._actions for s in a.option_strings}
    return flags


@pytest.mark.slow
def test_errors_advise_no_flag_the_command_lacks(tiny_run, tmp_path, capsys):
    """Errors triggered on purpose (bad data files, options, inputs): every --flag they name is the command's."""
    bad_columns = tmp_path / "bad.csv"
    bad_columns.write_text("a,b\n1,2\n", encoding="utf-8")
    bad_tsv = tmp_path / "bad.tsv"
    bad_tsv.write_text("context\tquestion\tanswer\nshort\twhat?\tnowhere\n", encoding="utf-8")
    cases = [["evaluate", str(tiny_run("summarize")), "--data", str(bad_columns)],
             ["summarize", str(tiny_run("summarize")), "--evaluate", str(bad_columns)],
             ["evaluate", str(tiny_run("qa")), "--data", str(bad_tsv)],
             ["evaluate", str(tiny_run("translate")), "--on-error", "skip"],
             ["evaluate", str(tiny_run("translate")), "--split", "train"],
             ["predict", str(tiny_run("qa")), "no tab here"],
             ["view", str(tiny_run("qa")), "a context without its question"]]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error:") and "\n" not in err, err
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", err))
        assert named <= _flags_of(argv), (argv, err)


def test_view_finds_its_viewer_by_one_lookup(tiny_run, tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    viewer = viewer_of(str(hf), "cpu")
    assert isinstance(viewer, HuggingFaceViewer)
    with pytest.raises(ValueError, match="texts only"):
        viewer.view(ViewInput(index=0))
    assert main(["view", str(hf), "--index", "0", "--out", str(tmp_path / "p.html")]) == 2
    assert "texts only" in capsys.readouterr().err
    assert viewer_of(str(tiny_run("translate")), "cpu").task == "translate"


@pytest.mark.parametrize("command, older", [("summarize", "--limit"), ("transcribe", "--max-utterances"),
                                            ("caption", "--max-images"), ("segment", "--max-images")])
def test_an_older_flag_name_is_in_the_help_as_one(command, older, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert f"({older}:itsoldername)" in "".join(capsys.readouterr().out.split())  # (the help wraps at a dash)
    assert build_parser([command]).parse_known_args([command, "run", older, "3"])[0].limit == 3
