"""Text classification data: the movie-review snippets, any CSV/TSV file, stratified splits and k-fold.

The movie-review snippets (Hutto & Gilbert, ICWSM 2014, "VADER"; sentences from Pang & Lee's Rotten Tomatoes
data) are ``id<TAB>sentiment<TAB>text`` with a mean human rating in [-4, 4]. :func:`read_movie_reviews` gives
binary labels by the sign of the rating (zeros dropped), or the rating itself for regression. :func:`read_table`
reads a user's own CSV/TSV file with a text column and a label column (any number of classes).

A row that cannot be used (empty text, unknown label, missing column) raises ``ValueError`` naming the file and
line, or, with ``on_error="skip"``, is skipped and counted in :attr:`TextDataset.skipped`.

Example::

    data = read_movie_reviews("movie-review-snippets.tsv.gz")        # labels 0 = negative, 1 = positive
    train, valid, test = stratified_split(data.labels, valid=0.1, test=0.1, seed=0)
    for train_idx, test_idx in kfold_splits(data.labels, k=10, seed=0): ...
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..options import OptionError, ref
from .files import table_rows, text_lines

__all__ = ["TextDataset", "read_movie_reviews", "read_table", "stratified_split", "kfold_splits", "strata",
           "collate_texts"]

log = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]


@dataclass
class TextDataset:
    """Texts with their labels.

    Attributes:
        texts: one string per example.
        labels: class indices into ``label_names`` (classification), or floats (regression).
        label_names: the name of each class, in index order (empty for regression).
        regression: True when ``labels`` are real numbers.
        skipped: rows skipped with ``on_error="skip"``; ``skip_reasons`` counts them by reason.
        source: the file read.
    """

    texts: list[str]
    labels: list
    label_names: list[str] = field(default_factory=list)
    regression: bool = False
    skipped: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    source: str = ""

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_classes(self) -> int:
        """Number of classes, or 1 (one output) for regression."""
        return 1 if self.regression else len(self.label_names)

    def subset(self, indices: Sequence[int]) -> TextDataset:
        return TextDataset([self.texts[i] for i in indices], [self.labels[i] for i in indices],
                           list(self.label_names), self.regression, source=self.source)


class _Rows:
    """Collects rows, raising or counting the bad ones."""

    def __init__(self, path, on_error: OnError):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.path, self.on_error = str(path), on_error
        self.texts, self.labels, self.reasons = [], [], defaultdict(int)

    def bad(self, line: int, reason: str, detail: str) -> None:
        if self.on_error == "raise":
            raise OptionError("{where}: {detail} (on_error='skip', or " + ref("on_error") + " skip, skips such rows "
                              "and counts them)", "on_error", where=f"{self.path}:{line}", detail=detail)
        self.reasons[reason] += 1

    def dataset(self, label_names, regression) -> TextDataset:
        skipped = sum(self.reasons.values())
        if skipped:
            log.warning("%s: skipped %d rows (%s)", self.path, skipped,
                        ", ".join(f"{n} {r}" for r, n in sorted(self.reasons.items())))
        if not self.texts:
            raise ValueError(f"{self.path}: no usable rows")
        return TextDataset(self.texts, self.labels, list(label_names), regression, skipped, dict(self.reasons),
                           self.path)


def read_movie_reviews(path: str | os.PathLike, *, regression: bool = False,
                       on_error: OnError = "raise") -> TextDataset:
    """Read ``id<TAB>sentiment<TAB>text`` (a header line is allowed; ``.gz`` is read directly).

    Classification (default): label 1 ``positive`` for a rating above 0, 0 ``negative`` below; ratings of
    exactly 0 are dropped (counted in ``skip_reasons["neutral"]``, never an error). ``regression=True`` keeps
    every row with its rating as the label.
    """
    rows = _Rows(path, on_error)
    for line_no, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if line_no == 1 and len(parts) >= 2 and parts[1].strip().lower() == "sentiment":
            continue  # header
        if len(parts) < 3:
            rows.bad(line_no, "missing column", f"expected id<TAB>sentiment<TAB>text, got {len(parts)} field(s)")
            continue
        try:
            rating = float(parts[1])
            if not math.isfinite(rating):
                raise ValueError
        except ValueError:
            rows.bad(line_no, "unknown label", f"the rating {parts[1]!r} is not a number")
            continue
        text = parts[2].strip()
        if not text:
            rows.bad(line_no, "empty text", "the text is empty")
            continue
        if regression:
            rows.texts.append(text)
            rows.labels.append(rating)
        elif rating == 0:
            rows.reasons["neutral"] += 1
        else:
            rows.texts.append(text)
            rows.labels.append(int(rating > 0))
    neutral = rows.reasons.pop("neutral", 0)
    data = rows.dataset([] if regression else ["negative", "positive"], regression)
    if neutral:
        data.skip_reasons["neutral"] = neutral
        data.skipped += neutral
    return data


def _column(header: list[str] | None, col: str | int, path) -> int:
    if isinstance(col, int) or (isinstance(col, str) and col.lstrip("-").isdigit() and
                                (header is None or col not in header)):
        return int(col)
    if header is None:
        raise ValueError(f"{path}: column {col!r} is a name but the file is read without a header; "
                         "give a 0-based column index")
    if col not in header:
        raise ValueError(f"{path}: no column {col!r} in the header ({', '.join(header)})")
    return header.index(col)


def read_table(path: str | os.PathLike, *, text_col: str | int = "text", label_col: str | int = "label",
               delimiter: str | None = None, header: bool = True, labels: Sequence[str] | None = None,
               regression: bool = False, on_error: OnError = "raise") -> TextDataset:
    """Read a CSV or TSV file (``.gz`` too) with a text column and a label column.

    Args:
        text_col, label_col: a column name from the header, or a 0-based index.
        delimiter: default ``\\t`` for ``.tsv``/``.tab`` files, else ``,``. Quoting is RFC 4180's, strict
            (:func:`qkv.data.files.table_rows`): a stray quote is an error naming the line it opens on.
        header: whether the first row names the columns.
        labels: the known class names, in index order; a row with another label is an error (or skipped).
            Default: every label in the file, sorted (numbers numerically).
        regression: labels are numbers, kept as floats.
        on_error: ``"raise"`` a ``ValueError`` naming the file and line, or ``"skip"`` and count the row.
    """
    path = Path(path)
    if delimiter is None:
        stem = path.name[:-3] if path.name.endswith(".gz") else path.name
        delimiter = "\t" if stem.endswith((".tsv", ".tab")) else ","
    rows = _Rows(path, on_error)
    raw_labels: list[tuple[int, str]] = []
    records = table_rows(path, delimiter=delimiter, multiline=True)
    names = None
    if header:
        try:
            names = [n.strip() for n in next(records)[1]]
        except StopIteration:
            raise ValueError(f"{path}: the file is empty") from None
    ti, li = _column(names, text_col, path), _column(names, label_col, path)
    width = len(names) if names is not None else None
    for line_no, row in records:
        width = width or len(row)  # without a header: the first row's
        if len(row) > width:  # a comma inside an unquoted text would cut it and make a label of its end
            rows.bad(line_no, "too many fields", f"{len(row)} fields, the {'header' if header else 'first row'} has "
                     f"{width}: a {'comma' if delimiter == ',' else 'delimiter'} inside an unquoted field? write "
                     "the field in quotes")
            continue
        if max(ti, li) >= len(row):
            rows.bad(line_no, "missing column", f"{len(row)} field(s), need column {max(ti, li)}")
            continue
        text, label = row[ti].strip(), row[li].strip()
        if not text:
            rows.bad(line_no, "empty text", "the text is empty")
            continue
        if regression:
            try:
                value = float(label)
                if not math.isfinite(value):
                    raise ValueError
            except ValueError:
                rows.bad(line_no, "unknown label", f"the label {label!r} is not a number")
                continue
            rows.texts.append(text)
            rows.labels.append(value)
            continue
        if not label or (labels is not None and label not in labels):
            known = f" (known: {', '.join(labels)})" if labels is not None else ""
            rows.bad(line_no, "unknown label", f"unknown label {label!r}{known}")
            continue
        rows.texts.append(text)
        raw_labels.append((line_no, label))
    if regression:
        return rows.dataset([], True)
    names_ = list(labels) if labels is not None else sorted({lab for _, lab in raw_labels}, key=_label_key)
    index = {n: i for i, n in enumerate(names_)}
    rows.labels = [index[lab] for _, lab in raw_labels]
    data = rows.dataset(names_, False)
    if len(data.label_names) < 2:
        raise ValueError(f"{path}: need at least two classes, found {data.label_names}")
    return data


def _label_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def strata(labels: Sequence, bins: int = 10) -> list[int]:
    """Stratum of each example: the class index, or for real-valued labels the quantile bin (``bins`` bins)."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        return list(labels)
    order = sorted(range(len(labels)), key=lambda i: labels[i])
    out = [0] * len(labels)
    for rank, i in enumerate(order):
        out[i] = rank * bins // max(len(labels), 1)
    return out


