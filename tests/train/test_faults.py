"""Faults an operator meets: two trainings in one run directory, SIGTERM, full disks, torn
``metrics.jsonl`` lines and unwritable outputs. The races and signals use real processes (``tests.trainer_toy``);
the full disk is a small tmpfs where this machine lets us mount one, and a simulated ENOSPC everywhere."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import qkv.train.checkpoint as ck
import qkv.train.metrics_log as metrics_log
from qkv.train import TrainConfig, load_checkpoint, train
from qkv.train.checkpoint import write_checkpoint
from qkv.train.interrupt import Interrupted
from qkv.train.lock import LOCK_NAME, RunInUseError, RunLock
from qkv.train.metrics_log import MetricsLog
from tests import ROOT  # noqa: E402
from tests.trainer_toy import ToyTask


def toy(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.trainer_toy", "--out", str(out), *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def train_lines(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines[:-1] if '"train"' in x]  # the last one may be being written


def cfg(out, **kw):
    base = dict(epochs=2, batch_size=16, lr=0.01, device="cpu", warmup_steps=2, log_every=2, progress=False,
                out=str(out))
    return TrainConfig(**{**base, **kw})


def write(path, v, **kw):
    return write_checkpoint(path, weights={"w": torch.full((2,), float(v))}, task="t", config={"v": v}, **kw)


# --- item 1: two trainings in one run directory ---------------------------------------------------------------
@pytest.mark.slow
def test_two_runs_started_together_one_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    args = ["--epochs", "60", "--step-delay", "0.01"]
    procs = [toy(out, *args), toy(out, *args, "--seed", "3")]
    try:
        assert wait_for(lambda: any(p.poll() is not None for p in procs), timeout=120)
        done = next(p for p in procs if p.poll() is not None)
        holder = next(p for p in procs if p is not done)
        seed = "0" if holder is procs[0] else "3"
        _, err = done.communicate(timeout=30)
        assert holder.poll() is None, "the refused run must exit while the other still trains"
        assert done.returncode == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"{out} (out) is in use by another training (pid {holder.pid}" in err and "trainer_toy" in err
        lock = json.loads((out / LOCK_NAME).read_text())
        assert lock["pid"] == holder.pid
        assert wait_for(lambda: (out / "checkpoint" / "model.safetensors").exists(), timeout=120)
        holder.kill()  # SIGKILL: no clean-up at all; the OS drops its lock
        holder.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)
    # the dead holder's lock is not a live one: a resume takes the directory at once
    again = toy(out, "--epochs", "60", "--seed", seed, "--resume")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert not (out / LOCK_NAME).exists()  # released and removed at the end
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["train_config"]["seed"] for r in records if r["event"] in ("start", "resume")} == {int(seed)}


def test_lock_is_refused_while_held_and_free_after_release(tmp_path):
    out = tmp_path / "run"
    with RunLock(out):
        assert (out / LOCK_NAME).exists()
        with pytest.raises(RunInUseError, match=rf"is in use by another training \(pid {os.getpid()}"):
            RunLock(out).acquire()  # flock locks are per open file: a second open is refused in one process too
        with pytest.raises(RunInUseError, match="in use"):
            train(ToyTask(), cfg(out))
        assert not (out / "checkpoint").exists() and not (out / "metrics.jsonl").exists()
    assert not out.exists()  # the lock made the directory and nothing else was written: nothing left
    train(ToyTask(), cfg(out, epochs=1))
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "metrics.jsonl"]


def test_a_run_that_fails_at_setup_leaves_nothing(tmp_path):
    class Broken(ToyTask):
        def setup(self):
            raise ValueError("bad data")

    with pytest.raises(ValueError, match="bad data"):
        train(Broken(), cfg(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_the_command_line_refuses_a_held_run_directory_in_one_line(tmp_path, capsys):
    from qkv.cli import main

    out = tmp_path / "r"
    with RunLock(out):
        code = main(["--threads", "1", "train", "translate", "--data", "dates", "--n-train", "300", "--n-eval", "20",
                     "--max-steps", "1", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith(f"qkv: error: {out} (--out) is in use by another training (pid {os.getpid()}"), err


def test_a_live_processes_save_is_never_removed_a_dead_ones_is(tmp_path):
    path = tmp_path / "checkpoint"
    write(path, 1)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        saving = tmp_path / f".checkpoint.tmp-{live.pid}-abcd"
        left = tmp_path / f".checkpoint.tmp-{dead.pid}-efgh"
        for d in (saving, left):
            d.mkdir()
            (d / "model.safetensors").write_bytes(b"x" * 100)
        write(path, 2)
        assert saving.exists(), "the save of a live process was deleted"
        assert not left.exists()
    finally:
        live.kill()
        live.wait()
    write(path, 3)
    assert not saving.exists() and load_checkpoint(path).config == {"v": 3}


def test_the_final_evaluation_uses_this_runs_best_weights_not_the_disks(tmp_path):
    class Overwritten(ToyTask):
        saves = 0

        def save_assets(self, directory):
            super().save_assets(directory)
            if directory.parent.name.startswith(".checkpoint.tmp"):
                self.saves += 1
            if self.saves == 3:  # the last save, after the last evaluation: another writer replaces best/
                zeros = {k: torch.zeros_like(v) for k, v in load_checkpoint(tmp_path / "best").state_dict.items()}
                write_checkpoint(tmp_path / "best", weights=zeros, task="toy", config={})

    r = train(Overwritten(), cfg(tmp_path, epochs=3, monitor="mse", mode="min"))
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    best_eval = next(m for m in records if m["event"] == "eval" and m["global_step"] == r.state.best_step)
    assert r.metrics["valid"]["mse"] == best_eval["metrics"]["mse"]
    assert any(bool(v.abs().sum() > 0) for v in r.model.state_dict().values())


# --- item 5: SIGTERM is Ctrl-C --------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_saves_the_last_finished_step_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    proc = toy(out, "--epochs", "100000", "--step-delay", "0.01")
    try:
        assert wait_for(lambda: len(train_lines(out)) >= 3, timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err  # 128 + SIGTERM, after the save and the message
    assert "terminated (SIGTERM): stopping after this step" in err and "--resume" in err
    assert "Traceback" not in err
    ckpt = load_checkpoint(out / "checkpoint", prefer=())
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x][-1]
    assert ckpt.state["position"]["global_step"] == last["global_step"]  # the last finished step, not an epoch's


def test_sigterm_in_process_is_an_interrupt_with_exit_code_143(tmp_path):
    def terminate(state, logs):
        if state.global_step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as info:
        train(ToyTask(), cfg(tmp_path, epochs=3), callbacks=[terminate])
    assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
    assert load_checkpoint(tmp_path / "checkpoint").state["position"]["global_step"] == 5
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are given back
    r = train(ToyTask(), cfg(tmp_path, epochs=3, resume=True))
    assert r.state.global_step == 18


# --- item 6: OS errors name the user's path and flag; whole metrics lines -------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at ``tmp_path/disk`` (root only; skipped where mounting is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path) -> None:
    with contextlib.suppress(OSError), open(disk / "filler", "ab", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


def assert_names_the_users_path(e: BaseException, path: Path, flag: str = "out"):
    text = str(e)
    assert str(path) in text and f"({flag})" in text and ".tmp-" not in text and "\n" not in text, text


def test_full_disk_during_a_save_names_the_checkpoint_and_keeps_the_last_one(small_disk):
    out = small_disk / "run"
    c = cfg(out, eval_split=None, log_every=1000, epochs=1)
    train(ToyTask(), c)

    def fill_disk(state, logs):
        if state.global_step == 9:
            fill(small_disk)

    with pytest.raises(OSError) as info:
        train(ToyTask(), c.replace(epochs=3, resume=True), callbacks=[fill_disk])
    assert_names_the_users_path(info.value, out / "checkpoint")
    assert "No space left on device" in str(info.value) and info.value.errno == errno.ENOSPC
    assert load_checkpoint(out / "checkpoint").state["position"]["global_step"] == 6
    assert not list(out.glob(".*.tmp-*"))


def test_full_disk_leaves_no_torn_metrics_line(small_disk):
    log = MetricsLog(small_disk / "metrics.jsonl")
    log.write({"event": "start"})
    fill(small_disk)
    with pytest.raises(OSError) as info:
        log.write({"event": "train", "pad": "x" * 20000})
    assert_names_the_users_path(info.value, small_disk / "metrics.jsonl")
    assert (small_disk / "metrics.jsonl").read_text() == '{"event": "start"}\n'


def test_simulated_full_disk_during_a_save(tmp_path, monkeypatch):
    write(tmp_path / "checkpoint", 1)

    def no_space(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))  # names the temporary file

    monkeypatch.setattr(ck, "_write_bytes", no_space)
    with pytest.raises(OSError) as info:
        write(tmp_path / "checkpoint", 2, flag="out")
    assert_names_the_users_path(info.value, tmp_path / "checkpoint")
    assert "the previous one is kept" in str(info.value)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "checkpoint").config == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_simulated_full_disk_in_metrics_cuts_the_partial_line(tmp_path, monkeypatch):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"event": "start"})
    real = os.write

    def half_then_full(fd, data):
        if len(data) > 20:
            return real(fd, data[:10])  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics_log.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left on device"):
        log.write({"event": "train", "loss": 1.0})
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"event": "start"}\n'


def test_a_torn_last_metrics_line_is_repaired_on_resume(tmp_path, caplog):
    train(ToyTask(), cfg(tmp_path, epochs=1))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "train", "glo')  # a process killed inside a write
    with caplog.at_level(logging.WARNING):
        train(ToyTask(), cfg(tmp_path, epochs=2, resume=True))
    assert "removed a torn last line (23 bytes)" in caplog.text
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("resume") == 1 and records[-1]["event"] == "end"


def test_an_out_that_cannot_be_a_run_directory_is_named(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OSError) as info:
        train(ToyTask(), cfg(afile))
    assert_names_the_users_path(info.value, afile)
    with pytest.raises(OSError) as info:
        train(ToyTask(), cfg(afile / "run"))
    assert_names_the_users_path(info.value, afile / "run")
