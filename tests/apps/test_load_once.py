"""A run is read once: `application_of` opens its `config.json` only, and `Predictor.load` + `evaluate` open its
`model.safetensors` exactly once, for every application."""

import shutil
from unittest import mock

import pytest
import safetensors.torch

import qkv.train.checkpoint as checkpoint
from qkv.apps import application_of, catalogue, load_predictor

SETTINGS = {"translate": {"beam": 1}, "caption": {"beam": 1}, "summarize": {"beam": 1, "baselines": False}}


@pytest.mark.parametrize("name", list(catalogue()))
@pytest.mark.slow
def test_application_of_reads_no_weights_and_a_predictor_reads_them_once(name, tiny_run, one_thread):
    if name == "speech" and (shutil.which("espeak-ng") is None or shutil.which("flite") is None):
        pytest.skip("espeak-ng and flite are not installed (make data)")
    run = tiny_run(name)
    opened = []
    real = safetensors.torch.load_file

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    with mock.patch.object(checkpoint, "load_file", counting), \
            mock.patch.object(safetensors.torch, "load_file", counting):
        assert application_of(run).name == name
        assert opened == []
        predictor = load_predictor(run, "cpu")
        figures = predictor.evaluate(limit=2, **SETTINGS.get(name, {}))
    assert [p.rpartition("/")[2] for p in opened] == ["model.safetensors"]
    assert figures and all(isinstance(v, float) for v in figures.values())
