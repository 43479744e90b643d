"""Reading lines of text files, plain or gzip-compressed, with errors that name the file and the line.

Compression is told by the content (gzip's magic bytes), not by the name, so a plain file named ``.gz`` is read
as it is. A truncated or damaged gzip stream, undecodable UTF-8 or a missing file is a ``ValueError`` (or
``FileNotFoundError``) whose message starts with ``path`` or ``path:line``.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["binary_lines", "text_lines"]

_GZIP_MAGIC = b"\x1f\x8b"


def binary_lines(path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw bytes with the newline)`` of a plain or gzip-compressed file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a data file")
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path}")
    n = 0
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw) if compressed else raw
        try:
            for n, line in enumerate(stream, 1):
                yield n, line
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise ValueError(f"{path}: damaged or truncated gzip data after line {n} ({e or type(e).__name__}); "
                             "download or copy the file again") from None


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """``(line number, text with the newline)``; undecodable UTF-8 is a ``ValueError`` naming ``path:line``."""
    for n, line in binary_lines(path):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8")\
                from None
        yield n, text.removeprefix("\ufeff") if n == 1 else text
