"""Checkpoints without pickle: tensors in safetensors, everything else in JSON, written atomically.

A checkpoint is a directory::

    model.safetensors   the model's state_dict (tied weights stored once, restored under every name)
    config.json         {"format": "qkv-checkpoint", "version": 2, "task": NAME, "config": {...}}
    assets/             the task's tokeniser/vocabulary files
    state.json          training state: position, train config, optimizer hyper-parameters, scaler  (full only)
    state.safetensors   training tensors: optimizer moments, RNG states of every rank               (full only)

A run directory holds ``checkpoint/`` (the latest full checkpoint, to resume from), ``best/`` (weights,
config and assets of the best evaluation, when the trainer watches a metric) and ``metrics.jsonl``.

Writing goes to a temporary sibling directory that replaces the old one only once complete: if the process
dies while saving, the previous checkpoint is still there (or, between the two renames of the swap, under
``.NAME.old``, which the loader falls back to). Loading reads safetensors and JSON only; no ``torch.load``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn

from ..options import option_error, ref
from .fit import weight_differences

__all__ = [
    "Checkpoint",
    "NewerCheckpointError",
    "load_checkpoint",
    "load_model",
    "resolve_checkpoint",
    "save_weights",
    "load_weights",
    "write_checkpoint",
    "optimizer_to_files",
    "optimizer_from_files",
    "atomic_directory",
    "remove_stale_temporaries",
]

log = logging.getLogger(__name__)

FORMAT = "qkv-checkpoint"
# 1: qkv 0.1.0.  2: the applications' configs are {"model": {"name", "config"}, "options": ...} (qkv.models.create
# rebuilds the model) and parameter names follow one vocabulary; the applications upgrade version-1 runs on load.
VERSION = 2


# --- weights -----------------------------------------------------------------------------------------------
def save_weights(path: str | Path, state_dict: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Save a state_dict to safetensors. A tensor listed twice (tied weights) is stored once and the other
    names are recorded as aliases; tensors are copied to the CPU first."""
    tensors, aliases, seen = {}, {}, {}
    for name, t in state_dict.items():
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = t.detach().to("cpu", copy=True).contiguous()
    meta = dict(metadata or {})
    meta["qkv.aliases"] = json.dumps(aliases)
    _write_bytes(Path(path), save(tensors, metadata=meta))


def _write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it: OS errors (a full disk) come out as ``OSError`` with their errno,
    not as safetensors' "Error while serializing: I/O error"."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()


