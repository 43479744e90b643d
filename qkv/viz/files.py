"""The files a picture or a page is written to: the path is settled before any work (so that what a command prints is
exactly the file it wrote), and written atomically (a failed write leaves no half file and names the user's path).

- :func:`picture_path`: ``plots/noext`` -> ``plots/noext.png``; a folder, a name that is only an extension
  (``plots/.png``) or an unknown format (``w.xyz``) is a ``ValueError`` naming the option;
- :func:`page_path`: the same for HTML pages (``.html``);
- :func:`save_figure`: a matplotlib figure through :func:`picture_path` and :func:`write_atomic`;
- :func:`write_atomic`: text or bytes to a temporary file beside ``path``, then renamed over it; an ``OSError``
  (read-only folder, full disk, a folder in the way) names ``path`` and the option, never the temporary file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["PICTURE_SUFFIXES", "PAGE_SUFFIXES", "picture_path", "page_path", "output_path", "write_atomic",
           "save_figure"]

#: formats every matplotlib backend writes
PICTURE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
PAGE_SUFFIXES = (".html", ".htm")


def output_path(path: str | os.PathLike, suffixes: tuple[str, ...], *, option: str = "path") -> Path:
    """``path`` as the file that will be written: ``suffixes[0]`` added when it has no extension; a folder, an
    empty name or another extension is a ``ValueError`` naming ``option``."""
    text = os.fspath(path)
    example = f"attention{suffixes[0]}"
    if not text.strip():
        raise ValueError(f"{option} is empty: give a file name such as {example}")
    p = Path(text)
    if text.endswith(("/", os.sep)) or p.is_dir():
        raise ValueError(f"{option} {text} is a folder: give a file name such as {p / example}")
    stem_only = p.name.startswith(".") and not Path(p.name[1:]).suffix
    if stem_only and f".{p.name[1:].lower()}" in suffixes:
        raise ValueError(f"{option} {text} has no file name before its extension: give one such as "
                         f"{p.with_name(example)}")
    if not p.suffix:
        return p.with_name(p.name + suffixes[0])
    if p.suffix.lower() not in suffixes:
        raise ValueError(f"{option} {text}: {p.suffix} is not a format qkv writes here; use "
                         f"{', '.join(suffixes[:-1])} or {suffixes[-1]}")
    return p


def picture_path(path: str | os.PathLike, *, option: str = "path") -> Path:
    """:func:`output_path` for a picture (PNG by default; SVG, PDF, JPEG)."""
    return output_path(path, PICTURE_SUFFIXES, option=option)


def page_path(path: str | os.PathLike, *, option: str = "path") -> Path:
    """:func:`output_path` for an HTML page."""
    return output_path(path, PAGE_SUFFIXES, option=option)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, option: str = "path") -> Path:
    """Write ``data`` (UTF-8 text or bytes) to ``path`` through a temporary file renamed over it; the folder is
    made. An ``OSError`` names ``path`` and ``option`` (the temporary file is removed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        err = OSError(f"cannot write {path} ({option}): {e.strerror or type(e).__name__}")
        err.errno = e.errno
        raise err from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def save_figure(fig, path: str | Path, *, close: bool = True, dpi: int = 120, option: str = "path") -> Path:
    """Save ``fig`` (tight layout) to ``path`` (``.png`` added when it has no extension; written atomically, its
    folder made); close it unless ``close=False``. Returns the file written."""
    import io

    import matplotlib.pyplot as plt

    path = picture_path(path, option=option)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=path.suffix[1:].lower(), dpi=dpi)
    finally:
        if close:
            plt.close(fig)
    return write_atomic(path, buf.getvalue(), option=option)
