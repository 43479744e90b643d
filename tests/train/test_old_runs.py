"""Runs written by qkv 0.1.0 (checkpoint format version 1, tests/fixtures/v1) load and predict what they did then."""

import json
import shutil

import pytest
import torch

from qkv.apps.images import ImageClassifier
from qkv.apps.sentiment import SentimentClassifier
from qkv.apps.translate import Translator
from qkv.data.images import load_image_splits, normalize
from tests import FIXTURES

V1 = FIXTURES / "v1"
EXPECTED = json.loads((V1 / "expected.json").read_text(encoding="utf-8"))
TEXTS = ["7 mars 2019", "2019年3月7日", "Thursday, March 7, 2019", "12/31/1999"]
REVIEWS = ["a wonderful moving story.", "the plot is dull and clumsy.", "an actor", "Brilliant!"]


@pytest.mark.parametrize("kind", ["bahdanau", "transformer"])
@pytest.mark.parametrize("beam", [1, 3])
def test_translation_runs_translate_as_before(kind, beam, one_thread):
    translator = Translator.load(V1 / f"translate-{kind}")
    assert translator.options.model == kind
    results = translator.predict(TEXTS, beam=beam, max_len=20)
    for got, want in zip(results, EXPECTED[f"translate-{kind}-beam{beam}"], strict=True):
        assert got.text == want["text"]
        assert got.score == pytest.approx(want["score"], abs=1e-4)
        torch.testing.assert_close(got.attention, torch.tensor(want["attention"]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["bigru", "transformer"])
def test_sentiment_runs_classify_as_before(kind, one_thread):
    clf = SentimentClassifier.load(V1 / f"sentiment-{kind}")
    for got, want in zip(clf.predict(REVIEWS), EXPECTED[f"sentiment-{kind}"], strict=True):
        assert got.label == want["label"] and got.tokens == want["tokens"]
        for name, p in want["probabilities"].items():
            assert got.probabilities[name] == pytest.approx(p, abs=1e-5)
        assert got.weights == pytest.approx(want["weights"], abs=1e-5)


def test_sentiment_run_options_in_the_new_vocabulary():
    clf = SentimentClassifier.load(V1 / "sentiment-bigru")
    # 0.1.0's RNN hidden_dim was per direction (8); now it is both directions together
    assert clf.options.hidden_dim == 16 and clf.options.num_layers == 1 and clf.options.header
    assert clf.config["model"]["name"] == "bigru-classifier"
    assert SentimentClassifier.load(V1 / "sentiment-transformer").options.dim == 16


def test_image_run_predicts_and_attends_as_before(one_thread):
    want = EXPECTED["images-cbam"]
    clf = ImageClassifier.load(V1 / "images-cbam")
    images, _ = load_image_splits("digits", valid=clf.options.valid, test=clf.options.test,
                                  seed=clf.options.data_seed).splits["test"]
    x = images[want["test_index"]]
    with torch.no_grad():
        logits, maps = clf.model(normalize(x, clf.mean, clf.std), return_attention=True)
    torch.testing.assert_close(logits, torch.tensor(want["logits"]), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(maps["stage3"].spatial, torch.tensor(want["spatial_stage3"]), atol=1e-5, rtol=1e-4)
    predicted = [p.label for p in clf.predict(x)]
    assert predicted == [clf.class_names[int(k)] for k in torch.tensor(want["logits"]).argmax(-1)]


def _copy(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(V1 / name, dst)
    return dst


def test_a_newer_format_is_refused_with_its_version(tmp_path):
    run = _copy(tmp_path, "sentiment-bigru")
    cfg = run / "best" / "config.json"
    meta = json.loads(cfg.read_text())
    meta["version"] = 99
    cfg.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="newer qkv.*version 99.*upgrade qkv"):
        SentimentClassifier.load(run)


def test_a_damaged_old_config_names_the_file(tmp_path):
    run = _copy(tmp_path, "translate-bahdanau")
    cfg = run / "best" / "config.json"
    meta = json.loads(cfg.read_text())
    del meta["config"]["arch"]
    cfg.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"config\.json.*format-version-1 translate"):
        Translator.load(run)


def test_another_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds a 'images' model, not a 'sentiment' one"):
        SentimentClassifier.load(V1 / "images-cbam")


def test_the_application_of_an_old_run_is_read_from_its_config_alone():
    from qkv.apps import application_of, load_predictor

    for name, task in (("translate-bahdanau", "translate"), ("sentiment-bigru", "sentiment"),
                       ("images-cbam", "images")):
        assert application_of(V1 / name).name == task
    assert load_predictor(V1 / "sentiment-bigru", "cpu").options.hidden_dim == 16


def test_an_application_born_in_format_2_has_no_old_runs(tmp_path):
    """One upgrade function (qkv.train.upgrade) for every application: those with no format-1 runs refuse one."""
    from qkv.apps.qa import Reader

    run = _copy(tmp_path, "sentiment-bigru")
    cfg = run / "best" / "config.json"
    cfg.write_text(cfg.read_text().replace('"task": "sentiment"', '"task": "qa"'))
    with pytest.raises(ValueError, match="qa runs exist only in checkpoint format 2 and later"):
        Reader.load(run)
