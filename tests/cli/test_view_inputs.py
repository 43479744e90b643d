"""`qkv view` refuses what a run would not look at (a question to a translator, a text to an image model, an image
to a question-answering model), naming it, before any page is written; what it looks at is taken."""

import pytest

from qkv.apps import application, catalogue
from qkv.apps.base import ViewInput
from qkv.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

GIVEN = {"text": ViewInput(text="a text"), "image": ViewInput(image="x.png"), "index": ViewInput(index=0),
         "question": ViewInput(text="a context", question="a question?")}


@pytest.mark.parametrize("name", list(catalogue()))
def test_every_predictor_names_the_view_inputs_it_does_not_look_at(name):
    predictor = application(name).predictor
    takes = predictor.view_inputs
    assert takes and set(takes) <= set(GIVEN)
    stub = object.__new__(predictor)
    for given in GIVEN.values():
        unused = [f for f in GIVEN if getattr(given, f) is not None and f not in takes]
        if unused:
            with pytest.raises(ValueError, match=f"a {name} run does not look at"):
                stub.check_view_input(given)
        else:
            stub.check_view_input(given)


@pytest.mark.parametrize("name, argv, flag", [
    ("translate", ["7 mars 2019", "--question", "When?"], "--question"),
    ("images", ["some text"], "a text"),
    ("qa", ["--image", "x.png", "--question", "Who?"], "--image"),
])
def test_qkv_view_refuses_what_the_run_would_not_look_at(name, argv, flag, tiny_run, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["view", str(tiny_run(name)), *argv, "--out", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and flag in err and len(err.splitlines()) == 1
    assert not page.exists()


@pytest.mark.parametrize("name", list(catalogue()))
@pytest.mark.slow
def test_qkv_view_writes_a_page_for_a_tiny_run_of_every_application(name, tiny_run, tmp_path, capsys):
    import shutil

    from tests.apps.test_predict_contract import _png, _wav

    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    takes = application(name).predictor.view_inputs
    if "image" in takes:
        given = ["--image", _png(tmp_path / "a.png", (40, 44))]
    elif name == "speech":
        given = [_wav(tmp_path / "a.wav")]
    elif "question" in takes:
        given = ["Marie Curie was born in 1867 in Warsaw.", "--question", "When was Marie Curie born?"]
    else:
        given = ["the plot was wonderful and 7 mars 2019"]
    page = tmp_path / "page.html"
    assert main(["view", str(tiny_run(name)), *given, "--out", str(page)]) == 0, capsys.readouterr().err
    assert f"wrote {page}" in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "attention" in html.lower()
