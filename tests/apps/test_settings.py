"""Every application's settings (``Predictor.settings``: one typed dataclass) and inputs (``Predictor.accepts``),
declared once: what does not apply is refused in one message, a bad value names its setting, and an input outside
what the application takes is one line naming it, through ``predict``, ``qkv predict`` and ``qkv view``."""

import inspect
import shutil

import pytest
import torch

from qkv.apps import catalogue, load_predictor
from qkv.cli import main
from qkv.options import base_type, field_type, option_fields

NAMES = list(catalogue())


def _predictor(name, tiny_run):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    return load_predictor(tiny_run(name), "cpu")


def _bad(cls, f, spec):
    """A value of field ``f`` that its type, choices or bounds refuse (``None`` when there is none)."""
    tp, _ = base_type(field_type(cls, f.name))
    if spec.choices:
        return "nonsense"
    if tp is bool:
        return "yes"
    if tp in (int, float) and spec.low is not None:
        return spec.low if spec.low_open else spec.low - 1
    if tp in (int, float) and spec.high is not None:
        return spec.high + 1
    return None


@pytest.mark.parametrize("name", NAMES)
def test_settings_are_declared_for_what_predict_and_evaluate_take(name):
    app = __import__("qkv.apps", fromlist=["application"]).application(name)
    cls = app.predictor.settings
    assert cls is not None
    takes = {k for m in ("predict", "evaluate") for k in inspect.signature(getattr(app.predictor, m)).parameters}
    assert {f.name for f, _ in option_fields(cls)} <= takes


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_setting_is_refused_in_one_message_and_a_bad_value_names_its_setting(name, tiny_run, one_thread):
    predictor = _predictor(name, tiny_run)
    for method in ("predict", "evaluate"):
        with pytest.raises(ValueError, match=rf"^frobnicate does not apply to {name} runs \((their settings: "
                                             r"[a-z_, ]+|they take no setting)\)$"):
            predictor.check_settings({"frobnicate": 1}, method)
    with pytest.raises((TypeError, ValueError), match="frobnicate"):
        predictor.evaluate(frobnicate=1)
    cls = predictor.settings
    for f, spec in option_fields(cls):
        bad = _bad(cls, f, spec)
        if bad is None:
            continue
        method = "predict" if f.name in inspect.signature(predictor.predict).parameters else "evaluate"
        with pytest.raises(ValueError, match=f"^{f.name} must be"):
            predictor.check_settings({f.name: bad}, method)


@pytest.mark.parametrize("name, flags", [("translate", ["--beam", "0"]), ("summarize", ["--no-repeat-ngram", "-1"]),
                                         ("lm", ["--temperature", "0"]), ("caption", ["--hard-test", "x"])])
def test_qkv_predict_takes_the_settings_as_flags_and_names_a_bad_one(name, flags, tiny_run, capsys, one_thread):
    run = str(tiny_run(name))
    given = {"caption": ["x.png"]}.get(name, ["ab"])
    try:
        code = main(["predict", run, *given, *flags])
    except SystemExit as e:  # a choice argparse refuses itself
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and flags[0] in err


def test_a_setting_of_evaluate_only_is_refused_by_predict(tiny_run, one_thread):
    translator = _predictor("translate", tiny_run)
    with pytest.raises(ValueError, match=r"^buckets does not apply to translate runs \(their settings: lm, "
                                         r"lm_weight, length_reward, beam, max_len, length_penalty\)"):
        translator.check_settings({"buckets": "0,10"}, "predict")
    assert translator.check_settings({"buckets": "0,10"}, "evaluate") == {"buckets": "0,10"}


def _png(path, size):
    from PIL import Image

    Image.new("RGB", size, (200, 40, 40)).save(path)
    return str(path)


def test_a_segmentation_run_refuses_an_image_smaller_than_it_reads(tiny_run, tmp_path, capsys, one_thread):
    run = str(tiny_run("segment"))
    segmenter = _predictor("segment", tiny_run)
    assert segmenter.accepts.min_image == 3  # circular padding (scenes): the stem's 7x7 pads 3 pixels
    tiny = _png(tmp_path / "tiny.png", (2, 5))
    message = f"{tiny}: an image of 5x2 pixels; segment runs take images of at least 3x3"
    with pytest.raises(ValueError, match=f"^{message}$"):
        segmenter.predict([tiny])
    with pytest.raises(ValueError, match=r"^image 2: an image of 1x1 pixels"):
        segmenter.predict([torch.zeros(segmenter.channels, 8, 8), torch.zeros(segmenter.channels, 1, 1)])
    for side in range(3, 9):  # every size from the smallest up reads
        (result,) = segmenter.predict([torch.rand(segmenter.channels, side, side + 1)])
        assert tuple(result.labels.shape) == (side, side + 1)
    for argv in (["predict", run, tiny], ["view", run, "--image", tiny, "--out", str(tmp_path / "p.html")],
                 ["segment", run, tiny]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"qkv: error: {message}", argv
    assert not (tmp_path / "p.html").exists()


def test_image_and_caption_runs_read_an_image_of_any_size(tiny_run, tmp_path, capsys, one_thread):
    tiny = _png(tmp_path / "pixel.png", (1, 1))
    for name in ("images", "caption"):
        predictor = _predictor(name, tiny_run)
        assert predictor.accepts.min_image == 1  # resized to the trained size
        assert main(["predict", str(tiny_run(name)), tiny]) == 0
    assert capsys.readouterr().out.count(tiny) == 2


@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 5e-324])
def test_sampling_at_a_tiny_temperature_is_greedy(temperature, tiny_run, capsys, one_thread):
    from qkv.models.lm import sample_next

    logits = torch.tensor([[1.0, 3.0, 2.5, -4.0], [0.2, -1.0, 0.7, 0.7]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, temperature=temperature, generator=g) for _ in range(50)])
    assert (draws[:, 0] == 1).all() and set(draws[:, 1].tolist()) <= {2, 3}  # a tie is shared, never NaN
    lm = _predictor("lm", tiny_run)
    cold = lm.predict(["ab", "c"], max_new_tokens=8, temperature=temperature, seed=0)
    greedy = lm.predict(["ab", "c"], max_new_tokens=8, greedy=True)
    assert [r.text for r in cold] == [r.text for r in greedy]
    assert main(["generate", str(tiny_run("lm")), "ab", "--temperature", str(temperature), "--max-new-tokens",
                 "8"]) == 0
    assert capsys.readouterr().out.strip() == f"ab\t{greedy[0].text}".strip()