def _by_stratum(labels: Sequence, seed: int) -> list[list[int]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(strata(labels)):
        groups[s].append(i)
    rng = random.Random(f"qkv-text-split:{seed}")
    out = []
    for s in sorted(groups):
        members = groups[s]
        rng.shuffle(members)
        out.append(members)
    return out


def stratified_split(labels: Sequence, *, valid: float = 0.1, test: float = 0.1,
                     seed: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Indices ``(train, valid, test)``: each class (or rating quantile) divided in the given proportions.

    The split is a pure function of the labels and ``seed``. Each part is sorted.
    """
    if not (0 <= valid < 1 and 0 <= test < 1 and valid + test < 1):
        raise ValueError(f"valid ({valid}) and test ({test}) must be fractions in [0, 1) summing to less than 1")
    parts: tuple[list[int], list[int], list[int]] = ([], [], [])
    for members in _by_stratum(labels, seed):
        n = len(members)
        n_test, n_valid = round(n * test), round(n * valid)
        parts[2].extend(members[:n_test])
        parts[1].extend(members[n_test:n_test + n_valid])
        parts[0].extend(members[n_test + n_valid:])
    return sorted(parts[0]), sorted(parts[1]), sorted(parts[2])


def kfold_splits(labels: Sequence, k: int = 10, *, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``k`` stratified folds: a list of ``(train, test)`` index lists; every example is tested exactly once."""
    if not isinstance(k, int) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    if k > len(labels):
        raise ValueError(f"k={k} folds need at least {k} examples, got {len(labels)}")
    folds: list[list[int]] = [[] for _ in range(k)]
    offset = 0
    for members in _by_stratum(labels, seed):
        for j, i in enumerate(members):  # deal round-robin, continuing where the last class stopped
            folds[(offset + j) % k].append(i)
        offset += len(members)
    out = []
    for f in range(k):
        test = sorted(folds[f])
        held = set(test)
        out.append(([i for i in range(len(labels)) if i not in held], test))
    return out


def collate_texts(examples, *, regression: bool = False) -> dict[str, torch.Tensor]:
    """``[(ids, label), ...]`` -> ``{"ids" (B, T), "mask" (B, T) True at tokens, "labels" (B,)}``."""
    from .batching import pad_sequences

    ids, _, mask = pad_sequences([x for x, _ in examples], min_len=1)
    labels = torch.tensor([y for _, y in examples], dtype=torch.float32 if regression else torch.long)
    return {"ids": ids, "mask": mask, "labels": labels}
