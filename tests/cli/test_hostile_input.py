"""Bad input as a careless or hostile user gives it: random bytes and truncations to every reader (speech manifests
and LibriSpeech folders too), random rows to the speech manifests, random option values to every command's parser,
damaged checkpoints, Ctrl-C. Each ends in success (with what was skipped counted) or one clear error naming the
file:line, never a traceback or a silently wrong result."""

import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qkv.apps.sentiment import SentimentClassifier
from qkv.apps.summarize.data import read_table_summaries
from qkv.cli import build_parser, main
from qkv.data.pairs import read_pairs
from qkv.data.speech import normalize_transcript, read_librispeech, read_manifest
from qkv.data.text_classification import read_movie_reviews, read_table
from qkv.train.checkpoint import atomic_directory, load_checkpoint
from tests import FIXTURES, ROOT

V1 = FIXTURES / "v1"
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

READERS = {
    "pairs": lambda p: list(read_pairs(p)),
    "reviews": lambda p: read_movie_reviews(p),
    "table": lambda p: read_table(p, text_col="text", label_col="label"),
    "summaries-csv": lambda p: read_table_summaries(p, fmt="csv"),
    "summaries-tsv": lambda p: read_table_summaries(p, fmt="tsv"),
    "manifest": lambda p: read_manifest(p),
    "manifest-skip": lambda p: read_manifest(p, on_error="skip"),
}


def _assert_clean(error: BaseException, path: Path) -> None:
    assert isinstance(error, ValueError | FileNotFoundError), f"{type(error).__name__}: {error}"
    assert str(path) in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(data=st.binary(max_size=300), compress=st.booleans())
def test_readers_take_random_bytes(reader, data, compress, tmp_path):
    path = tmp_path / ("x.tsv.gz" if compress else "x.tsv")
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        READERS[reader](path)
    except Exception as e:  # noqa: BLE001 - the property is about which errors come out
        _assert_clean(e, path)


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(cut=st.integers(min_value=2, max_value=400))  # 2 bytes: the gzip magic
def test_readers_take_truncated_gzip(reader, cut, tmp_path):
    good = "text\tlabel\n" + "".join(f"{i}\t{'pos' if i % 2 else 'neg'}\tsome words {i}\n" for i in range(40))
    whole = gzip.compress(good.encode())
    path = tmp_path / "x.tsv.gz"
    path.write_bytes(whole[: min(cut, len(whole) - 1)])
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        READERS[reader](path)
    _assert_clean(info.value, path)


@FUZZ
@given(data=st.binary(max_size=300), name=st.sampled_from(["m.csv", "m.tsv", "m.txt", "m.jsonl"]))
def test_manifests_and_librispeech_take_random_bytes(data, name, tmp_path):
    manifest = tmp_path / name
    manifest.write_bytes(data)
    trans = tmp_path / "ls" / "1" / "2" / "1-2.trans.txt"
    trans.parent.mkdir(parents=True, exist_ok=True)
    trans.write_bytes(data)
    for read, path in ((read_manifest, manifest), (read_librispeech, tmp_path / "ls")):
        for on_error in ("raise", "skip"):
            try:
                utterances, skipped = read(path, on_error=on_error)
            except Exception as e:  # noqa: BLE001 - the property is about which errors come out
                _assert_clean(e, path)
            else:  # no audio file is there: every row read is skipped and counted
                assert utterances == [] and (on_error == "skip" or sum(skipped.values()) == 0)


