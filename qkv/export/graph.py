"""One module to one ONNX graph: :func:`torch.export.export` with dynamic axes, then the dynamo ONNX exporter.

The graphs are checked by ``onnx.checker`` and their outputs named, so that a server can read them by name. The
ONNX exporter needs the ``export`` extra (``pip install qkv[export]``: ``onnx``, ``onnxruntime``, ``onnxscript``).

Limits that apply (and are named in the errors and in ``docs/export.md``):

- the graphs are written at :data:`OPSET` (ONNX Runtime 1.17+ runs it);
- a score, normaliser or modifier that is a user's Python function is traced as whatever it computes on the example
  inputs; a run whose model holds one is refused by :func:`check_exportable` (its code is not in the run);
- sizes are dynamic only along the axes given as ``dynamic``; every other size is the example's;
- a recurrent layer over a sequence (``nn.LSTM``, ``nn.GRU``) is unrolled by ``torch.export`` at the example's
  length: such graphs are written by the TorchScript exporter (:func:`recurrent`, ONNX's ``LSTM``/``GRU``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["OPSET", "ExportError", "require_onnx", "export_program", "to_onnx", "check_onnx", "check_exportable"]

#: the ONNX opset of the graphs qkv writes
OPSET = 18


class ExportError(ValueError):
    """A model or run that cannot be exported, with the reason (one line)."""


def require_onnx():
    """``(onnx, onnxruntime)``, or an :class:`ExportError` naming the extra to install."""
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401 - the dynamo exporter's dependency
    except ImportError as e:
        raise ExportError(f"exporting to ONNX needs the export extra ({e.name} is missing): "
                          "pip install 'qkv[export]'") from None
    return onnx, onnxruntime


Axis = str | tuple[str, int | None, int | None]


def _dynamic_shapes(args: Sequence[torch.Tensor], dynamic: Sequence[dict[int, Axis]]):
    dims: dict[str, torch.export.Dim] = {}

    def dim(axis: Axis):
        name, low, high = (axis, None, None) if isinstance(axis, str) else axis
        if name not in dims:
            bounds = {"min": low or 1, **({} if high is None else {"max": high})}
            dims[name] = torch.export.Dim(name, **bounds)
        return dims[name]

    return tuple({axis: dim(name) for axis, name in axes.items()} if axes else None
                 for _, axes in zip(args, dynamic, strict=True))


def export_program(module: nn.Module, args: Sequence[torch.Tensor], dynamic: Sequence[dict[int, Axis]], *,
                   runtime_checks: bool = False):
    """``torch.export.export(module, args)`` with the axes named in ``dynamic`` dynamic: one ``{axis: name}`` per
    input, one name one size; ``(name, least, most)`` bounds it (None: unbounded), e.g. by a table of positions or
    by the smallest image a network of strided layers keeps more than one pixel of. An :class:`ExportError`
    with the exporter's first line otherwise.

    ``runtime_checks``: conditions on the sizes that PyTorch's symbolic shapes cannot prove while tracing become
    checks in the program (``prefer_deferred_runtime_asserts_over_guards``) instead of errors. Needed where they
    hold for every size but are not proven (a stride comparison in grouped-query attention over a key/value cache);
    the ONNX graph does not carry the checks, so test such a graph on the sizes it will see."""
    module = module.eval()
    shapes = _dynamic_shapes(args, dynamic)
    params = list(inspect.signature(module.forward).parameters.values())
    kinds = [p.kind for p in params]
    if inspect.Parameter.VAR_POSITIONAL in kinds:  # forward(a, b, *rest): one entry for all of rest
        n = kinds.index(inspect.Parameter.VAR_POSITIONAL)
        shapes = (*shapes[:n], tuple(shapes[n:]))
    try:  # inference graphs: no grad mode to switch inside (a no_grad block would become a subgraph)
        with torch.no_grad():
            return torch.export.export(module, tuple(args), dynamic_shapes=shapes,
                                       prefer_deferred_runtime_asserts_over_guards=runtime_checks)
    except Exception as e:  # noqa: BLE001 - any tracing failure: one line naming the module
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{type(module).__name__} cannot be exported by torch.export: {first}") from e


def recurrent(module: nn.Module) -> bool:
    """Whether ``module`` holds a recurrent layer (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``) that runs over a sequence:
    ``torch.export`` unrolls its loop at the example's length, so such a graph is written by the TorchScript
    exporter instead (ONNX's own ``LSTM``/``GRU`` operators, with each sequence's length)."""
    return any(isinstance(m, nn.RNNBase) for m in module.modules())


def _torchscript_onnx(module: nn.Module, args: Sequence[torch.Tensor], path: Path, input_names: Sequence[str],
                      output_names: Sequence[str], dynamic: Sequence[dict[int, Axis]]) -> None:
    """``torch.onnx.export(..., dynamo=False)``, qkv's layers traced as under ``torch.export`` (no branch on the
    values of tensors: ``torch.compiler.is_compiling()`` is true while it traces)."""
    import warnings
    from unittest import mock

    axes = {name: {axis: a if isinstance(a, str) else a[0] for axis, a in spec.items()}
            for name, spec in zip(input_names, dynamic, strict=True) if spec}
    with torch.no_grad(), warnings.catch_warnings(), mock.patch("torch.compiler.is_compiling", lambda: True):
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(args), str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(input_names), output_names=list(output_names), dynamic_axes=axes)


def to_onnx(module: nn.Module, args: Sequence[torch.Tensor], path: str | Path, *, input_names: Sequence[str],
            output_names: Sequence[str], dynamic: Sequence[dict[int, Axis]], runtime_checks: bool = False,
            torchscript: bool | str | None = None) -> Path:
    """Write ``module`` called on ``args`` to ``path`` as ONNX (dynamic axes as in :func:`export_program`), with
    its inputs and outputs named, and check it with ``onnx.checker``. ``torchscript`` (default: when the module
    is :func:`recurrent`): write it with the TorchScript exporter rather than through ``torch.export``;
    ``"fallback"``: through ``torch.export``, and with the TorchScript exporter where that fails (a recurrent
    layer called once, whose decomposition pins the batch size); the tests hold such graphs equal to PyTorch on
    other batch sizes."""
    onnx, _ = require_onnx()
    path = Path(path)
    if torchscript is None:
        torchscript = recurrent(module)
    try:
        if torchscript is True:
            _torchscript_onnx(module, args, path, input_names, output_names, dynamic)
        else:
            try:
                program = export_program(module, args, dynamic, runtime_checks=runtime_checks)
            except ExportError:
                if torchscript != "fallback":
                    raise
                logger.info("%s: torch.export failed; written by the TorchScript exporter", type(module).__name__)
                _torchscript_onnx(module, args, path, input_names, output_names, dynamic)
                return _checked(onnx, path, module)
            onnx_program = torch.onnx.export(program, tuple(args), dynamo=True, opset_version=OPSET,
                                             input_names=list(input_names), output_names=list(output_names),
                                             verbose=False, optimize=False)
            onnx_program.save(str(path), external_data=False)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{type(module).__name__} cannot be exported to ONNX opset {OPSET}: {first}") from e
    return _checked(onnx, path, module)


def _checked(onnx, path: Path, module: nn.Module) -> Path:
    try:
        check_onnx(path)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise ExportError(f"{path}: the exported graph of {type(module).__name__} fails onnx.checker: {first}") from e
    logger.info("wrote %s", path)
    return path


def check_onnx(path: str | Path) -> None:
    """``onnx.checker.check_model`` (full check, with shape inference) on the graph at ``path``."""
    onnx, _ = require_onnx()
    onnx.checker.check_model(str(path), full_check=True)


def check_exportable(model: nn.Module) -> None:
    """An :class:`ExportError` naming the module when ``model`` holds a user's Python score, normaliser or
    modifier: its code is not part of the run, and a graph would freeze whatever it computed on one input."""
    from ..mods import is_builtin
    from ..normalize import NORMALIZERS
    from ..scores import FunctionScore

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
