"""``export_run(run, out)``: a trained run as ONNX graphs, with its tokenisers and configuration as JSON beside
them, servable by ONNX Runtime without PyTorch.

What each application becomes (``export.json`` in ``out`` lists the graphs, their inputs and outputs):

- sentiment, images, segmentation, question answering's reader: one graph, ``model.onnx``;
- translation and captioning with a Transformer: ``encoder.onnx`` and ``decoder_step.onnx`` (one decoding step,
  the keys and values of every layer's self-attention as inputs and outputs);
- the recurrent translators and captioners, summarisation and speech recognition: ``encoder.onnx`` (the decoding
  state as named tensors) and ``decoder_step.onnx`` (:mod:`qkv.export.state`; a CTC speech model has the encoder
  only).

:mod:`qkv.export.runtime` decodes over them (greedy and beam search, numpy only) as qkv's own decoder does. A model
holding a user's Python function (a score, normaliser or modifier), whose code the run does not carry, is refused
with an :class:`~qkv.export.graph.ExportError`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from torch import nn

from ..mods import is_builtin
from ..normalize import NORMALIZERS
from ..scores import FunctionScore
from .graph import ExportError, require_onnx, to_onnx
from .weights import WithWeights, weight_names

logger = logging.getLogger(__name__)

__all__ = ["export_run", "check_exportable", "EXPORTED", "MANIFEST"]

#: the applications :func:`export_run` exports
EXPORTED = ("sentiment", "images", "segment", "translate", "caption", "summarize", "speech", "qa")
#: the file in ``out`` that lists the graphs, their inputs and outputs
MANIFEST = "export.json"


def check_exportable(model: nn.Module) -> None:
    """An :class:`ExportError` naming the module when ``model`` holds a user's Python score, normaliser or
    modifier: its code is not part of the run, and a graph would freeze whatever it computed on one input."""
    for name, module in model.named_modules():
        where = name or type(model).__name__
        if isinstance(module, FunctionScore):
            raise ExportError(f"{where} uses a Python function as its score ({module.extra_repr()}): a run holding "
                              "a user's score cannot be exported; use one of qkv's scores")
        normalize = getattr(module, "normalize", None)
        if callable(normalize) and not isinstance(normalize, nn.Module) and normalize not in NORMALIZERS.values():
            raise ExportError(f"{where} uses a Python function as its normaliser "
                              f"({getattr(normalize, '__name__', normalize)!r}): only softmax, sparsemax and smooth "
                              "export")
        for attr in ("score_mod", "mask_mod"):
            mod = getattr(module, attr, None)
            if mod is not None and not isinstance(mod, nn.Module) and not is_builtin(mod):
                raise ExportError(f"{where} uses a Python function as its {attr} "
                                  f"({getattr(mod, '__name__', mod)!r}): only qkv.mods' modifiers export")


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".qkv-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ExportError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _load(run: Path):
    from ..apps import application_of, load_predictor

    if not run.is_dir():
        raise ExportError(f"{run}: no such run directory")
    try:
        app = application_of(run)
        predictor = load_predictor(run, device="cpu")
    except (ValueError, OSError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{run}: cannot load the run ({first})") from None
    return app.name, predictor


def export_run(run: str | os.PathLike, out: str | os.PathLike, *, with_weights: bool = False) -> dict[str, Any]:
    """Export the run at ``run`` into the directory ``out`` (created); returns the manifest written to
    ``out/export.json``. ``with_weights`` adds every attention module's weights as outputs named
    ``attention.<module path>``. Errors (a run without weights, an application or model that cannot be exported,
    an unwritable ``out``) are :class:`ExportError` with one line."""
    run, out = Path(run), Path(out)
    require_onnx()
    name, predictor = _load(run)
    if name not in EXPORTED:
        raise ExportError(f"{run}: {name} runs cannot be exported yet (exported: {', '.join(EXPORTED)})")
    check_exportable(predictor.model)
    _writable(out)
    from . import apps

    graphs = getattr(apps, name)(predictor)
    manifest: dict[str, Any] = {"application": name, "run": str(run), "graphs": {}}
    for graph_name, (module, example, extra) in graphs.items():
        inputs, outputs, dynamic = list(module.inputs), list(module.outputs), list(module.dynamic)
        torchscript = getattr(module, "torchscript", None)
        if with_weights:
            module = WithWeights(module, predictor.model)
            outputs += weight_names(module, *example)
        # size conditions that hold for every size but are not proven become checks (weights of a strided
        # encoder's frames; grouped-query attention over a key/value cache)
        checks = with_weights or (graph_name == "decoder_step" and _grouped(predictor.model))
        path = to_onnx(module, example, out / f"{graph_name}.onnx", input_names=inputs, output_names=outputs,
                       dynamic=dynamic, runtime_checks=checks,
                       torchscript=torchscript)
        manifest["graphs"][graph_name] = {"file": path.name, "inputs": inputs, "outputs": outputs, **extra}
    for asset in predictor.task_class.assets:
        getattr(predictor, asset).save(out / asset)
    shutil.copyfile(_config_file(run), out / "config.json")
    manifest["assets"] = list(predictor.task_class.assets)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    logger.info("exported %s run %s to %s", name, run, out)
    return manifest


def _grouped(model: nn.Module) -> bool:
    """Whether ``model`` has grouped-query attention: its decoder step over a key/value cache needs
    ``runtime_checks`` (a stride comparison PyTorch's symbolic shapes cannot prove, true for every length)."""
    from ..layers import MultiHeadAttention

    return any(m.kv_heads != m.num_heads for m in model.modules() if isinstance(m, MultiHeadAttention))


def _config_file(run: Path) -> Path:
    for d in (run / "best", run / "checkpoint", run):
        if (d / "config.json").is_file():
            return d / "config.json"
    raise ExportError(f"{run}: no config.json")
