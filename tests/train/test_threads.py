"""Threads that follow the machine: the tuner fed fake step timings (no sleeps, no real thread changes)."""

import pytest
import torch

from qkv.train import TrainConfig
from qkv.train.threads import ThreadTuner, fixed_threads, thread_tuner


class FakeMachine:
    """torch's thread count, and the seconds a step of ``units`` takes with each count (``speed[n]`` seconds per
    unit), which a test changes to model another process starting or ending."""

    def __init__(self, threads=2, speed=None):
        self.threads, self.speed, self.now, self.calls = threads, dict(speed or {1: 0.01, 2: 0.01}), 0.0, []

    def set(self, n):
        self.threads = n
        self.calls.append(n)

    def get(self):
        return self.threads

    def tuner(self, **kw):
        kw.setdefault("start_after", 10.0)
        return ThreadTuner(2, now=self.now, set_threads=self.set, get_threads=self.get, **kw)

    def run(self, tuner, seconds, units=10):
        """Steps for ``seconds`` of fake time; the lines the tuner returned."""
        lines, end = [], self.now + seconds
        while self.now < end:
            step = self.speed[self.threads] * units
            self.now += step
            line = tuner.record(step, units, self.now)
            if line is not None:
                lines.append(line)
        return lines


def test_a_busy_core_makes_it_switch_to_one_thread_and_says_why():
    m = FakeMachine(speed={1: 0.02, 2: 0.10})  # 2 threads beside a busy process: 5x slower
    t = m.tuner()
    assert m.run(t, 9.0) == [] and m.calls == []  # nothing before start_after: warm-up steps are not compared
    lines = m.run(t, 20.0)
    assert m.threads == 1 and len(lines) == 1
    assert "2 -> 1" in lines[0] and "5.0x faster" in lines[0] and "busy" in lines[0] and "--threads" in lines[0]


def test_a_quiet_machine_keeps_all_cores():
    m = FakeMachine(speed={1: 0.016, 2: 0.01})
    t = m.tuner()
    assert m.run(t, 300.0) == []
    assert m.threads == 2 and t.last_check is not None  # it did check (twice: at 10 s and 2 min later)
    assert m.calls.count(1) >= 2


def test_equal_speeds_within_the_margin_change_nothing():
    m = FakeMachine(speed={1: 0.0105, 2: 0.01})
    t = m.tuner()
    assert m.run(t, 60.0) == [] and m.threads == 2


def test_it_goes_back_to_all_cores_when_the_other_process_ends():
    m = FakeMachine(speed={1: 0.02, 2: 0.10})
    t = m.tuner()
    assert len(m.run(t, 30.0)) == 1 and m.threads == 1
    m.speed = {1: 0.02, 2: 0.012}  # the other process ended: the next periodic check finds 2 faster
    lines = m.run(t, 130.0)
    assert m.threads == 2 and len(lines) == 1 and "1 -> 2" in lines[0] and "free again" in lines[0]


def test_much_slower_steps_bring_the_check_forward():
    m = FakeMachine(speed={1: 0.02, 2: 0.01})
    t = m.tuner()
    assert m.run(t, 20.0) == [] and m.threads == 2
    m.speed = {1: 0.02, 2: 0.10}  # a busy process starts: steps 10x slower, long before the 2-minute check
    lines = m.run(t, 45.0)
    assert m.threads == 1 and len(lines) == 1


def test_a_trial_interleaves_the_counts_and_ends_on_the_winner():
    m = FakeMachine(speed={1: 0.02, 2: 0.10})
    t = m.tuner(slots=3)
    m.run(t, 30.0)
    assert m.calls == [1, 2, 1]  # slots A B B A A B from 2 threads: 2, 1, 1, 2, 2, 1; then the winner, 1
    assert not t.trying and t.threads == 1


def test_by_default_the_first_trial_starts_after_two_steps():
    m = FakeMachine(speed={1: 0.02, 2: 0.10})
    t = ThreadTuner(2, set_threads=m.set, get_threads=m.get)
    t.record(1.0, 10, 1.0)
    t.record(1.0, 10, 2.0)
    assert not t.trying
    t.record(1.0, 10, 3.0)
    assert t.trying


def test_one_core_has_nothing_to_choose():
    t = ThreadTuner(1, set_threads=lambda n: pytest.fail("set"), get_threads=lambda: 1)
    assert not t.active and t.record(1.0, 1, 100.0) is None


def test_fixed_counts_come_from_the_config_or_omp_num_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert fixed_threads(None) is None and fixed_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert fixed_threads(None) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert fixed_threads(None) is None


def test_the_trainer_tunes_only_on_the_cpu_in_one_process_with_nothing_fixed(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert thread_tuner(None, torch.device("cpu"), False, 0.0) is not None
        assert thread_tuner(None, torch.device("cpu"), True, 0.0) is None
        assert thread_tuner(None, torch.device("cuda"), False, 0.0) is None
        assert thread_tuner(1, torch.device("cpu"), False, 0.0) is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_the_config_refuses_zero_threads():
    with pytest.raises(ValueError, match="threads"):
        TrainConfig(threads=0)


def test_the_trainer_switches_logs_writes_and_puts_the_count_back(tmp_path, monkeypatch):
    """A real training on a fake clock whose steps take 1 s with 2 threads and 0.1 s with 1 (a busy core)."""
    import json

    from qkv.train import Trainer
    from tests.train.test_budget import FakeClock, TimedToy

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    clock = FakeClock()
    task = TimedToy(clock, step_seconds=lambda i: 1.0 if torch.get_num_threads() > 1 else 0.1)
    config = TrainConfig(epochs=6, batch_size=16, device="cpu", progress=False, out=str(tmp_path / "run"))
    try:
        torch.set_num_threads(2)
        trainer = Trainer(task, config, clock=clock)
        trainer.fit()
        assert torch.get_num_threads() == 2  # put back
        assert trainer.tuner.threads == 1 and trainer.tuner.changes == 1
    finally:
        torch.set_num_threads(threads)
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    changes = [e for e in events if e["event"] == "threads"]
    assert len(changes) == 1 and changes[0]["was"] == 2 and changes[0]["threads"] == 1
    assert "10.0x faster" in changes[0]["why"]


def test_a_fixed_count_is_kept(monkeypatch):
    from qkv.train import Trainer
    from tests.train.test_budget import FakeClock, TimedToy

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    clock = FakeClock()
    seen = []
    task = TimedToy(clock, step_seconds=lambda i: seen.append(torch.get_num_threads()) or 1.0)
    try:
        torch.set_num_threads(2)
        trainer = Trainer(task, TrainConfig(epochs=3, batch_size=16, device="cpu", progress=False, threads=1,
                                            eval_split=None, final_splits=()), clock=clock)
        trainer.fit()
        assert trainer.tuner is None and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