def load_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """The state_dict saved by :func:`save_weights`, with aliased names restored (sharing one tensor)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(str(path), device=str(device))
    for name, target in json.loads(meta.get("qkv.aliases", "{}")).items():
        tensors[name] = tensors[target]
    return tensors


# --- optimizer ---------------------------------------------------------------------------------------------
def optimizer_to_files(state_dict: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split an optimizer state_dict into tensors (``optimizer.<param>.<name>``) and a JSON-able rest."""
    tensors, scalars = {}, {}
    for idx, per_param in state_dict["state"].items():
        for name, value in per_param.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.{idx}.{name}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_from_files(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`optimizer_to_files`: a state_dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        if key.startswith("optimizer."):
            idx, name = key[len("optimizer."):].split(".", 1)
            state.setdefault(int(idx), {})[name] = t
    for idx, values in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(values)
    groups = [{k: v if k == "params" or not isinstance(v, list) else tuple(v) for k, v in g.items()}
              for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# --- atomic writes -----------------------------------------------------------------------------------------
def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces ``path`` when the block succeeds.

    On an exception the temporary directory is removed and ``path`` is untouched. The swap is two renames
    (``path`` to ``.NAME.old``, then the new one to ``path``); :func:`resolve_checkpoint` falls back to
    ``.NAME.old`` if a crash falls between them. The temporary directory is ``.NAME.tmp-PID-XXXX``: what a dead
    process left is removed first, never what a live one is writing (:func:`remove_stale_temporaries`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    try:
        yield tmp
        _fsync_tree(tmp)
        old = _old(path)
        if path.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(_old(path), ignore_errors=True)


_TMP_PID = re.compile(r"\.tmp-(\d+)-")
LIVE_WRITER_GRACE = 6 * 3600.0  # a temporary of a live process is removed only after this many seconds (pid reuse)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (on Windows: assumed, signal 0 is not a probe there)."""
    if os.name == "nt":  # pragma: no cover
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def remove_stale_temporaries(path: str | Path, older_than: float = 0.0) -> list[Path]:
    """Remove the ``.NAME.tmp-*`` directories that a crash during an earlier save of ``path`` left behind
    (only those last modified more than ``older_than`` seconds ago). One whose name carries the pid of a live
    process (another save in progress) is kept unless it is older than :data:`LIVE_WRITER_GRACE`. Returns what
    was removed."""
    path = Path(path)
    removed = []
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        try:
            if not tmp.is_dir():
                continue
            age = now - tmp.stat().st_mtime
            m = _TMP_PID.search(tmp.name)
            if m and age < LIVE_WRITER_GRACE and _alive(int(m.group(1))):
                log.debug("keeping %s: process %s is alive (a save in progress)", tmp, m.group(1))
                continue
            if age >= older_than:
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
        except OSError:
            continue
    if removed:
        log.info("removed %d temporary director%s left by an interrupted save of %s", len(removed),
                 "y" if len(removed) == 1 else "ies", path)
    return removed


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def write_checkpoint(path: str | Path, *, weights: dict[str, Tensor], task: str, config: dict[str, Any],
                     save_assets: Callable[[Path], None] | None = None, state: dict[str, Any] | None = None,
                     state_tensors: dict[str, Tensor] | None = None, flag: str | None = None) -> Path:
    """Atomically write a checkpoint directory (layout in the module docstring); returns its path.

    ``weights`` is the model's state_dict, ``task``/``config`` name and configure the model, ``save_assets``
    writes tokeniser files into a directory; ``state``/``state_tensors`` (JSON and tensors) make it a full,
    resumable checkpoint. An ``OSError`` (a full disk, a read-only folder) names ``path`` and the option ``flag``
    that chose it (its field name), never a temporary file; the previous checkpoint is kept.
    """
    path = Path(path)
    try:
        with atomic_directory(path) as tmp:
            save_weights(tmp / "model.safetensors", weights)
            _write_json(tmp / "config.json", {"format": FORMAT, "version": VERSION, "task": task, "config": config})
            (tmp / "assets").mkdir()
            if save_assets is not None:
                save_assets(tmp / "assets")
            if state is not None:
                _write_bytes(tmp / "state.safetensors", save(state_tensors or {}))
                _write_json(tmp / "state.json", state)
    except OSError as e:
        err = option_error(OSError, "cannot write the checkpoint {path}" + (f" ({ref(flag)})" if flag else "") +
                           ": {why}{kept}", *([flag] if flag else []), path=path, why=e.strerror or e,
                           kept="; the previous one is kept" if _candidates(path, ()) else "")
        err.errno = e.errno
        raise err from None
    return path


# --- reading -----------------------------------------------------------------------------------------------
class NewerCheckpointError(ValueError):
    """A checkpoint written by a newer qkv (a format version this one cannot read): refused at once."""


@dataclass
class Checkpoint:
    """A checkpoint read back from disk.

    Attributes:
        path: the checkpoint directory.  task: the task's name.  config: the task's model configuration.
        state_dict: the model's weights (CPU tensors), for ``model.load_state_dict``.
        assets: the directory of the task's tokeniser/vocabulary files.
        state: training state (position, train config...) of a full checkpoint, else ``None``.
        version: the format version it was written in (older ones are upgraded by the applications' loaders).
    """

    path: Path
    task: str
    config: dict[str, Any]
    state_dict: dict[str, Tensor]
    assets: Path
    state: dict[str, Any] | None = None
    version: int = VERSION

    def state_tensors(self) -> dict[str, Tensor]:
        """Optimizer and RNG tensors of a full checkpoint (empty otherwise)."""
        f = self.path / "state.safetensors"
        return load_file(str(f)) if f.exists() else {}


def _candidates(path: Path, prefer: tuple[str, ...]) -> list[Path]:
    """The complete-looking checkpoint directories ``path`` may mean, in order (see :func:`resolve_checkpoint`)."""
    out = []
    for c in [path] + [path / name for name in prefer]:
        for d in (c, _old(c)):
            if (d / "model.safetensors").is_file() and (d / "config.json").is_file():
                out.append(d)
                break
    return out


def resolve_checkpoint(path: str | Path, prefer: tuple[str, ...] = ("best", "checkpoint")) -> Path:
    """The checkpoint directory meant by ``path``: itself if it holds ``model.safetensors``, else a run
    directory's ``best/`` or ``checkpoint/`` (in the order of ``prefer``), each falling back to a left-over
    ``.NAME.old`` from an interrupted swap. Raises ``FileNotFoundError`` naming what was looked for."""
    path = Path(path)
    found = _candidates(path, prefer)
    if found:
        return found[0]
    candidates = [path] + [path / name for name in prefer]
    raise FileNotFoundError(f"no checkpoint in {path} (looked for model.safetensors and config.json in "
                            f"{', '.join(str(c) for c in candidates)})")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: damaged, not JSON ({e})") from None


def _read(d: Path, device) -> Checkpoint:
    meta = _read_json(d / "config.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{d / 'config.json'} is not a qkv checkpoint (format={found!r})")
    version = meta.get("version", 0)
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{d / 'config.json'}: no valid format version ({version!r})")
    if version > VERSION:
        raise NewerCheckpointError(f"{d} was written by a newer qkv (checkpoint format version {version}; this qkv "
                                   f"reads up to {VERSION}): upgrade qkv to load it")
    if not isinstance(meta.get("task"), str) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{d / 'config.json'}: damaged, 'task' must be a name and 'config' a mapping")
    state_file = d / "state.json"
    state = _read_json(state_file) if state_file.exists() else None
    try:
        weights = load_weights(d / "model.safetensors", device)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{d / 'model.safetensors'}: damaged weights file ({type(e).__name__}: {e})") from None
    return Checkpoint(path=d, task=meta["task"], config=meta["config"], state_dict=weights, assets=d / "assets",
                      state=state, version=version)


def load_checkpoint(path: str | Path, *, prefer: tuple[str, ...] = ("best", "checkpoint"),
                    device: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint (a checkpoint directory, or a run directory: see :func:`resolve_checkpoint`).

    Never unpickles: weights come from safetensors, the rest from JSON. In a run directory, a damaged ``best/`` is
    reported (a warning naming the file) and ``checkpoint/`` is read instead; when none can be read, the
    ``ValueError`` names every damaged file. A checkpoint from a newer qkv is refused at once.
    """
    found = _candidates(Path(path), prefer)
    if not found:
        resolve_checkpoint(path, prefer)  # FileNotFoundError naming what was looked for
    for name in prefer:  # a save that crashed over an hour ago: no writer is still filling its directory
        with contextlib.suppress(OSError):
            remove_stale_temporaries(Path(path) / name, older_than=3600.0)
    damaged = []
    for d in found:
        try:
            return _read(d, device)
        except NewerCheckpointError:
            raise
        except ValueError as e:
            damaged.append(str(e))
            log.warning("%s; trying the next checkpoint", e)
    raise ValueError("; ".join(damaged))


def load_model(path: str | Path, build: Callable[[dict[str, Any]], nn.Module], *,
               device: str | torch.device = "cpu", task: str | None = None) -> tuple[nn.Module, Checkpoint]:
    """Rebuild a model for inference: ``build(config)`` then the checkpoint's weights, in eval mode.

    ``task``, if given, must match the checkpoint's task name (a clear error instead of a shape mismatch).
    """
    ckpt = load_checkpoint(path)
    if task is not None and ckpt.task != task:
        raise ValueError(f"{ckpt.path} holds a {ckpt.task!r} model, not a {task!r} one")
    model = build(ckpt.config)
    misfit = weight_differences(ckpt.state_dict, model)
    if misfit:
        raise ValueError(f"{ckpt.path}: the weights do not fit the model its config.json builds ({'; '.join(misfit)})")
    model.load_state_dict(ckpt.state_dict)
    return model.to(device).eval(), ckpt
