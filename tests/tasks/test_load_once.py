"""A run is read once: `application_of` opens its `config.json` only, and `Predictor.load` + `evaluate` open its
`model.safetensors` exactly once."""

from unittest import mock

import safetensors.torch

import qkv.train.checkpoint as checkpoint
from qkv.tasks import application_of, load_predictor


def test_application_of_reads_no_weights_and_a_predictor_reads_them_once(tiny_run, one_thread):
    run = tiny_run("translate")
    opened = []
    real = safetensors.torch.load_file

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    with mock.patch.object(checkpoint, "load_file", counting), mock.patch.object(safetensors.torch, "load_file",
                                                                                counting):
        assert application_of(run).name == "translate"
        assert opened == []
        predictor = load_predictor(run, "cpu")
        figures = predictor.evaluate(limit=3, beam=1)
    assert [p.rpartition("/")[2] for p in opened] == ["model.safetensors"]
    assert 0 <= figures["exact_match"] <= 1
