"""The generic predict contract of every application (`Predictor.inputs_from_strings` / `result_row`), on the
tiny run of each: command-line strings become the inputs `predict` takes by hand, every result becomes one JSON row
with an `output`, and a bad string is a `ValueError` naming it."""

import json
import math
import shutil
import wave

import numpy as np
import pytest

from qkv.apps import catalogue, load_predictor

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(path, size=(20, 24), seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, size, dtype=np.uint8)).save(path)
    return str(path)


def _wav(path, seconds=0.6, freq=440.0):
    t = np.arange(int(16000 * seconds)) / 16000
    samples = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.tobytes())
    return str(path)


def _strings(name, tmp_path):
    """Two command-line strings for application ``name``, and the inputs of ``predict`` they stand for."""
    if name in ("translate", "summarize", "sentiment", "lm"):
        texts = ["7 mars 2019", "the plot was wonderful and the cast too"]
        return texts, texts
    if name == "qa":
        pairs = [("Marie Curie was born in 1867 in Warsaw.", "When was Marie Curie born?"),
                 ("The tower is 300 metres high.", "How high is the tower?")]
        return [f"{c}\t{q}" for c, q in pairs], pairs
    if name == "speech":
        files = [_wav(tmp_path / "a.wav"), _wav(tmp_path / "b.wav", 0.8, 300.0)]
        return files, files
    files = [_png(tmp_path / "a.png"), _png(tmp_path / "b.png", (33, 17), 1)]
    return files, files


@pytest.mark.parametrize("name", list(catalogue()))
def test_strings_become_inputs_and_results_become_json_rows(name, tiny_run, tmp_path):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    predictor = load_predictor(tiny_run(name), "cpu")
    strings, by_hand = _strings(name, tmp_path)
    inputs = predictor.inputs_from_strings(strings)
    assert len(inputs) == 2
    results = predictor.predict(inputs)
    if name == "caption":  # files read at the trained size: the batch predict takes
        by_hand = __import__("torch").stack([predictor.read(p) for p in by_hand])
    reference = predictor.predict(by_hand)
    rows = [predictor.result_row(r) for r in results]
    assert rows == [predictor.result_row(r) for r in reference]
    for row in rows:
        text = json.dumps(row, allow_nan=False)  # JSON, no NaN, no tensors
        assert json.loads(text) == row
        assert isinstance(row["output"], str)
        assert all(not isinstance(v, float) or math.isfinite(v) for v in row.values())


@pytest.mark.parametrize("name", list(catalogue()))
@pytest.mark.slow
def test_bad_strings_are_errors_that_name_the_input(name, tiny_run, tmp_path):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    predictor = load_predictor(tiny_run(name), "cpu")
    good, _ = _strings(name, tmp_path)
    with pytest.raises(ValueError, match="input 2 is empty"):
        predictor.inputs_from_strings([good[0], "  "])
    with pytest.raises(ValueError, match="no input"):
        predictor.inputs_from_strings([])
    with pytest.raises(ValueError, match="frobnicate does not apply to"):
        predictor.inputs_from_strings(good, frobnicate=3)
    if predictor.input_kind.endswith("file"):
        missing = str(tmp_path / "missing.xyz")
        with pytest.raises(ValueError, match=f"input 2: no such .* file: {missing}"):
            predictor.inputs_from_strings([good[0], missing])
        with pytest.raises(ValueError, match="input 1: .* is a folder"):
            predictor.inputs_from_strings([str(tmp_path)])
    if name == "qa":
        with pytest.raises(ValueError, match="input 1 must be context<TAB>question"):
            predictor.inputs_from_strings(["a context without its question"])
        with pytest.raises(ValueError, match="input 2: the question is empty"):
            predictor.inputs_from_strings(["Paris is in France.\tWhere?", "Rome is in Italy.\t "])
        with pytest.raises(ValueError, match="^the context is empty"):
            predictor.inputs_from_strings([" \tWhere?"])
        asked = predictor.inputs_from_strings(["Paris is in France.", "Rome is in Italy."], question="Where?")
        assert asked == [("Paris is in France.", "Where?"), ("Rome is in Italy.", "Where?")]


def test_jsonable_leaves_nothing_json_cannot_hold():
    import torch

    from qkv.apps.base import jsonable

    value = {"t": torch.tensor([1.5, float("nan")]), "s": torch.tensor(2), "n": np.float32(0.25), "i": np.int64(3),
             "b": True, "inf": float("-inf"), "nested": ({"a": np.array([1, 2])},), 4: "x"}
    out = jsonable(value)
    assert out == {"t": [1.5, None], "s": 2, "n": 0.25, "i": 3, "b": True, "inf": None, "nested": [{"a": [1, 2]}],
                   "4": "x"}
    assert json.loads(json.dumps(out, allow_nan=False)) == out


@pytest.mark.parametrize("name", list(catalogue()))
def test_qkv_predict_prints_and_writes_each_result_row(name, tiny_run, tmp_path, capsys):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    from qkv.cli import main

    run = tiny_run(name)
    strings, _ = _strings(name, tmp_path)
    predictor = load_predictor(run, "cpu")
    rows = [predictor.result_row(r) for r in predictor.predict(predictor.inputs_from_strings(strings))]
    capsys.readouterr()
    assert main(["predict", str(run), *strings, "--device", "cpu", "--json", str(tmp_path / "rows.json")]) == 0
    printed = [line for line in capsys.readouterr().out.strip().splitlines() if not line.startswith("wrote ")]
    assert len(printed) == len(strings)
    for line, row in zip(printed, rows, strict=True):
        assert line.endswith("\t" + row["output"].replace("\t", " ")) or line.endswith("\t" + row["output"])
    written = json.loads((tmp_path / "rows.json").read_text(encoding="utf-8"))
    assert [{k: v for k, v in w.items() if k not in ("input", "note")} for w in written] == rows
