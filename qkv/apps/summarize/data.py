"""Summarisation data: (source, target) texts from JSON Lines / CSV / TSV files, CNN/DailyMail story files, the
Debian package descriptions, and the fact passages of :mod:`qkv.data.facts` as answers written out.

Readers give :class:`SummaryExample` s; :func:`split_summaries` (:mod:`qkv.apps.summarize.split`) cuts them into
train / valid / test so that no source -- and no family of near-identical sources -- is in two splits
(:func:`near_duplicate_groups`: the same text once whitespace and case are normalised, the same text once the
package's own name is removed, or word shingles shared by most of both texts, found by MinHash with
locality-sensitive hashing); :func:`cached_groups` keeps the grouping on disk (keyed by the content).

A row that cannot be used (bad JSON, a missing column, an empty text, a story without ``@highlight``) raises a
``ValueError`` naming ``file:line``, or with ``on_error="skip"`` is skipped and counted in
:attr:`SummaryCorpus.skipped`.

Example::

    corpus = debian_corpus("../shared/data/debian-descriptions.jsonl.gz")   # long description -> synopsis
    corpus.split("test")[0].source, corpus.split("test")[0].target
    corpus = read_summaries("news.csv", source="article", target="highlights")
    corpus = facts_corpus("zh", n_train=2000, n_eval=200)                    # question + passage -> answer
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...data.corpus import Splits
from ...data.files import table_rows, text_lines
from ...options import OptionError, ref
from .split import (
    SPLITS,
    SummaryExample,
    cached_groups,
    default_cache,
    near_duplicate_groups,
    normalize_text,
    split_summaries,
)

__all__ = ["SummaryExample", "SummaryCorpus", "read_summaries", "read_table_summaries", "read_stories",
           "debian_corpus", "facts_corpus", "split_summaries", "near_duplicate_groups", "cached_groups",
           "default_cache", "normalize_text", "FORMATS", "SPLITS"]

log = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "csv", "tsv", "stories")


@dataclass
class SummaryCorpus(Splits[SummaryExample]):
    """Examples by split name; the rows skipped when reading (``on_error="skip"``) by reason."""

    splits: dict[str, list[SummaryExample]]
    skip_reasons: dict[str, int] = field(default_factory=dict)
    origin: str = ""

    @property
    def skipped(self) -> int:
        return sum(self.skip_reasons.values())


class _Rows:
    """Collects examples, raising at a bad row or counting it."""

    def __init__(self, path, on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.path, self.on_error = str(path), on_error
        self.examples: list[SummaryExample] = []
        self.reasons: dict[str, int] = defaultdict(int)

    def bad(self, where: str, reason: str, detail: str) -> None:
        if self.on_error == "raise":
            raise OptionError("{where}: {detail} (" + ref("on_error") + " skip skips such rows and counts them)",
                              "on_error", where=where, detail=detail)
        self.reasons[reason] += 1

    def add(self, source, target, where: str, name: str = "") -> None:
        for what, value in (("source", source), ("target", target)):
            if not isinstance(value, str):
                return self.bad(where, f"{what} not text", f"the {what} is {type(value).__name__}, not text")
            if not value.strip():
                return self.bad(where, f"empty {what}", f"the {what} text is empty")
        self.examples.append(SummaryExample(source.strip(), target.strip(), where, name))

    def done(self) -> tuple[list[SummaryExample], dict[str, int]]:
        if self.reasons:
            log.warning("%s: skipped %d rows (%s)", self.path, sum(self.reasons.values()),
                        ", ".join(f"{n} {r}" for r, n in sorted(self.reasons.items())))
        if not self.examples:
            raise ValueError(f"{self.path}: no usable (source, target) rows")
        return self.examples, dict(self.reasons)


def _format_of(path: Path, fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "stories"
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    last = suffixes[-1] if suffixes else ""
    known = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".tab": "tsv",
             ".story": "stories"}
    if last not in known:
        raise OptionError("{path}: cannot tell the format from the name; give one of jsonl, csv, tsv, stories (" +
                          ref("format") + ")", "format", path=path)
    return known[last]


def read_table_summaries(path: str | os.PathLike, *, source: str = "text", target: str = "summary",
                         fmt: str = "jsonl", name: str | None = None,
                         on_error: str = "raise") -> tuple[list[SummaryExample], dict[str, int]]:
    """``(examples, skip_reasons)`` of a JSON Lines file (one object per line) or a CSV/TSV file with a header
    line, taking the columns ``source`` and ``target`` (and ``name``, when given, as each example's name)."""
    rows = _Rows(path, on_error)
    if fmt == "jsonl":
        for n, line in text_lines(path):
            where = f"{path}:{n}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                rows.bad(where, "bad JSON", f"not valid JSON ({e.msg} at column {e.colno})")
                continue
            if not isinstance(obj, dict):
                rows.bad(where, "not an object", f"a JSON {type(obj).__name__}, not an object with the columns")
                continue
            missing = [c for c in (source, target) if c not in obj]
            if missing:
                rows.bad(where, "missing column", f"no {missing[0]!r} field (the columns are {', '.join(obj)})")
                continue
            rows.add(obj[source], obj[target], where, str(obj.get(name, "")) if name else "")
        return rows.done()
    if fmt not in ("csv", "tsv"):
        raise ValueError(f"read_table_summaries reads jsonl, csv or tsv, not {fmt!r}")
    header: list[str] | None = None
    for n, record in table_rows(path, delimiter="," if fmt == "csv" else "\t", multiline=True):
        if header is None:
            header = [h.strip() for h in record]
            missing = [c for c in (source, target) if c not in header]
            if missing:
                raise OptionError("{where}: the header has no column {column!r} (it has {header}); the columns read "
                                  "are chosen by source= and target= (a summarization run's " + ref("source_column") +
                                  " and " + ref("target_column") + ")", "source_column", "target_column",
                                  where=f"{path}:{n}", column=missing[0], header=", ".join(header) or "nothing")
            col = {c: header.index(c) for c in (source, target, *([name] if name and name in header else []))}
            continue
        where = f"{path}:{n}"
        if len(record) != len(header):
            rows.bad(where, "wrong field count", f"{len(record)} fields, the header has {len(header)}")
            continue
        rows.add(record[col[source]], record[col[target]], where, record[col[name]] if name in col else "")
    if header is None:
        raise ValueError(f"{path}: empty file (a header line naming the columns is needed)")
    return rows.done()


def read_stories(path: str | os.PathLike, *, on_error: str = "raise") -> tuple[list[SummaryExample], dict[str, int]]:
    """``(examples, skip_reasons)`` of CNN/DailyMail story files (a directory of ``*.story`` files, or one file):
    the text before the first ``@highlight`` line is the source, the line after each ``@highlight`` a sentence of
    the target (joined with spaces)."""
    path = Path(path)
    files = sorted(path.glob("*.story")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no .story files in the directory")
    rows = _Rows(path, on_error)
    for f in files:
        body: list[str] = []
        highlights: list[list[str]] = []  # the lines of each highlight
        first_mark, empty_mark = 0, 0
        for n, line in text_lines(f):
            s = line.strip()
            if s == "@highlight":
                if highlights and not highlights[-1]:
                    empty_mark = empty_mark or n
                first_mark = first_mark or n
                highlights.append([])
            elif s and highlights:
                highlights[-1].append(s)
            elif s:
                body.append(s)
        if highlights and not highlights[-1]:
            empty_mark = empty_mark or first_mark
        if not first_mark:
            rows.bad(f"{f}:1", "no highlight", "a story without any @highlight line (no summary)")
        elif empty_mark:
            rows.bad(f"{f}:{empty_mark}", "empty highlight", "an @highlight line with no sentence after it")
        else:
            rows.add(" ".join(body), " ".join(" ".join(h) for h in highlights), f"{f}:{first_mark}", f.stem)
    return rows.done()


def read_summaries(path: str | os.PathLike, *, source: str = "text", target: str = "summary", fmt: str = "auto",
                   on_error: str = "raise", fractions: Sequence[float] = (0.9, 0.05, 0.05), seed: int = 0,
                   max_examples: int | None = None, cache: bool = True) -> SummaryCorpus:
    """A user's file (JSON Lines, CSV, TSV or CNN/DailyMail stories, ``fmt="auto"`` telling by the name) split
    into train / valid / test with no near-duplicate source in two splits (:func:`split_summaries`; the grouping
    kept by :func:`cached_groups` unless ``cache`` is false)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such data file or directory: {p}")
    kind = _format_of(p, fmt)
    if kind == "stories":
        examples, reasons = read_stories(p, on_error=on_error)
    else:
        examples, reasons = read_table_summaries(p, source=source, target=target, fmt=kind, on_error=on_error)
    return SummaryCorpus(split_summaries(examples, fractions, seed=seed, max_examples=max_examples,
                                         groups=cached_groups if cache else near_duplicate_groups), reasons, str(p))


def debian_corpus(path: str | os.PathLike, *, on_error: str = "raise", fractions: Sequence[float] = (0.9, 0.05, 0.05),
                  seed: int = 0, max_examples: int | None = None, cache: bool = True) -> SummaryCorpus:
    """The Debian package descriptions (JSON Lines of ``package``, ``summary``, ``text``): the long description
    (paragraphs joined by spaces) -> the one-line synopsis, split by families of near-identical descriptions
    (kept by :func:`cached_groups` unless ``cache`` is false)."""
    examples, reasons = read_table_summaries(path, source="text", target="summary", fmt="jsonl", name="package",
                                             on_error=on_error)
    for ex in examples:
        ex.source = " ".join(ex.source.split())
    return SummaryCorpus(split_summaries(examples, fractions, seed=seed, max_examples=max_examples,
                                         groups=cached_groups if cache else near_duplicate_groups), reasons,
                         str(path))


def facts_corpus(lang: str = "en", *, n_train: int = 20_000, n_eval: int = 1_000, seed: int = 0) -> SummaryCorpus:
    """The fact passages of :func:`qkv.data.facts.fact_corpus` as generation: source = question + passage, target =
    the answer written out. Valid and test ask about entities never seen in training (they must be copied);
    ``test_phrasings`` also uses held-out question phrasings."""
    from ...data.facts import fact_corpus

    qa = fact_corpus(lang, n_train=n_train, n_eval=n_eval, seed=seed)

    def convert(ex) -> SummaryExample:
        zh = any("\u4e00" <= ch <= "\u9fff" for ch in ex.question)
        return SummaryExample(f"{ex.question}{'' if zh else ' '}{ex.context}", ex.answers[0], f"facts:{ex.kind}")

    return SummaryCorpus({name: [convert(ex) for ex in exs] for name, exs in qa.splits.items()}, {},
                         f"facts-{lang}")
