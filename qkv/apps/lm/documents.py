"""Documents of unlabelled text, for language models: a text file (one document per line), JSON lines (a field of
each record) or a tab-separated file (a column), plain or gzip-compressed, split into train/valid/test.

Example::

    corpus = load_documents("../shared/data/debian-descriptions.jsonl.gz")        # the "text" field of each record
    corpus = load_documents("books.txt", seed=1)                                  # one document per line
    corpus.train[:2], len(corpus.valid), len(corpus.test)
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ...data.files import text_lines

__all__ = ["DocumentCorpus", "read_documents", "load_documents", "NAMED_CORPORA"]

#: corpora beside the project, by name: (file, column)
NAMED_CORPORA = {
    "tatoeba": ("../shared/data/tatoeba-eng-fra.tsv.gz", "0"),
    "debian": ("../shared/data/debian-descriptions.jsonl.gz", "text"),
}


@dataclass
class DocumentCorpus:
    """Documents split three ways; ``source`` names where they came from."""

    train: list[str]
    valid: list[str]
    test: list[str]
    source: str = ""

    def split(self, name: str) -> list[str]:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"no split {name!r}; one of train, valid, test")
        return getattr(self, name)


def _format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    last = suffixes[-1] if suffixes else ""
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}.get(last, "text")


def read_documents(path: str | os.PathLike, column: str | None = None) -> list[str]:
    """The non-empty documents of ``path``: each line of a text file; the field ``column`` (default ``text``) of
    each record of a ``.jsonl`` file; the column ``column`` (a 0-based index, default 0) of a ``.tsv`` file.

    A record that is not a JSON object, lacks the field or holds a non-string, a TSV line without the column, a
    binary file (NUL bytes) and a file without any text are ``ValueError``s naming ``path:line``."""
    path = Path(path)
    kind = _format(path)
    if kind == "text" and column is not None:
        raise ValueError(f"{path}: a column ({column!r}) is for .jsonl or .tsv files; a text file is one document "
                         "per line")
    if kind == "tsv":
        try:
            index = int(column or 0)
        except ValueError:
            raise ValueError(f"{path}: the column of a .tsv file is a 0-based number, got {column!r}") from None
        if index < 0:
            raise ValueError(f"{path}: the column of a .tsv file is a 0-based number, got {column!r}")
    field = column or "text"
    docs = []
    for n, line in text_lines(path):
        if "\x00" in line:
            raise ValueError(f"{path}:{n}: a NUL byte: this is a binary file, not text")
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if kind == "jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON record ({e.msg})") from None
            if not isinstance(record, dict) or field not in record:
                raise ValueError(f"{path}:{n}: the record has no field {field!r}")
            text = record[field]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{n}: the field {field!r} is not a string")
        elif kind == "tsv":
            cells = line.split("\t")
            if index >= len(cells):
                raise ValueError(f"{path}:{n}: no column {index} (the line has {len(cells)})")
            text = cells[index]
        else:
            text = line
        text = " ".join(text.split())
        if text:
            docs.append(text)
    if not docs:
        raise ValueError(f"{path}: no text in the file")
    return docs


def load_documents(data: str, column: str | None = None, *, seed: int = 0, eval_fraction: float = 0.05,
                   max_documents: int | None = None) -> DocumentCorpus:
    """``data`` (a file, or a name of :data:`NAMED_CORPORA`) read, duplicates removed (first kept), shuffled with
    ``seed`` and split: ``eval_fraction`` of the documents each to valid and test (at least one each), the rest
    to train. Fewer than 3 distinct documents is a ``ValueError``."""
    if data in NAMED_CORPORA:
        path, named_column = NAMED_CORPORA[data]
        if not Path(path).is_file():
            raise FileNotFoundError(f"the {data} corpus is not at {path} (run from the project's folder, beside "
                                    "../shared, or give a file)")
        column = named_column if column is None else column
    else:
        path = data
    if not 0 < eval_fraction < 0.5:
        raise ValueError(f"eval_fraction must be in (0, 0.5), got {eval_fraction}")
    docs = list(dict.fromkeys(read_documents(path, column)))
    if len(docs) < 3:
        raise ValueError(f"{path}: {len(docs)} distinct document(s); a corpus needs at least 3 (one per split)")
    random.Random(seed).shuffle(docs)
    if max_documents is not None:
        docs = docs[:max(3, max_documents)]
    k = max(1, round(len(docs) * eval_fraction))
    return DocumentCorpus(train=docs[2 * k:], valid=docs[:k], test=docs[k:2 * k], source=str(path))
