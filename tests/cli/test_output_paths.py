"""Every command that writes a file prints exactly the path it wrote; a folder, a bare extension or an unknown format
is a one-line error naming the flag; a write that fails names the user's path, never a temporary file."""

import os

import pytest

from qkv.cli import main
from qkv.viz.files import page_path, picture_path, write_atomic


def test_picture_and_page_paths():
    assert str(picture_path("plots/noext")) == "plots/noext.png"
    assert str(picture_path("a.b/w.SVG")) == "a.b/w.SVG"
    assert str(page_path("out/page")) == "out/page.html"
    assert str(picture_path("plots/my.name.png")) == "plots/my.name.png"
    with pytest.raises(ValueError, match=r"--plot plots/ is a folder"):
        picture_path("plots/", option="--plot")
    with pytest.raises(ValueError, match=r"--plot plots/\.png has no file name"):
        picture_path("plots/.png", option="--plot")
    with pytest.raises(ValueError, match=r"--plot w\.xyz: \.xyz is not a format.*\.png"):
        picture_path("w.xyz", option="--plot")
    with pytest.raises(ValueError, match=r"--out x\.png: \.png is not a format"):
        page_path("x.png", option="--out")


def test_an_existing_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        picture_path(tmp_path, option="--plot")


@pytest.mark.parametrize("given, written", [("noext", "noext.png"), ("w.svg", "w.svg"), ("sub/dir/w", "sub/dir/w.png")])
def test_explain_prints_the_file_it_wrote(tmp_path, capsys, given, written):
    assert main(["explain", "--plot", str(tmp_path / given)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / written}" in out
    assert (tmp_path / written).is_file() and not (tmp_path / given).with_suffix("").is_dir()
    assert sorted(p.name for p in (tmp_path / written).parent.iterdir()) == [(tmp_path / written).name]


@pytest.mark.parametrize("given, message", [("plots/", "--plot .*plots/ is a folder"), ("w.xyz", "--plot .*xyz"),
                                            ("plots/.png", "--plot .*has no file name")])
def test_explain_refuses_bad_plot_paths_before_any_work(tmp_path, capsys, given, message):
    import re

    assert main(["explain", "--plot", str(tmp_path / given) + ("/" if given.endswith("/") else "")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("qkv: error:") and "\n" not in err and re.search(message, err)
    assert captured.out == "" and list(tmp_path.rglob("*.*")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_write_to_a_read_only_folder_names_the_path(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OSError, match=rf"cannot write {folder / 'x.html'} \(--out\)") as e:
            write_atomic(folder / "x.html", "<p>", option="--out")
        assert ".tmp-" not in str(e.value)
    finally:
        folder.chmod(0o700)


def test_write_over_a_folder_names_the_path(tmp_path):
    (tmp_path / "x.html").mkdir()
    with pytest.raises(OSError, match=rf"cannot write {tmp_path / 'x.html'} \(--out\)") as e:
        write_atomic(tmp_path / "x.html", "<p>", option="--out")
    assert ".tmp-" not in str(e.value) and [p.name for p in tmp_path.iterdir()] == ["x.html"]


def _picture_commands():
    """Every command with a picture flag (``--plot``, and ``--out`` of ``show-attention``), with its required
    positionals: a run that does not exist (the flag must be settled before any work)."""
    import argparse

    from qkv.cli import build_parser

    def walk(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))
        flags = {s for a in parser._actions for s in a.option_strings}
        flag = "--plot" if "--plot" in flags else "--out" if path == ("show-attention",) else None
        if flag and path[0] != "train":
            positionals = ["no-such-run" for a in parser._actions if not a.option_strings and a.nargs in (None, "+")]
            yield pytest.param([*path, *positionals], flag, id=" ".join(path))

    return list(walk(build_parser()))


@pytest.mark.parametrize("command,flag", _picture_commands())
def test_a_picture_path_that_cannot_be_written_names_the_flag_and_the_path(command, flag, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    target = blocker / "pictures" / "p.png"
    assert main([*command, flag, str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"qkv: error: {flag} {target}") and "(path)" not in err, err
    assert f"{blocker} is a file" in err and "no-such-run" not in err
    assert blocker.read_text() == "in the way"
