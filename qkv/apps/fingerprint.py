"""The fingerprint of the data a run was trained and split on, kept in its ``config.json`` (``data``), and the
check that an evaluation scores that same data (:func:`data_note`): a file that changed since, or another file, is
said, with the split scored, never scored silently as the run's own held-out split.

A file is fingerprinted by its bytes (SHA-256), a folder by the names and sizes of the files under it; generated
data (``dates``, ``facts``, ``digits``...) has none: its options (seeds, sizes) already determine it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["data_fingerprint", "data_note"]


def _digest(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    p = Path(root) / name
                    h.update(f"{p.relative_to(path).as_posix()}\0{p.stat().st_size}\n".encode())
        else:
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _same_file(a: str, b: Any) -> bool:
    try:
        return isinstance(b, str) and os.path.samefile(a, b)
    except OSError:
        return False


def data_fingerprint(options: Any) -> dict[str, Any] | None:
    """``{"data", "sha256"}`` of the file or folder an application's options read (their ``data``), or ``None``
    for generated data (a name that is no path) and data that cannot be read."""
    data = getattr(options, "data", None)
    if not isinstance(data, str) or not data or not os.path.exists(data):
        return None
    digest = _digest(Path(data))
    return None if digest is None else {"data": data, "sha256": digest}


def data_note(config: Mapping[str, Any], options: Any, data: str | None, split: str) -> str | None:
    """What an evaluation of ``split`` of ``data`` (``None``: the run's own) must say about the data it scores,
    against the fingerprint the run kept (``config["data"]``; a run of an older release kept none), or ``None``."""
    own = getattr(options, "data", None)
    kept = config.get("data") if isinstance(config, Mapping) else None
    kept = kept if isinstance(kept, Mapping) else None
    if data and data != own and not _same_file(data, own):
        given = data_fingerprint(type("Given", (), {"data": data}))
        if kept is not None and given is not None and given["sha256"] == kept.get("sha256"):
            return None  # a copy of the very data it was trained on
        return (f"scoring {split!r} of {data}, not of the data this run was trained on ({own}): examples may be "
                "shared with its training")
    if kept is None or not own:
        return None
    now = data_fingerprint(options)
    if now is None or now["sha256"] == kept.get("sha256"):
        return None
    return (f"{own} changed since this run was trained on it (SHA-256 {str(kept.get('sha256'))[:12]} then, "
            f"{now['sha256'][:12]} now): its {split!r} split is drawn from the changed data and is not the one held "
            "out in training")
