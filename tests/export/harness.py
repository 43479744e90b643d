"""Run a module eagerly, under ``torch.compile(fullgraph=True)``, as a ``torch.export`` program and in ONNX Runtime,
and compare: the traced forms are made on example inputs and run on inputs of other sizes (the dynamic axes)."""

from __future__ import annotations

import torch

from qkv.export.graph import export_program, to_onnx


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _close(got, want, atol, what):
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g = torch.as_tensor(g)
        assert tuple(g.shape) == tuple(w.shape), f"{what} output {i}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        torch.testing.assert_close(g.to(w.dtype), w, atol=atol, rtol=1e-4, msg=lambda m, i=i: f"{what} output {i}: {m}")


def compiles(module, args, others=(), atol=1e-5, backend="eager", dynamic=True):
    """``torch.compile(fullgraph=True)`` (a graph break raises; dynamo with the eager backend by default, which
    checks the tracing in a fraction of inductor's time) gives the eager outputs on ``args`` and on every input
    tuple of ``others``."""
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for a in (args, *others):
            _close(compiled(*a), module(*a), atol, "torch.compile")


def exports(module, args, others, dynamic, atol=1e-5, **options):
    """The ``torch.export`` program made on ``args`` gives the eager outputs on ``others``."""
    program = export_program(module, args, dynamic, **options).module()
    with torch.no_grad():
        for a in others:
            _close(program(*a), module(*a), atol, "torch.export")
    return program


def runs_in_onnx(module, args, others, dynamic, path, atol=1e-4, **options):
    """The ONNX graph made on ``args`` gives in ONNX Runtime the eager outputs on ``others``."""
    import onnxruntime as ort

    names = [f"in{i}" for i in range(len(args))]
    with torch.no_grad():
        n_out = len(_flat(module(*args)))
    to_onnx(module, args, path, input_names=names, output_names=[f"out{i}" for i in range(n_out)], dynamic=dynamic,
            **options)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fed = {i.name for i in session.get_inputs()}
    with torch.no_grad():
        for a in others:
            got = session.run(None, {n: t.numpy() for n, t in zip(names, a, strict=True) if n in fed})
            _close([torch.from_numpy(g) for g in got], module(*a), atol, "onnxruntime")


#: sources of several lengths and languages for the exported translators
DATE_TEXTS = ["3 March 2021", "le 12 avril 1999", "2001-05-06", "Tuesday, 9 January 2024", "7/8/1990"]


def translations_equal(predictor, out) -> None:
    """The numpy/ONNX Runtime loop over what ``qkv export`` wrote in ``out`` translates as ``predictor`` does, at
    beam 1 and 3: the same text, score and alignment."""
    import numpy as np
    import pytest

    from qkv.apps.translate.decode import source_ids
    from qkv.export.runtime import Translator

    translator = Translator(out)
    for beam in (1, 3):
        want = predictor.predict(DATE_TEXTS, beam=beam, max_len=12)
        got = translator.decode([source_ids(predictor.src_tokenizer, t)[0] for t in DATE_TEXTS], beam=beam,
                                max_len=12)
        for w, g in zip(want, got, strict=True):
            assert predictor.tgt_tokenizer.decode(g.tokens) == w.text
            assert g.score == pytest.approx(w.score, abs=1e-3)
            np.testing.assert_allclose(g.attention, w.attention.numpy(), atol=1e-4)


def captions_equal(predictor, out, images) -> list:
    """The loop over ``out`` captions ``images`` (uint8) as ``predictor`` does, at beam 1 and 3 (text and score);
    the pairs ``(qkv's, the loop's)`` of the last beam."""
    import pytest

    from qkv.export.runtime import Captioner

    captioner = Captioner(out)
    for beam in (1, 3):
        want = predictor.predict(images, beam=beam, max_len=8)
        got = captioner.decode((images.float() / 255).numpy(), beam=beam, max_len=8)
        for w, g in zip(want, got, strict=True):
            assert predictor.tokenizer.decode(g.tokens) == w.text
            assert g.score == pytest.approx(w.score, abs=1e-3)
    return list(zip(want, got, strict=True))
