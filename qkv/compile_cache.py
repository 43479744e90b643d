"""Where qkv's compiled kernels are kept across processes (inductor's cache folder) and what compiling them cost
on this machine (``compile-times.json`` beside it), which the ``auto`` rule of :mod:`qkv.compiled` reads."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger("qkv.compiled")

__all__ = ["base", "cache_dir", "use_cache_dir", "clear_cache", "record_file", "read_record", "write_record"]


def base() -> Path:
    """qkv's cache folder: ``$QKV_CACHE_DIR``, else ``qkv`` under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    if os.environ.get("QKV_CACHE_DIR"):
        return Path(os.environ["QKV_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "qkv"


def cache_dir() -> Path:
    """Where inductor keeps the compiled kernels across processes: ``TORCHINDUCTOR_CACHE_DIR`` when set, else
    ``inductor`` under qkv's cache folder (set as ``TORCHINDUCTOR_CACHE_DIR`` before qkv's first compilation)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(env) if env else base() / "inductor"


def use_cache_dir() -> None:
    """Point inductor at qkv's cache folder, unless the user chose one (inductor itself writes its default, a
    temporary folder, into ``TORCHINDUCTOR_CACHE_DIR`` once it has run: that one is replaced)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        except ImportError:
            return
        if os.path.abspath(env) != os.path.abspath(default_cache_dir()):
            return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base() / "inductor")


def clear_cache() -> Path:
    """Delete the compiled kernels (inductor's cache folder and qkv's record of compile times); returns the
    folder. The next process compiles again."""
    path = cache_dir()
    shutil.rmtree(path, ignore_errors=True)
    (base() / "compile-times.json").unlink(missing_ok=True)
    return path


def record_file() -> Path:
    """Where the compile times this machine measured are kept, per kernel and device."""
    return base() / "compile-times.json"


def read_record() -> dict:
    """The compile times this machine measured (empty when none were recorded or the file cannot be read)."""
    try:
        return json.loads(record_file().read_text())
    except (OSError, ValueError):
        return {}


def write_record(key: str, seconds: float) -> None:
    """Record ``seconds`` for ``key``: its first compilation on this machine, then its latest (a cache load)."""
    record = read_record()
    entry = record.setdefault(key, {})
    entry["first" if "first" not in entry else "again"] = round(seconds, 2)
    try:
        record_file().parent.mkdir(parents=True, exist_ok=True)
        record_file().write_text(json.dumps(record, indent=1, sort_keys=True))
    except OSError as e:  # a read-only home: the next process estimates again
        logger.debug("qkv: could not record the compile time in %s: %s", record_file(), e)
