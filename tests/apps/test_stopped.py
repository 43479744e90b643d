"""Every decoder says why it stopped (``stopped``: the end token, or the limit it reached), and every generating
command and page says so when it was a limit: on stderr, in the ``--json`` row and on the ``qkv view`` page."""

from __future__ import annotations

import json
import math
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.data import EOS_ID
from qkv.models import decoding
from qkv.models.decoding import search


@pytest.fixture
def never_ending(monkeypatch):
    """Every search over a model that never proposes its end token (unless nothing else is allowed)."""

    def endless(step, state, batch_size, **options):
        eos = options.get("eos_id", EOS_ID)

        def no_end(tokens, st):
            scores, attn, st = step(tokens, st)
            scores = scores.float().clone()
            others = scores.clone()
            others[:, eos] = float("-inf")
            scores[:, eos] = torch.where(torch.isfinite(others).any(-1), float("-inf"), scores[:, eos])
            return scores, attn, st

        return search(no_end, state, batch_size, **options)

    monkeypatch.setattr(decoding, "search", endless)


def _wav(path: Path, seconds: float = 1.0) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes())
    return str(path)


def test_the_search_says_whether_it_ended_or_reached_max_len():
    vocab = 6

    def step(tokens, state):  # token 3 always, then the end once the state counts 4 steps
        logits = torch.full((tokens.shape[0], vocab), -5.0)
        logits[:, 3] = 0.0
        logits[:, EOS_ID] = 5.0 if state["t"] >= 4 else -5.0
        return logits, None, {"t": state["t"] + 1}

    for beam in (1, 3):
        (ended,) = search(step, {"t": 0}, 1, beam=beam, max_len=10, length_penalty=0.0)
        (cut,) = search(step, {"t": 0}, 1, beam=beam, max_len=3, length_penalty=0.0)
        assert (ended.stopped, ended.tokens) == ("end", [3] * 4)
        assert (cut.stopped, cut.tokens) == ("max_len", [3] * 3)


#: each generating command: its inputs, the option of its limit and the unit it counts in
COMMANDS = {
    "translate": (["translate", "{run}", "7 mars 2019"], "tokens", "translation"),
    "caption": (["caption", "{run}", "--index", "0", "--beam", "1"], "words", "caption"),
    "summarize": (["summarize", "{run}", "the tool called dokute runs fast", "--beam", "1"], "tokens", "summary"),
    "speech": (["transcribe", "{run}", "{wav}"], "characters", "transcript"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_output_stopped_by_its_limit_is_said_on_stderr_in_the_row_and_on_the_page(name, tiny_run, tmp_path,
                                                                                    capsys, never_ending):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    run = tiny_run(name)
    argv, unit, what = COMMANDS[name]
    wav = _wav(tmp_path / "a.wav")
    argv = [a.format(run=run, wav=wav) for a in argv]
    out = tmp_path / "rows.json"
    assert main([*argv, "--max-len", "3", "--json", str(out), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    (row,) = json.loads(out.read_text(encoding="utf-8"))
    said = f"the {what} stopped at 3 {unit} without ending: the most max_len allows"
    assert said in err and row["note"] == said and row["stopped"] == "max_len", (err, row)
    # the page of the same decoding says it too
    given = {"translate": [argv[2]], "caption": ["--index", "0"], "summarize": [argv[2]], "speech": [wav]}[name]
    page = tmp_path / "page.html"
    assert main(["view", str(run), *given, "--out", str(page), "--device", "cpu"]) == 0
    assert f"the {what} stopped at" in page.read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_transcript_reaches_max_len_characters_and_the_rate_limit_is_named(tiny_run, tmp_path, capsys,
                                                                            never_ending):
    if shutil.which("espeak-ng") is None or shutil.which("flite") is None:
        pytest.skip("espeak-ng and flite are not installed (make data)")
    from qkv.apps.speech import Transcriber

    transcriber = Transcriber.load(tiny_run("speech"), "cpu")
    wav = _wav(tmp_path / "long.wav", 3.0)
    for beam in (1, 2):
        (t,) = transcriber.predict([wav], beam=beam, max_len=10)
        assert (len(t.tokens), t.stopped) == (10, "max_len")  # --max-len 10 is ten characters, the end not one
        (t,) = transcriber.predict([wav], beam=beam, max_len=300, max_rate=2.0)
        frames = transcriber.features(wav).shape[0]  # of 10 ms
        assert (len(t.tokens), t.stopped) == (math.ceil(2.0 * frames / 100) + 5, "max_rate")
        assert "max_rate allows" in transcriber.note(t, {})