ROW_KINDS = ["good", "missing", "empty", "short", "blank", "quote", "closing", "garbage", "folder"]
WORDS = st.lists(st.sampled_from(["one", "two", "three", "it's", "Four", "five"]), min_size=1, max_size=4).map(" ".join)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
@FUZZ
@given(rows=st.lists(st.tuples(st.sampled_from(ROW_KINDS), WORDS), min_size=1, max_size=8), header=st.booleans())
@example(rows=[("quote", "one"), ("good", "two"), ("closing", "three"), ("good", "four")], header=True)  # 4 rows, not 2
def test_speech_manifests_take_random_rows(fmt, rows, header, tmp_path):
    """Random good and bad rows, read then loaded as audio as training reads them: one error naming the file:line
    of the first bad row (a stray quote in a CSV first: it is found while reading the table), or with
    ``on_error="skip"`` the good rows, in order, with every bad one counted. In JSON lines a "stray quote" is a line
    that is not JSON: a bad row like the others."""
    sf = pytest.importorskip("soundfile")
    import numpy as np

    from qkv.apps.speech.audio import load_audio

    sf.write(tmp_path / "clip.wav", (0.3 * np.sin(np.arange(4000) / 3)).astype(np.float32), 16_000)
    (tmp_path / "garbage.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt not audio" * 4)
    (tmp_path / "sub").mkdir(exist_ok=True)
    sep = "," if fmt == "csv" else "\t"
    cells = {"good": "clip.wav{}{}", "missing": "nothere.wav{}{}", "empty": "clip.wav{}!!! ...", "short": "clip.wav",
             "blank": "", "quote": 'clip.wav{}"{}', "closing": 'clip.wav{}{}"', "garbage": "garbage.wav{}{}",
             "folder": "sub{}{}"}
    if fmt == "jsonl":
        header = False
        objects = {"good": ("clip.wav", "{}"), "missing": ("nothere.wav", "{}"), "empty": ("clip.wav", "!!! ..."),
                   "short": ("clip.wav", None), "closing": ("clip.wav", '{}"'), "garbage": ("garbage.wav", "{}"),
                   "folder": ("sub", "{}")}
        lines = ["" if k == "blank" else '{"audio_filepath": "clip.wav", "text": "' + w if k == "quote" else
                 json.dumps({"audio_filepath": objects[k][0], **({"text": objects[k][1].format(w)}
                                                                 if objects[k][1] else {})}) for k, w in rows]
    else:
        lines = ([f"path{sep}sentence"] if header else []) + [cells[k].format(sep, w) for k, w in rows]
    path = tmp_path / f"m.{fmt}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    first = 2 if header else 1
    numbered = [(n, k, w) for n, (k, w) in enumerate(rows, first)]
    quote = next((n for n, k, _ in numbered if k == "quote" and fmt == "csv"), None)
    row_bad = [n for n, k, _ in numbered if k in ("missing", "empty", "short", "folder") or
               k == "quote" and fmt == "jsonl"]
    audio_bad = [n for n, k, _ in numbered if k == "garbage"]

    def read(on_error):
        utterances, skipped = read_manifest(path, on_error=on_error)
        texts, unreadable = [], 0
        for u in utterances:
            try:
                load_audio(u.audio, where=u.name())
                texts.append(u.text)
            except ValueError:
                if on_error == "raise":
                    raise
                unreadable += 1
        return texts, sum(skipped.values()), unreadable

    if not header and all(k == "blank" for k, _ in rows):
        with pytest.raises(ValueError, match=rf"^{path}: the manifest is empty$"):
            read("skip")
        return
    for on_error in ("raise", "skip"):
        first_bad = quote or (row_bad or audio_bad or [None])[0] if on_error == "raise" else quote
        if first_bad is None:
            texts, skipped, unreadable = read(on_error)
            assert texts == [normalize_transcript(w) for _, k, w in numbered
                             if k in ("good", "closing") or k == "quote" and fmt != "jsonl"]
            assert (skipped, unreadable) == (len(row_bad), len(audio_bad))
            continue
        with pytest.raises(ValueError) as info:
            read(on_error)
        assert str(info.value).startswith(f"{path}:{first_bad}: ") and "\n" not in str(info.value), str(info.value)


def test_non_gzip_file_named_gz_is_read_as_text(tmp_path):
    path = tmp_path / "pairs.tsv.gz"
    path.write_text("hello\tbonjour\n", encoding="utf-8")
    assert list(read_pairs(path)) == [(1, "hello", "bonjour")]


def test_undecodable_text_names_file_and_line(tmp_path):
    path = tmp_path / "r.tsv"
    path.write_bytes(b"1\t2.0\tfine\n2\t-1.0\tbad \xff byte\n")
    with pytest.raises(ValueError, match=r"r\.tsv:2: not UTF-8"):
        read_movie_reviews(path)


PARSER = build_parser()


def _subcommands():
    parser = PARSER
    sub = next(a for a in parser._actions if a.dest == "command")
    train = next(a for a in sub.choices["train"]._actions if a.dest == "application")
    yield from ([["train", name], p] for name, p in train.choices.items())
    yield from ([[name], p] for name, p in sub.choices.items() if name != "train")


COMMANDS = list(_subcommands())


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[" ".join(c) for c, _ in COMMANDS])
@FUZZ
@given(data=st.data())
def test_random_option_values_parse_or_fail_in_one_line(index, data, capsys):
    from qkv.cli.options import OptionsError, options_from_args

    command, parser = COMMANDS[index]
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    chosen = data.draw(st.lists(st.sampled_from(flags), max_size=4, unique_by=lambda a: a.dest))
    argv = [*command] + (["run"] if command[0] in ("translate", "classify", "show-attention", "evaluate") else [])
    for action in chosen:
        argv.append(action.option_strings[-1])
        if action.nargs != 0:
            argv.append(data.draw(st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "1e30", "x", "", "3",
                                                              "0.5", "a,b", "1,2,3", "k=v"]),
                                             st.text(max_size=8))))
    try:
        args = PARSER.parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error: ") and "\n" not in err
        return
    for cls in getattr(parser, "_qkv_options", []):
        try:
            options_from_args(args, cls)
        except OptionsError as e:
            assert "\n" not in str(e) and str(e)


