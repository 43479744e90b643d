"""Reading lines of text files, plain or gzip-compressed, and the records of CSV/TSV tables, with errors that name
the file and the line.

Compression is told by the content (gzip's magic bytes), not by the name, so a plain file named ``.gz`` is read
as it is. A truncated or damaged gzip stream, undecodable UTF-8 or a missing file is a ``ValueError`` (or
``FileNotFoundError``) whose message starts with ``path`` or ``path:line``.

:func:`table_rows` is the one reader of every CSV/TSV file of qkv (speech manifests, summaries, text tables): Python's
``csv`` module in strict mode, with the line each record starts on. A stray quote never merges rows silently: a
quoted field that never closes, or with text after its closing quote, is an error at the line where the quote
opened; a quoted field running over several lines is an error too where the format has no line breaks in a field
(``multiline=False``), and said in a warning where it has.
"""

from __future__ import annotations

import csv
import gzip
import logging
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["binary_lines", "text_lines", "table_rows"]

log = logging.getLogger(__name__)

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


_QUOTING_HINT = 'a stray quote? A field holding a quote is written in quotes, the quote doubled: "say ""hi"""'


def _opened_at(lines: list[tuple[int, str]], delimiter: str) -> int:
    """The line on which the quoted field still open (or followed by text) at the end of ``lines`` opened: the
    states of ``csv``'s strict parser, followed only to find the line."""
    state, opened = "start", lines[0][0] if lines else 0
    for n, line in lines:
        for ch in line:
            if state == "quoted":
                state = "closed" if ch == '"' else state
            elif state == "closed":
                if ch == '"':
                    state = "quoted"  # a doubled quote inside the field
                elif ch == delimiter or ch in "\r\n":
                    state = "start"
                else:
                    return opened  # text after the closing quote
            elif ch == delimiter or ch in "\r\n":
                state = "start"
            elif state == "start" and ch != " ":  # spaces before a field's opening quote are skipped
                state, opened = ("quoted", n) if ch == '"' else ("plain", opened)
    return opened


def table_rows(path: str | os.PathLike, *, delimiter: str = ",", quoting: bool = True,
               multiline: bool = False) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of every record of a CSV or TSV file (plain or gzip-compressed, UTF-8), ``line`` the line
    the record starts on; blank lines are left out.

    With ``quoting`` (RFC 4180, as Python's ``csv``) a field may be written in double quotes (a quote inside
    doubled; spaces before the opening quote are skipped, ``a, "b, c"``); a quote inside an unquoted field is kept
    as it is. Without it (Common Voice's TSV) every character is kept. Strict: a quoted field that never closes,
    or has text after its closing quote, is a ``ValueError`` naming ``path:line`` of the line where its quote
    opened. A quoted field holding line breaks is such an error too unless ``multiline`` (then the first such
    record is named in a warning, and their count at the end). The callers hold every record to the number of
    fields of the header (or first row): a comma inside an unquoted field is a row too long, never a cut text.
    """
    lines: list[tuple[int, str]] = []  # the lines of the record being read

    def feed() -> Iterator[str]:
        for n, line in text_lines(path):
            lines.append((n, line))
            yield line

    reader = csv.reader(feed(), delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE,
                        skipinitialspace=quoting, strict=True)
    spanning = 0
    while True:
        lines.clear()
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            opened = _opened_at(lines, delimiter)
            if "expected after" in str(e):
                raise ValueError(f"{path}:{opened}: a quoted field opens on this line and has text after its "
                                 f"closing quote ({_QUOTING_HINT})") from None
            if "end of data" in str(e):
                raise ValueError(f"{path}:{opened}: a quote opens a field on this line and never closes "
                                 f"({_QUOTING_HINT})") from None
            if "new-line character" in str(e):
                raise ValueError(f"{path}:{lines[-1][0] if lines else opened}: a carriage return (\\r) alone inside "
                                 "a line; save the file with \\n or \\r\\n line ends") from None
            raise ValueError(f"{path}:{opened}: not a valid table ({e}; {_QUOTING_HINT})") from None
        if not lines:
            continue
        start, end = lines[0][0], lines[-1][0]
        if end > start:
            if not multiline:
                raise ValueError(f"{path}:{start}: a quote opens a field on this line and does not close on it (it "
                                 f"closes on line {end}, taking the lines between into the field; "
                                 f"{_QUOTING_HINT})")
            spanning += 1
            if spanning == 1:  # said at once: an error about this record may follow
                log.warning("%s:%d: a quoted field runs over lines %d-%d (a line break inside the field; a stray quote "
                            "if not meant)", path, start, start, end)
        if fields and any(f.strip() for f in fields):
            yield start, fields
    if spanning > 1:
        log.warning("%s: %d records hold line breaks inside quoted fields", path, spanning)
