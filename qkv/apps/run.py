"""Reading a run back, written once for every application: :func:`load_run` (the weights read once, any checkpoint
format version: the application's ``upgrade``), :func:`run_application` (the application a run is, from its
``config.json`` alone), :func:`model_from_spec` and :func:`upgrade_options`.

A run's ``config.json`` (format version 2) holds ``{"model": {"name", "config"}, "options": {...}, ...}``:
:func:`qkv.models.create` rebuilds the model from ``model`` alone, and ``options`` are the task's options as
trained.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..options import default_of, option_fields, why_not

logger = logging.getLogger(__name__)

__all__ = ["LoadedRun", "load_run", "run_application", "model_from_spec", "upgrade_options"]


def run_application(path: str | os.PathLike) -> str:
    """The application (the checkpoint's ``task``) of a run or checkpoint directory, read from its ``config.json``
    only (the weights are not opened); a damaged ``best/config.json`` falls back to ``checkpoint/``, as loading the
    run does. ``FileNotFoundError`` naming what was looked for; ``ValueError`` naming every damaged file."""
    from ..train.checkpoint import _candidates, resolve_checkpoint

    found = _candidates(Path(path), ("best", "checkpoint")) or [resolve_checkpoint(path)]
    damaged = []
    for folder in found:
        where = Path(folder) / "config.json"
        try:
            meta = json.loads(where.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            damaged.append(f"{where}: damaged, not JSON ({e})")
            continue
        if isinstance(meta, dict) and isinstance(meta.get("task"), str):
            return meta["task"]
        damaged.append(f"{where}: damaged, no task name")
    raise ValueError("; ".join(damaged))


@dataclasses.dataclass
class LoadedRun:
    """A run read back for prediction: the model (eval mode, on ``device``), the checkpoint, its configuration
    in the current format and the task's options."""

    model: nn.Module
    checkpoint: Any
    config: dict[str, Any]
    options: Any


def model_from_spec(spec: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor] | None = None,
                    where: str = "the checkpoint") -> nn.Module:
    """``qkv.models.create(spec["name"], **spec["config"])``, with ``state_dict`` loaded; a mismatch between the
    configuration and the weights is a ``ValueError`` that names the parameter."""
    from ..models import create

    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or \
            not isinstance(spec.get("config"), Mapping):
        raise ValueError(f"{where}: the model entry must be {{'name': ..., 'config': {{...}}}}, got {spec!r}")
    model = create(spec["name"], **spec["config"])
    if state_dict is not None:
        from ..train.fit import weight_differences

        misfit = weight_differences(state_dict, model)
        if misfit:
            raise ValueError(f"{where}: the weights do not fit a {spec['name']!r} model ({'; '.join(misfit)})")
        model.load_state_dict(state_dict)
    return model


def upgrade_options(cls: type, old: Mapping[str, Any], renames: Mapping[str, str] | None = None) -> Any:
    """Options of an older release as an instance of ``cls``: fields renamed (``renames``: old -> new), unknown
    ones dropped, and values of options that do not apply to the other settings reset to their defaults (old
    runs stored every option, applicable or not)."""
    renames = renames or {}
    names = {f.name for f in dataclasses.fields(cls)}
    values = {renames.get(k, k): v for k, v in old.items()}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names}
    specs = {f.name: (f, s) for f, s in option_fields(cls)}
    for name, (f, spec) in specs.items():
        if name in values and why_not(spec, name, lambda other: values.get(other, default_of(specs[other][0]))):
            values[name] = default_of(f)
    return cls(**values)


def load_run(path, task: str, options_cls: type, device: str | torch.device = "auto",
             upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> LoadedRun:
    """Read a run (or checkpoint) directory of ``task``, or a :class:`~qkv.train.checkpoint.Checkpoint` already
    read, for prediction: its weights read once, a run of checkpoint format 1 upgraded by ``upgrade`` (the
    application's: ``config -> config``). Raises ``ValueError`` for a run of another task, a newer format, or a
    configuration that does not fit.
    """
    from ..train import resolve_device
    from ..train.checkpoint import VERSION, Checkpoint, load_checkpoint
    from ..train.upgrade import upgrade_state_dict

    dev = resolve_device(str(device))
    ckpt = path if isinstance(path, Checkpoint) else load_checkpoint(path)
    where = str(ckpt.path / "config.json")
    if ckpt.task != task:
        raise ValueError(f"{ckpt.path} holds a {ckpt.task!r} model, not a {task!r} one")
    config, state_dict = ckpt.config, ckpt.state_dict
    if ckpt.version < VERSION:
        logger.info("%s: upgrading a format-version-%d run", ckpt.path, ckpt.version)
        if upgrade is None:
            raise ValueError(f"{ckpt.path}: {task} runs exist only in checkpoint format 2 and later")
        try:
            config = upgrade(config)
            state_dict = upgrade_state_dict(config["model"]["name"], state_dict)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a valid format-version-{ckpt.version} {task} configuration ({e})") from None
    if not isinstance(config, Mapping) or not isinstance(config.get("options"), Mapping):
        raise ValueError(f"{where}: the configuration has no 'options' mapping")
    try:  # an option that does not apply to this run's settings is reset to its default: its stored value may be
        # a default of an older release, which would now read as set
        options = upgrade_options(options_cls, config["options"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: options do not match this qkv's {options_cls.__name__} ({e})") from None
    model = model_from_spec(config.get("model"), state_dict, where)
    return LoadedRun(model.to(dev).eval(), ckpt, config, options)
