"""``qkv export RUN --out DIR``: every exported application gives in ONNX Runtime what qkv gives in PyTorch, on
inputs of other batch sizes and lengths than the export's examples; bad input is a one-line error."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import qkv
from qkv.apps import load_predictor
from qkv.apps.export import export_run
from qkv.cli import main
from qkv.export import ExportError, check_exportable
from tests.export.harness import captions_equal, translations_equal

pytestmark = pytest.mark.slow  # each export traces a model (seconds)
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """``exported(name, with_weights)``: the directory ``qkv export`` wrote for the tiny run ``name`` (once)."""
    cache = {}

    def get(name: str, with_weights: bool = False):
        if (name, with_weights) not in cache:
            out = tmp_path_factory.mktemp(f"export-{name}")
            argv = ["export", str(tiny_run(name)), "--out", str(out)] + (["--with-weights"] if with_weights else [])
            assert main(argv) == 0
            cache[name, with_weights] = out
        return cache[name, with_weights]

    return get


def _session(directory, graph="model"):
    manifest = json.loads((directory / "export.json").read_text())
    path = directory / manifest["graphs"][graph]["file"]
    onnx.checker.check_model(str(path), full_check=True)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), manifest["graphs"][graph]


def test_sentiment_graph_gives_the_predictor_logits_and_every_attention(tiny_run, exported, one_thread):
    out = exported("sentiment", with_weights=True)
    session, info = _session(out)
    assert (out / "tokenizer").is_dir() and json.loads((out / "config.json").read_text())["config"]["model"]
    predictor = load_predictor(tiny_run("sentiment"), device="cpu")
    from qkv.data.text_classification import collate_texts

    for texts in (["a fine film", "dull , long and far too loud for its own good", "bad"], ["good fun"]):
        batch = collate_texts([(predictor.tokenizer.encode(t), 0) for t in texts])
        got = dict(zip(info["outputs"], session.run(None, {"ids": batch["ids"].numpy(),
                                                          "mask": batch["mask"].numpy()}), strict=True))
        with torch.no_grad(), qkv.capture_attention(predictor.model, join_steps=False) as records:
            res = predictor.model(batch["ids"], batch["mask"])
        np.testing.assert_allclose(got["logits"], res.logits.numpy(), atol=1e-4)
        np.testing.assert_allclose(got["weights"], res.weights.numpy(), atol=1e-5)
        names = [n for n in info["outputs"] if n.startswith("attention.")]
        assert names == [f"attention.{r.name}" for r in records] and names
        for name, r in zip(names, records, strict=True):
            np.testing.assert_allclose(got[name], r.weights.numpy(), atol=1e-5)
        # the predictor's own reading of the same texts
        probs = torch.from_numpy(got["logits"]).softmax(-1)
        for p, pred in zip(probs, predictor.predict(texts), strict=True):
            assert predictor.label_names[int(p.argmax())] == pred.label


def test_image_graph_gives_the_predictor_logits(tiny_run, exported, one_thread, gen):
    out = exported("images")
    session, info = _session(out)
    predictor = load_predictor(tiny_run("images"), device="cpu")
    for b in (3, 1):
        images = torch.randint(0, 256, (b, *predictor.image_size), generator=gen, dtype=torch.uint8)
        (logits,) = session.run(None, {"pixels": (images.float() / 255)[:, None].numpy()})
        with torch.no_grad():
            want = predictor.model(predictor._inputs(images))
        np.testing.assert_allclose(logits, want.numpy(), atol=1e-4)
    assert info["class_names"] == list(predictor.class_names)


def test_segmentation_graph_takes_any_size(tiny_run, exported, one_thread, gen):
    out = exported("segment", with_weights=True)
    session, info = _session(out)
    predictor = load_predictor(tiny_run("segment"), device="cpu")
    from qkv.apps.segment.task import normalize

    for b, h, w in ((1, 40, 33), (2, 57, 72)):
        images = torch.randint(0, 256, (b, predictor.channels, h, w), generator=gen, dtype=torch.uint8)
        got = session.run(None, {"pixels": (images.float() / 255).numpy()})
        with torch.no_grad(), qkv.capture_attention(predictor.model, join_steps=False) as records:
            want = predictor.model(normalize(images, predictor.mean, predictor.std))
        assert got[0].shape == (b, len(predictor.class_names), h, w)
        np.testing.assert_allclose(got[0], want.numpy(), atol=1e-4)
        for name, r, g in zip(info["outputs"][1:], records, got[1:], strict=True):
            assert name == f"attention.{r.name}"
            np.testing.assert_allclose(g, r.weights.numpy(), atol=1e-5)


def test_translation_through_onnx_runtime_equals_qkv(tiny_run, exported, one_thread):
    out = exported("translate")
    for graph in ("encoder", "decoder_step"):
        _session(out, graph)
    translations_equal(load_predictor(tiny_run("translate"), device="cpu"), out)


def test_captions_through_onnx_runtime_equal_qkv(tiny_run, exported, one_thread, gen):
    out = exported("caption")
    predictor = load_predictor(tiny_run("caption"), device="cpu")
    size, channels = predictor.image_size, predictor.channels
    images = torch.randint(0, 256, (3, channels, size, size), generator=gen, dtype=torch.uint8)
    for w, g in captions_equal(predictor, out, images):
        n = len(w.words)
        np.testing.assert_allclose(g.attention[:n].reshape(w.attention.shape), w.attention.numpy(), atol=1e-4)


# ------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("app", ["sentiment", "summarize", "speech", "qa"])
def test_a_run_without_weights_is_a_one_line_error(tiny_run, tmp_path, capsys, app):
    run = tmp_path / "run"
    shutil.copytree(tiny_run(app), run)
    for weights in run.rglob("model.safetensors"):
        weights.unlink()
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error: ") and "\n" not in err and str(run) in err
    assert not (tmp_path / "out" / "export.json").exists()


def test_an_unwritable_out_is_a_one_line_error(tiny_run, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["export", str(tiny_run("sentiment")), "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error: --out ") and "\n" not in err
    assert main(["export", str(tiny_run("sentiment"))]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_model_with_a_python_score_is_refused(tiny_run, tmp_path, monkeypatch, capsys):
    predictor = load_predictor(tiny_run("sentiment"), device="cpu")

    def my_score(q, k):
        return q @ k.transpose(-2, -1)

    layer = next(m for m in predictor.model.modules() if isinstance(m, qkv.MultiHeadAttention))
    layer.score = qkv.scores.get_score(my_score)
    with pytest.raises(ExportError, match="my_score"):
        check_exportable(predictor.model)
    import qkv.apps.export as run_module
    from qkv.apps import application

    monkeypatch.setattr(run_module, "_load", lambda run: (application("sentiment"), predictor, None))
    assert main(["export", str(tiny_run("sentiment")), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Python function as its score" in err and "\n" not in err
    with pytest.raises(ExportError, match="Python function"):
        export_run(tiny_run("sentiment"), tmp_path / "out")


def test_the_serving_example_of_the_docs_runs_without_torch(tiny_run, exported, tmp_path, monkeypatch):
    """The ten lines of ``docs/export.md`` (numpy and onnxruntime only) on an exported run give the predictor's
    label and the graph's weights."""
    import contextlib
    import io
    import re
    import sys

    from tests import ROOT

    text = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "onnxruntime" in b)
    assert len(code.strip().splitlines()) <= 10 and "torch" not in code.replace("onnxruntime", "")
    predictor = load_predictor(tiny_run("sentiment"), device="cpu")
    (want,) = predictor.predict(["a quiet , moving film"])
    shutil.copytree(exported("sentiment"), tmp_path / "exported")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch in the example would fail
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "docs/export.md", "exec"), {})
    finally:
        monkeypatch.undo()
    label, *weights = printed.getvalue().split(maxsplit=1)
    assert label == want.label and weights
