"""``qkv export`` of the decoders over their decoding state (summarisation, speech, the recurrent translators and
captioners) and of question answering's reader: through ONNX Runtime and :mod:`qkv.export.runtime` (numpy only)
they give qkv's own outputs token for token, on inputs of other sizes than the export's examples, for every
architecture the applications offer."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from qkv.apps import load_predictor
from qkv.cli import main
from tests.export.harness import captions_equal, translations_equal
from tests.helpers import TINY_RUNS, single_thread

pytestmark = pytest.mark.slow  # each export traces a model (seconds)
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")


def _argv(app: str, changes: dict) -> list[str]:
    """The tiny run's command of ``app`` with ``changes`` (``option: value``; None drops the option, True gives the
    bare flag)."""
    argv = list(TINY_RUNS[app])
    for option, value in changes.items():
        flag = "--" + option.replace("_", "-")
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + (2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1)]
        if value is True:
            argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return argv


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """``exported(app, **changes) -> (run, out)``: a tiny run of ``app`` (its options changed) and what
    ``qkv export --with-weights`` wrote for it (once): the decoders below run with the weights as extra outputs."""
    cache = {}

    def get(app: str, **changes):
        key = (app, tuple(sorted(changes.items())))
        if key not in cache:
            if changes:
                tiny_run(app)  # (its data, made once under the tiny runs' root)
                run = tmp_path_factory.mktemp(f"{app}-run")
                argv = [a.format(reviews=tiny_run.root / "reviews.tsv", root=tiny_run.root)
                        for a in _argv(app, changes)] + ["--out", str(run)]
                with single_thread(), contextlib.redirect_stdout(io.StringIO()):
                    assert main(argv) == 0, " ".join(argv)
            else:
                run = tiny_run(app)
            out = tmp_path_factory.mktemp(f"{app}-export")
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["export", str(run), "--out", str(out), "--with-weights"]) == 0
            manifest = json.loads((out / "export.json").read_text())
            for graph in manifest["graphs"].values():
                onnx.checker.check_model(str(out / graph["file"]), full_check=True)
            cache[key] = run, out
        return cache[key]

    return get


def _weights(out, graph: str = "decoder_step") -> list[str]:
    """The attention weights a graph written with ``--with-weights`` gives as outputs."""
    outputs = json.loads((out / "export.json").read_text())["graphs"][graph]["outputs"]
    return [o for o in outputs if o.startswith("attention.")]


# (the plain pointer, content-only LAS and the fixed captioner are left out: their graphs are those below without a
# piece of state, and each export costs seconds of the suite)
SUMMARIZERS = {"pointer with coverage and slots": {"coverage_from": 0, "oov_slots": 2},
               "seq2seq": {"model": "seq2seq"},
               "transformer": {"model": "transformer", "embed_dim": None, "hidden_dim": None, "dim": 8,
                               "num_heads": 2, "num_layers": 1}}


@pytest.mark.parametrize("arch", list(SUMMARIZERS))
def test_summaries_through_onnx_runtime_equal_qkv(exported, arch, one_thread):
    from qkv.apps.summarize.decode import encode_example
    from qkv.export.runtime import Summarizer

    run, out = exported("summarize", **SUMMARIZERS[arch])
    assert _weights(out)
    predictor = load_predictor(run, device="cpu")
    texts = ["Where was Kavik Valgil born? Kavik Valgil was born in Tromso in 1950 and moved to Oslo later.",
             "Who founded Zeltro? Zeltro was founded by Ana Morit.", "the mat"]
    encoded = [encode_example(predictor.tokenizer, t, max_source=predictor.options.max_source) for t in texts]
    assert any(e.oovs for e in encoded)
    summarizer = Summarizer(out)
    for beam in (1, 3):
        want = predictor.predict(texts, beam=beam, max_len=9)
        got = summarizer.decode([e.src for e in encoded], [e.src_ext for e in encoded],
                                [len(e.oovs) for e in encoded], beam=beam, max_len=9)
        for w, g, e in zip(want, got, encoded, strict=True):
            v = predictor.tokenizer.vocab_size
            words = [e.oovs[t - v] if t >= v else predictor.tokenizer.tokens_of_ids([t])[0] for t in g.tokens]
            assert words == w.decoded
            assert g.score == pytest.approx(w.score, abs=1e-3)


SPEECH = {"las + ctc (joint decoding)": {},
          "las, location-aware, windowed": {"ctc_weight": None},
          "transformer + ctc": {"model": "transformer", "hidden_dim": None, "num_layers": 1, "decoder_dim": None,
                                "attn_dim": None, "embed_dim": None, "dim": 8, "num_heads": 2},
          "ctc alone": {"model": "ctc", "ctc_weight": None, "embed_dim": None, "decoder_dim": None,
                        "attn_dim": None}}


@pytest.mark.parametrize("arch", list(SPEECH))
def test_transcripts_through_onnx_runtime_equal_qkv(exported, arch, one_thread):
    from qkv.export.runtime import Transcriber

    run, out = exported("speech", **SPEECH[arch])
    assert arch == "ctc alone" or _weights(out)
    predictor = load_predictor(run, device="cpu")
    gen = torch.Generator().manual_seed(1)
    features = [torch.randn(n, predictor.options.n_mels, generator=gen) for n in (40, 75, 57)]
    transcriber = Transcriber(out)
    for beam in (1, 3):
        # the graphs decode as qkv does without its word model (in the beam and after it: not exported)
        want = predictor.transcribe(features, beam=beam, max_len=12, words="none")
        got = transcriber.decode([f.numpy() for f in features], beam=beam, max_len=12)
        for w, g in zip(want, got, strict=True):
            assert predictor.tokenizer.decode(g.tokens) == w.text
            assert g.score == pytest.approx(w.score, abs=1e-3)
            if w.attention is not None:
                np.testing.assert_allclose(g.attention, w.attention.numpy(), atol=1e-4)


TRANSLATORS = {"bahdanau, gru": {"model": "bahdanau"}, "luong, lstm, 2 layers": {"model": "luong", "cell": "lstm",
                                                                                  "num_layers": 2},
               "fixed": {"model": "fixed"}}


@pytest.mark.parametrize("arch", list(TRANSLATORS))
def test_recurrent_translations_through_onnx_runtime_equal_qkv(exported, arch, one_thread):
    run, out = exported("translate", dim=None, num_heads=None, embed_dim=8, hidden_dim=8, **TRANSLATORS[arch])
    assert arch == "fixed" or _weights(out)
    translations_equal(load_predictor(run, device="cpu"), out)


@pytest.mark.parametrize("arch", ["soft", "hard"])
def test_recurrent_captions_through_onnx_runtime_equal_qkv(exported, arch, one_thread, gen):
    run, out = exported("caption", model=arch, dim=None, num_heads=None, num_layers=None)
    assert _weights(out)
    predictor = load_predictor(run, device="cpu")
    size, channels = predictor.image_size, predictor.channels
    captions_equal(predictor, out, torch.randint(0, 256, (3, channels, size, size), generator=gen, dtype=torch.uint8))


READERS = {"bidaf": {}, "reader": {"model": "reader"},
           "transformer": {"model": "transformer", "embed_dim": None, "hidden_dim": None, "dim": 8,
                           "num_heads": 2, "num_layers": 1}}


@pytest.mark.parametrize("arch", list(READERS))
def test_reader_graph_gives_the_predictor_answers(exported, arch, one_thread):
    from qkv.apps.qa.encode import collate_qa, encode_example

    run, out = exported("qa", **READERS[arch])
    assert _weights(out, "model")
    predictor = load_predictor(run, device="cpu")
    info = json.loads((out / "export.json").read_text())["graphs"]["model"]
    session = ort.InferenceSession(str(out / info["file"]), providers=["CPUExecutionProvider"])
    pairs = [("Kavik Valgil was born in Tromso in 1950 and later moved to Oslo with his two sisters .",
              "Where was Kavik Valgil born ?"), ("Zeltro was founded by Ana .", "Who founded Zeltro ?"),
             ("x", "what ?")]
    batch = collate_qa([encode_example(c, q, predictor.tokenizer, max_question=predictor.options.max_question)
                        for c, q in pairs])
    got = dict(zip(info["outputs"], session.run(None, {k: batch[k].numpy() for k in info["inputs"]}), strict=True))
    for i, w in enumerate(predictor.predict(pairs)):
        assert (int(got["start"][i]), int(got["end"][i])) == (w.start_token, w.end_token)
        assert float(got["probability"][i]) == pytest.approx(w.probability, abs=1e-5)
        n = int(batch["context_mask"][i].sum())
        np.testing.assert_allclose(got["attention"][i, :n], np.array(w.attention), atol=1e-5)


@pytest.mark.parametrize("nbsvm", [{}, {"nbsvm": True, "nbsvm_buckets": 300}], ids=["plain", "nbsvm-path"])
def test_recurrent_sentiment_graph_gives_the_predictor_logits(exported, one_thread, nbsvm):
    from qkv.data.text_classification import collate_texts

    run, out = exported("sentiment", model="bigru", dim=None, num_heads=None, hidden_dim=32, **nbsvm)
    assert (load_predictor(run, device="cpu").model.nbsvm is not None) == bool(nbsvm)
    predictor = load_predictor(run, device="cpu")
    info = json.loads((out / "export.json").read_text())["graphs"]["model"]
    session = ort.InferenceSession(str(out / info["file"]), providers=["CPUExecutionProvider"])
    for texts in (["a fine film", "dull , long and far too loud for its own good", "bad"], ["good fun"]):
        batch = collate_texts([(predictor.tokenizer.encode(t), 0) for t in texts])
        got = dict(zip(info["outputs"], session.run(None, {"ids": batch["ids"].numpy(),
                                                          "mask": batch["mask"].numpy()}), strict=True))
        with torch.no_grad():
            res = predictor.model(batch["ids"], batch["mask"])
        np.testing.assert_allclose(got["logits"], res.logits.numpy(), atol=1e-4)
        weights = res.weights.float()
        np.testing.assert_allclose(got["weights"], (weights.mean(1) if weights.dim() == 3 else weights).numpy(),
                                   atol=1e-5)
