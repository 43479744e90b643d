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
with an :class:`~qkv.export.graph.ExportError`. An application says what its runs become with its ``export`` hook
(``predictor -> graphs``, in ``qkv/apps/NAME/export.py``); one without it cannot be exported.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from torch import nn

from ..export.graph import ExportError, check_exportable, require_onnx, to_onnx
from ..export.weights import WithWeights, weight_names
from ..options import option_error, ref

logger = logging.getLogger(__name__)

__all__ = ["export_run", "exported", "text_classifier_graphs", "MANIFEST"]

#: the file in ``out`` that lists the graphs, their inputs and outputs
MANIFEST = "export.json"


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".qkv-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise option_error(ExportError, ref("out") + " {path}: cannot write there ({why})", "out", path=out,
                           why=e.strerror or e) from None


def text_classifier_graphs(predictor, **extra: Any) -> dict[str, Any]:
    """The export of a text classifier (``model(ids, mask)`` -> ``.logits``, ``.weights``; its ``tokenizer`` an
    asset), an application's ``export`` as it is: ``model.onnx``, token ids and their mask in, the class scores and
    the pooled attention out; ``extra`` goes into the manifest."""
    import torch

    from ..export.classify import SentimentGraph

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, max(predictor.tokenizer.vocab_size, 5), (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    ids[1, 5:] = 0
    return {"model": (SentimentGraph(predictor.model), (ids, mask), extra)}


def exported() -> list[str]:
    """The applications whose runs :func:`export_run` exports (those with an ``export`` hook)."""
    from . import application, catalogue

    return [name for name in catalogue() if application(name).export is not None]


def _load(run: Path):
    from ..train.checkpoint import load_checkpoint
    from . import application, load_predictor

    if not run.is_dir():
        raise ExportError(f"{run}: no such run directory")
    try:
        ckpt = load_checkpoint(run)
        predictor = load_predictor(ckpt, device="cpu")
    except (ValueError, OSError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{run}: cannot load the run ({first})") from None
    return application(ckpt.task), predictor, ckpt.path


def _clear(out: Path, run: Path, checkpoint: Path) -> None:
    """``out`` ready for an export: not inside the run (its checkpoints stay as they are: the run's folder when
    ``run`` names one of its checkpoints), and the files of an earlier export there removed, its manifest first
    (no stale graph is left beside the new ones, and an export that fails leaves no manifest naming removed files)."""
    roots = {run.resolve(), checkpoint.resolve()}
    if checkpoint.resolve().name in ("best", "checkpoint"):
        roots.add(checkpoint.resolve().parent)
    target = out.resolve()
    inside = next((r for r in sorted(roots) if target == r or r in target.parents), None)
    if inside is not None:
        raise option_error(ExportError, ref("out") + " {path}: inside the run {inside}; export to a folder of its own",
                           "out", path=out, inside=inside)
    manifest = out / MANIFEST
    if not manifest.is_file():
        return
    try:
        old = json.loads(manifest.read_text(encoding="utf-8"))
        names = [g["file"] for g in old.get("graphs", {}).values()] + list(old.get("assets", []))
    except (ValueError, TypeError, KeyError, AttributeError):
        raise option_error(ExportError, ref("out") + " {path}: holds a damaged {manifest}; remove it or export "
                           "elsewhere", "out", path=out, manifest=MANIFEST) from None
    manifest.unlink()
    for name in [*names, "config.json"]:
        path = out / Path(str(name)).name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def export_run(run: str | os.PathLike, out: str | os.PathLike, *, with_weights: bool = False) -> dict[str, Any]:
    """Export the run at ``run`` into the directory ``out`` (created; an earlier export there is replaced);
    returns the manifest written to ``out/export.json``. ``with_weights`` adds every attention module's weights
    as outputs named ``attention.<module path>``. Errors (a run without weights, an application or model that
    cannot be exported, an unwritable ``out``, ``out`` inside the run) are :class:`ExportError` with one line."""
    run, out = Path(run), Path(out)
    require_onnx()
    app, predictor, checkpoint = _load(run)
    if app.export is None:
        raise ExportError(f"{run}: {app.name} runs cannot be exported yet (exported: {', '.join(exported())})")
    check_exportable(predictor.model)
    _clear(out, run, checkpoint)
    _writable(out)
    graphs = app.export(predictor)
    manifest: dict[str, Any] = {"application": app.name, "run": str(run), "graphs": {}}
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
    shutil.copyfile(checkpoint / "config.json", out / "config.json")
    manifest["assets"] = list(predictor.task_class.assets)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    logger.info("exported %s run %s to %s", app.name, run, out)
    return manifest


def _grouped(model: nn.Module) -> bool:
    """Whether ``model`` has grouped-query attention: its decoder step over a key/value cache needs
    ``runtime_checks`` (a stride comparison PyTorch's symbolic shapes cannot prove, true for every length)."""
    from ..layers import MultiHeadAttention

    return any(m.kv_heads != m.num_heads for m in model.modules() if isinstance(m, MultiHeadAttention))
