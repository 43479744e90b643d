"""Loops of predictions and evaluations follow the machine: :func:`follow_threads` driven by a fake clock and fake
thread counts (no sleeps), then a real prediction whose batches switch torch's threads."""

import logging

import pytest
import torch

from qkv.train import threads
from qkv.train.threads import ThreadTuner, follow_threads, loop_tuner, threads_held
from tests.train.test_threads import FakeMachine


class Consumer:
    """Consumes the batches of ``follow_threads`` on ``machine``'s fake clock: a batch of ``units`` takes
    ``machine.speed[threads] * units`` seconds."""

    def __init__(self, machine):
        self.m = machine

    def clock(self):
        return self.m.now

    def work(self, batch):
        self.m.now += self.m.speed[self.m.threads] * len(batch)

    def loop(self, batches, tuner, stop=None):
        seen, counts = [], []
        for i, batch in enumerate(follow_threads(batches, tuner=tuner, clock=self.clock)):
            seen.append(batch)
            counts.append(self.m.threads)
            self.work(batch)
            if i + 1 == stop:
                break
        return seen, counts


def loop_tuner_of(machine):
    return ThreadTuner(2, now=machine.now, set_threads=machine.set, get_threads=machine.get, **threads.LOOP_TUNER)


def test_a_busy_core_makes_a_long_loop_switch_to_one_thread_logged_once(caplog):
    m = FakeMachine(speed={1: 0.002, 2: 0.010})  # 2 threads beside a busy process: 5x slower
    batches = [[k] * 10 for k in range(400)]  # 0.1 s a batch with 2 threads: 40 s of work
    with caplog.at_level(logging.INFO, logger="qkv.apps"):
        seen, counts = Consumer(m).loop(batches, loop_tuner_of(m))
    assert seen == batches
    assert counts[0] == 2 and counts[-1] == 1 and 1 in counts[:40]  # switched within the first few seconds
    lines = [r.getMessage() for r in caplog.records if r.name == "qkv.apps"]
    assert len(lines) == 1 and "2 -> 1" in lines[0] and "batches ran 5.0x faster" in lines[0]
    assert m.threads == 2  # the count in force before the loop is put back after it


def test_a_short_loop_runs_no_trial():
    m = FakeMachine(speed={1: 0.002, 2: 0.010})
    batches = [[k] * 10 for k in range(60)]  # 6 s of work: never 10 s left after the first 2 s
    seen, counts = Consumer(m).loop(batches, loop_tuner_of(m))
    assert seen == batches and set(counts) == {2} and m.calls == []


def test_a_fixed_count_has_no_tuner_and_changes_nothing(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert loop_tuner() is not None  # nothing fixed: the loop follows the machine
        assert loop_tuner(configured=2) is None
        assert loop_tuner(device="cuda") is None and loop_tuner(device=torch.device("meta")) is None
        with threads_held(1):  # qkv --threads 1
            assert torch.get_num_threads() == 1 and loop_tuner() is None
            assert list(follow_threads(range(5))) == [0, 1, 2, 3, 4] and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2 and loop_tuner() is not None
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert loop_tuner() is None
        monkeypatch.delenv("OMP_NUM_THREADS")
        seen = []
        for x in follow_threads(range(3), configured=1):  # the caller's count for the loop, put back after it
            seen.append((x, torch.get_num_threads()))
        assert seen == [(0, 1), (1, 1), (2, 1)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_loop_inside_a_loop_or_a_training_follows_nothing(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        outer = follow_threads(range(2))
        next(outer)
        assert loop_tuner() is None  # the outer loop holds the count
        outer.close()
        assert loop_tuner() is not None
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("stop", [1, 7, 150])
def test_items_pass_unchanged_and_in_order_and_a_closed_loop_puts_the_count_back(stop):
    m = FakeMachine(speed={1: 0.002, 2: 0.010})
    batches = [[k] * 10 for k in range(400)]
    seen, _ = Consumer(m).loop(batches, loop_tuner_of(m), stop=stop)
    assert seen == batches[:stop] and all(b is a for a, b in zip(batches, seen, strict=False))
    assert m.threads == 2 and not threads._held  # stopped in a trial (150) or after it: 2 threads again


def test_a_real_prediction_gives_the_same_results_while_its_batches_switch_threads(monkeypatch):
    """Translate (:func:`length_batches`) and sentiment (its own loop) with a tuner that trials on every batch: torch's
    thread count changes between the batches, and every result is the one of a loop that follows nothing."""
    from qkv.apps.sentiment import SentimentClassifier
    from qkv.apps.translate import Translator
    from tests.train.test_old_runs import REVIEWS, TEXTS, V1

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "LOOP_TUNER", {**threads.LOOP_TUNER, "start_after": 0.0, "skip": 0,
                                                "slot_seconds": 0.0, "slots": 4})
    monkeypatch.setattr(threads, "TRIAL_NEEDS", 0.0)
    seen = []
    monkeypatch.setattr(threads.ThreadTuner, "_use", lambda self, n, use=ThreadTuner._use: (
        seen.append(n), use(self, n)))
    translator, clf = Translator.load(V1 / "translate-transformer"), SentimentClassifier.load(V1 / "sentiment-bigru")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        followed = translator.predict(TEXTS, beam=1, max_len=8, batch_size=1), clf.predict(REVIEWS, batch_size=1)
        assert 1 in seen and torch.get_num_threads() == 2
        seen.clear()
        with threads_held(1):
            held = translator.predict(TEXTS, beam=1, max_len=8, batch_size=1), clf.predict(REVIEWS, batch_size=1)
        assert seen == []
    finally:
        torch.set_num_threads(before)
    for got, want in zip(followed[0], held[0], strict=True):  # torch's own sums round differently with 1 and 2
        assert (got.text, got.tokens) == (want.text, want.tokens)  # threads: the floats agree to float32 rounding
        assert got.score == pytest.approx(want.score, abs=1e-6)
        torch.testing.assert_close(got.attention, want.attention, atol=1e-6, rtol=0)
    for got, want in zip(followed[1], held[1], strict=True):
        assert (got.label, got.tokens) == (want.label, want.tokens)
        assert got.probabilities == pytest.approx(want.probabilities, abs=1e-6)
        assert got.weights == pytest.approx(want.weights, abs=1e-6)


def test_qkv_threads_n_fixes_the_count_of_a_prediction(monkeypatch, capsys):
    """``qkv --threads 1 predict``: its loops have no tuner and run on 1 thread; the count is put back after."""
    from qkv.cli import main
    from tests.train.test_old_runs import V1

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tuners = []
    monkeypatch.setattr(threads, "loop_tuner", lambda *a, use=threads.loop_tuner: (
        tuners.append((use(*a), torch.get_num_threads())) or tuners[-1][0]))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["--threads", "1", "predict", str(V1 / "sentiment-bigru"), "a wonderful story"]) == 0
        assert tuners == [(None, 1)] and torch.get_num_threads() == 2
        tuners.clear()
        assert main(["predict", str(V1 / "sentiment-bigru"), "a wonderful story"]) == 0
        assert len(tuners) == 1 and tuners[0][0] is not None  # nothing fixed: it would follow a long one
    finally:
        torch.set_num_threads(before)
    assert "positive" in capsys.readouterr().out
