"""Parallel corpora: the Tatoeba/Anki tab-separated format, read into grouped train/valid/test splits.

A file holds one sentence pair per line, ``source<TAB>target[<TAB>attribution]``, optionally gzip-compressed
(``.gz``). Tatoeba repeats a source sentence with several translations, so splits are made over *groups of
pairs sharing a source sentence*: no source appears in two splits, and every translation of a test source is in
the test split (:meth:`ParallelCorpus.references` gathers them for multi-reference BLEU).

Example::

    corpus = load_parallel("tatoeba-eng-fra.tsv.gz", src_lang="fr", tgt_lang="en", max_length=20)
    corpus.train[0]              # ("Je suis là.", "I'm here.")
    corpus.references("test")    # [(source, [translation, ...]), ...]

Generated tasks (:mod:`qkv.data.dates`) return the same :class:`ParallelCorpus`, so a task treats a generated
corpus and a real one alike.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .files import binary_lines

logger = logging.getLogger(__name__)

Pair = tuple[str, str]
SPLITS = ("train", "valid", "test")

# ISO 639-1 -> ISO 639-3 (and the bibliographic 639-2 codes people still use) for the commonest corpus languages,
# so that ``src_lang="fr"`` finds the ``fra`` column of ``tatoeba-eng-fra.tsv``.
_LANG_ALIASES = {
    "ar": "ara", "cs": "ces", "cze": "ces", "da": "dan", "de": "deu", "ger": "deu", "el": "ell", "gre": "ell",
    "en": "eng", "es": "spa", "fa": "fas", "per": "fas", "fi": "fin", "fr": "fra", "fre": "fra", "he": "heb",
    "hi": "hin", "hu": "hun", "id": "ind", "it": "ita", "ja": "jpn", "ko": "kor", "nl": "nld", "dut": "nld",
    "no": "nor", "pl": "pol", "pt": "por", "ro": "ron", "rum": "ron", "ru": "rus", "sv": "swe", "th": "tha",
    "tr": "tur", "uk": "ukr", "vi": "vie", "zh": "cmn", "zho": "cmn", "chi": "cmn",
}

_PAIR_IN_NAME = re.compile(r"(?<![a-z])([a-z]{2,3})[-_]([a-z]{2,3})(?![a-z])")
_ANKI_NAME = re.compile(r"^([a-z]{3})\.(?:txt|tsv)(?:\.gz)?$")


def _lang_key(code: str) -> str:
    code = code.strip().lower().replace("_", "-").split("-")[0]
    return _LANG_ALIASES.get(code, code)


def infer_languages(path: str | os.PathLike) -> tuple[str, str] | None:
    """Languages of a file's two columns guessed from its name, or ``None``.

    ``tatoeba-eng-fra.tsv.gz`` -> ``("eng", "fra")``; an Anki download ``fra.txt`` (English first) ->
    ``("eng", "fra")``.
    """
    name = os.path.basename(os.fspath(path)).lower()
    m = _PAIR_IN_NAME.search(name)
    if m:
        return m.group(1), m.group(2)
    m = _ANKI_NAME.match(name)
    if m:
        return "eng", m.group(1)
    return None


@dataclass
class ParallelCorpus:
    """Sentence pairs split into train/valid/test, with what was read, skipped and filtered.

    ``train``/``valid``/``test`` are lists of ``(source, target)`` strings; pairs that share a source are in one
    split only, and are adjacent.
    """

    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]
    src_lang: str | None = None
    tgt_lang: str | None = None
    origin: str = ""
    n_lines: int = 0  # lines read (blank lines excluded)
    n_skipped: int = 0  # malformed lines skipped with on_error="skip"
    skipped_lines: list[int] = field(default_factory=list)  # their line numbers (the first 100)
    n_filtered: int = 0  # well-formed pairs dropped by the length filter
    n_capped: int = 0  # pairs left out by max_pairs

    def split(self, name: str) -> list[Pair]:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)

    def references(self, split: str = "test") -> list[tuple[str, list[str]]]:
        """Each distinct source of ``split`` with all of its translations, in order of first appearance."""
        grouped: dict[str, list[str]] = {}
        for src, tgt in self.split(split):
            grouped.setdefault(src, []).append(tgt)
        return list(grouped.items())

    def sizes(self) -> dict[str, int]:
        return {name: len(self.split(name)) for name in SPLITS}

    def __repr__(self) -> str:
        langs = f"{self.src_lang}->{self.tgt_lang}" if self.src_lang or self.tgt_lang else "?"
        return (
            f"ParallelCorpus({self.origin!r}, {langs}, train={len(self.train)}, valid={len(self.valid)}, "
            f"test={len(self.test)}, skipped={self.n_skipped}, filtered={self.n_filtered}, capped={self.n_capped})"
        )


def read_pairs(
    path: str | os.PathLike,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    skipped: list[int] | None = None,
) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, first_column, second_column)`` for each line of a Tatoeba/Anki file.

    Columns are stripped of surrounding white space; a third column (attribution) and beyond are ignored; blank
    lines are ignored. A malformed line (fewer than two fields, an empty side, invalid UTF-8) raises
    ``ValueError("path:line: ...")``, or with ``on_error="skip"`` is skipped and its line number appended to
    ``skipped``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    for lineno, raw in binary_lines(path):
        problem = None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line, problem = "", f"invalid UTF-8 ({e.reason} at byte {e.start})"
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        line = line.rstrip("\r\n")
        if problem is None:
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                problem = "no tab (expected 'source<TAB>target[<TAB>attribution]')"
            else:
                a, b = fields[0].strip(), fields[1].strip()
                if not a or not b:
                    problem = f"empty {'first' if not a else 'second'} column"
        if problem is not None:
            if on_error == "raise":
                raise ValueError(f"{os.fspath(path)}:{lineno}: malformed line: {problem}")
            if skipped is not None:
                skipped.append(lineno)
            continue
        yield lineno, a, b


def _length(text: str, unit: str) -> int:
    return len(text) if unit == "chars" else len(text.split())


def _resolve_direction(
    path: str | os.PathLike,
    columns: Sequence[str] | None,
    reverse: bool | None,
    src_lang: str | None,
    tgt_lang: str | None,
) -> tuple[bool, tuple[str, str] | None]:
    cols = tuple(columns) if columns is not None else infer_languages(path)
    if cols is not None and len(cols) != 2:
        raise ValueError(f"columns must name two languages, got {columns!r}")
    if src_lang is None and tgt_lang is None:
        return bool(reverse), cols
    if cols is None:
        raise ValueError(
            f"cannot tell the languages of {os.fspath(path)!r} from its name; pass columns=('eng', 'fra') "
            "or use reverse=True/False instead of src_lang/tgt_lang"
        )
    keys = (_lang_key(cols[0]), _lang_key(cols[1]))
    want_reverse = None
    for lang, pos_if_forward in ((src_lang, 0), (tgt_lang, 1)):
        if lang is None:
            continue
        k = _lang_key(lang)
        if k not in keys:
            raise ValueError(f"language {lang!r} is not one of the file's columns {cols}")
        r = keys.index(k) != pos_if_forward
        if want_reverse is not None and r != want_reverse:
            raise ValueError(f"src_lang={src_lang!r} and tgt_lang={tgt_lang!r} name the same column of {cols}")
        want_reverse = r
    if reverse is not None and bool(reverse) != want_reverse:
        raise ValueError(f"reverse={reverse} contradicts src_lang={src_lang!r}/tgt_lang={tgt_lang!r} for {cols}")
    return bool(want_reverse), cols


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1 (train, valid, test), "
                         f"got {tuple(fractions)}")
    return tuple(float(f) for f in fractions)  # type: ignore[return-value]


def split_grouped(
    pairs: Sequence[Pair],
    fractions: Sequence[float] = (0.9, 0.05, 0.05),
    *,
    seed: int = 0,
    max_pairs: int | None = None,
) -> tuple[list[Pair], list[Pair], list[Pair], int]:
    """Split pairs into train/valid/test with every source sentence in exactly one split.

    Groups of pairs sharing a source are shuffled with ``seed``; ``max_pairs`` keeps the first groups of that
    order (the last one trimmed) so that at most ``max_pairs`` pairs remain; the groups are then cut at the
    fractions of the pair count. Returns ``(train, valid, test, n_capped)``.
    """
    f_train, f_valid, _ = _check_fractions(fractions)
    groups: dict[str, list[str]] = {}
    for src, tgt in pairs:
        groups.setdefault(src, []).append(tgt)
    order = list(groups)  # insertion order: deterministic for a given input
    random.Random(seed).shuffle(order)

    n_total = len(pairs)
    n_capped = 0
    if max_pairs is not None:
        if max_pairs < 0:
            raise ValueError(f"max_pairs must be >= 0, got {max_pairs}")
        kept, count = [], 0
        for src in order:
            if count >= max_pairs:
                break
            tgts = groups[src][: max_pairs - count]
            groups[src] = tgts
            kept.append(src)
            count += len(tgts)
        order, n_capped, n_total = kept, n_total - count, count

    bounds = (f_train * n_total, (f_train + f_valid) * n_total)
    out: tuple[list[Pair], list[Pair], list[Pair]] = ([], [], [])
    seen = 0
    for src in order:
        # a group goes where its first pair falls; rounding keeps tiny corpora's splits non-empty when possible
        part = 0 if seen < bounds[0] - 0.5 else 1 if seen < bounds[1] - 0.5 else 2
        out[part].extend((src, t) for t in groups[src])
        seen += len(groups[src])
    return out[0], out[1], out[2], n_capped


def load_parallel(
    path: str | os.PathLike,
    *,
    reverse: bool | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    columns: Sequence[str] | None = None,
    min_length: int = 1,
    max_length: int | None = None,
    length_unit: Literal["words", "chars"] = "words",
    max_pairs: int | None = None,
    fractions: Sequence[float] = (0.9, 0.05, 0.05),
    seed: int = 0,
    on_error: Literal["raise", "skip"] = "raise",
) -> ParallelCorpus:
    """Read a Tatoeba/Anki file into a :class:`ParallelCorpus`.

    Args:
        path: ``source<TAB>target[<TAB>attribution]`` lines, UTF-8, optionally ``.gz``.
        reverse: swap the columns (second column becomes the source).
        src_lang, tgt_lang: choose the direction by language instead (``"fr"`` or ``"fra"``); needs the
            file's languages, from ``columns`` or from its name (``*-eng-fra.*``, Anki's ``fra.txt``).
        columns: the languages of the file's first and second columns.
        min_length, max_length: keep a pair only if both sides are within these lengths (inclusive).
        length_unit: ``"words"`` (white-space separated) or ``"chars"``.
        max_pairs: keep at most this many pairs, whole source groups chosen deterministically from ``seed``.
        fractions: train, valid, test shares of the pairs (cut at source-group boundaries).
        seed: decides the split (and the ``max_pairs`` sample); the same seed gives the same corpus.
        on_error: ``"raise"`` a ``ValueError`` naming file and line at a malformed line, or ``"skip"`` it and
            count it in ``n_skipped``.
    """
    if length_unit not in ("words", "chars"):
        raise ValueError(f"length_unit must be 'words' or 'chars', got {length_unit!r}")
    _check_fractions(fractions)
    swap, cols = _resolve_direction(path, columns, reverse, src_lang, tgt_lang)
    skipped: list[int] = []
    pairs: list[Pair] = []
    n_lines = n_filtered = 0
    for _, a, b in read_pairs(path, on_error=on_error, skipped=skipped):
        n_lines += 1
        src, tgt = (b, a) if swap else (a, b)
        if (
            _length(src, length_unit) < min_length
            or _length(tgt, length_unit) < min_length
            or (max_length is not None
                and (_length(src, length_unit) > max_length or _length(tgt, length_unit) > max_length))
        ):
            n_filtered += 1
            continue
        pairs.append((src, tgt))
    n_lines += len(skipped)
    if skipped:
        logger.warning("%s: skipped %d malformed line(s), first at line %d", os.fspath(path), len(skipped),
                       skipped[0])
    train, valid, test, n_capped = split_grouped(pairs, fractions, seed=seed, max_pairs=max_pairs)
    langs = (cols[1], cols[0]) if (cols and swap) else cols
    corpus = ParallelCorpus(
        train, valid, test,
        src_lang=langs[0] if langs else None,
        tgt_lang=langs[1] if langs else None,
        origin=os.fspath(path),
        n_lines=n_lines,
        n_skipped=len(skipped),
        skipped_lines=skipped[:100],
        n_filtered=n_filtered,
        n_capped=n_capped,
    )
    logger.info("%r", corpus)
    return corpus