def test_a_damaged_best_falls_back_to_the_checkpoint_and_says_so(tmp_path, caplog):
    run = tmp_path / "run"
    shutil.copytree(V1 / "sentiment-bigru", run)
    shutil.copytree(run / "best", run / "checkpoint")
    weights = run / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    clf = SentimentClassifier.load(run)
    assert clf.predict(["a wonderful story."])[0].label in ("positive", "negative")
    assert "best/model.safetensors: damaged weights file" in caplog.text
    (run / "checkpoint" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_checkpoint(run)
    assert "best/model.safetensors: damaged" in str(info.value) and "checkpoint/config.json: damaged, not JSON" in \
        str(info.value)
    assert main(["classify", str(run), "good"]) == 2


@pytest.mark.parametrize("damage", [b"", bytes(range(7, 256, 3)), b'{"format": "qkv-checkpoint", "version": 2}',
                                    b"[1, 2]"], ids=["empty", "binary", "no-task", "a-list"])
def test_damaged_config_is_a_one_line_error_naming_the_file(tmp_path, damage, capsys):
    run = tmp_path / "run"
    shutil.copytree(V1 / "sentiment-bigru", run)
    (run / "best" / "config.json").write_bytes(damage)
    assert main(["classify", str(run), "good"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error: ") and "\n" not in err and "config.json" in err


def test_sizes_that_do_not_fit_the_weights_name_the_parameter(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(V1 / "sentiment-bigru", run)
    cfg = run / "best" / "config.json"
    meta = json.loads(cfg.read_text())
    meta["config"]["arch"]["embed_dim"] = 24
    cfg.write_text(json.dumps(meta))
    assert main(["classify", str(run), "good"]) == 2
    assert "weight embedding.weight is (" in capsys.readouterr().err


def test_a_crash_inside_a_save_leaves_nothing_behind_at_the_next_save(tmp_path):
    target = tmp_path / "checkpoint"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "big").write_bytes(b"x" * 1000)
        raise RuntimeError("crash")
    # a SIGKILL cannot clean up: simulate its leftover, then save again
    left = tmp_path / ".checkpoint.tmp-dead"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"x" * 1000)
    with atomic_directory(target) as tmp:
        (tmp / "ok").write_text("1")
    assert not left.exists() and (target / "ok").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_outputs_that_cannot_be_written_are_one_line_errors(tmp_path, capsys):
    run = V1 / "translate-bahdanau"
    for bad in (tmp_path, Path("/proc/qkv-out.txt")):
        code = main(["translate", str(run), "7 mars 2019", "--beam", "1", "--output", str(bad)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("qkv: error: ") and "\n" not in err, err
        assert f"{bad}" in err and "--output" in err and ".tmp-" not in err, err
    new = tmp_path / "missing-dir" / "x" / "out.txt"  # a folder that does not exist yet is made
    assert main(["translate", str(run), "7 mars 2019", "--beam", "1", "--output", str(new)]) == 0
    assert f"to {new}" in capsys.readouterr().out and new.read_text(encoding="utf-8").strip()


def test_terminal_output_does_not_echo_escape_sequences(capsys):
    assert main(["translate", str(V1 / "translate-bahdanau"), "7 mars\x1b[2J 2019\x07", "--beam", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_save_and_exit_with_the_resume_command(tmp_path, sig, code, word):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "qkv.cli", "--threads", "1", "train", "translate", "--n-train", "20000",
           "--hidden-dim", "16", "--embed-dim", "8", "--batch-size", "8", "--out", str(out), "--no-progress",
           "--log-every", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and
                                          '"train"' in (out / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"qkv: {word}: the checkpoint is in") and last.endswith("--resume")
    assert "Traceback" not in err and (out / "checkpoint" / "model.safetensors").is_file()


@pytest.mark.slow
def test_sigkill_at_random_moments_never_loses_a_loadable_checkpoint(tmp_path):
    import random

    import torch

    out = tmp_path / "run"
    root = ROOT
    rng = random.Random(0)
    kills = 0
    for _ in range(8):
        resume = ["--resume"] if (out / "checkpoint" / "model.safetensors").exists() else []
        proc = subprocess.Popen([sys.executable, "-m", "tests.trainer_toy", "--out", str(out), "--epochs", "100000",
                                 "--examples", "40", "--batch-size", "4", *resume], cwd=root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and not (out / "checkpoint" / "model.safetensors").exists():
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 1.0))  # each epoch saves: kills land before, inside and after writes
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        ckpt = load_checkpoint(out / "checkpoint", prefer=())
        assert ckpt.state is not None and all(torch.isfinite(t).all() for t in ckpt.state_dict.values())
    assert kills >= 6
    # the next save removes what a killed save left behind
    proc = subprocess.run([sys.executable, "-c", "from qkv.train.checkpoint import atomic_directory as a\n"
                           f"with a({str(out / 'checkpoint')!r}) as t: pass"], cwd=root, timeout=60)
    assert proc.returncode == 0 and not list(out.glob(".checkpoint.tmp-*"))


def test_the_reliability_page_names_tests_that_exist():
    """Each guarantee of docs/reliability.md names its proof as path::test_name or a test file: they exist."""
    import re

    page = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(test_\w+))?`", page)
    assert len(named) > 20
    for path, test in named:
        assert (ROOT / path).is_file(), path
        if test:
            assert re.search(rf"^def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE), \
                f"{path}::{test}"
