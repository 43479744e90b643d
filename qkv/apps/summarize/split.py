"""Splitting summarisation examples so that no source -- and no family of near-identical sources -- is in two splits
(:func:`split_summaries`): :func:`near_duplicate_groups` puts together the same text once whitespace and case are
normalised, the same text once the example's own name is removed, and texts sharing most of their word shingles
(MinHash with locality-sensitive hashing); :func:`cached_groups` keeps a corpus's grouping on disk, keyed by its
content.

Example::

    groups = cached_groups(examples)                        # the Debian corpus: ten seconds once, then a file read
    splits = split_summaries(examples, (0.9, 0.05, 0.05), groups=cached_groups)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import re
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class SummaryExample:
    """A text to summarise (``source``), its summary (``target``), where it was read (``file:line``) and a
    ``name`` (a package, a story file) that :func:`near_duplicate_groups` removes from the text when comparing."""

    source: str
    target: str
    where: str = ""
    name: str = ""


__all__ = ["SummaryExample", "split_summaries", "near_duplicate_groups", "cached_groups", "default_cache",
           "normalize_text", "SPLITS", "GROUPS_VERSION"]

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")

_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w+")


def normalize_text(text: str) -> str:
    """Lower case, whitespace runs as one space, stripped: what makes two texts "the same text"."""
    return _SPACE.sub(" ", text).strip().lower()


_WORD_CHAR = re.compile(r"\w")


def _remove_whole(text: str, part: str) -> str:
    """``re.sub(rf"(?<!\\w){re.escape(part)}(?!\\w)", " ", text)`` without compiling a pattern per part (the
    corpus has tens of thousands of names): each occurrence not inside a longer word becomes a space."""
    out, start, i, n = [], 0, 0, len(part)
    while (j := text.find(part, i)) >= 0:
        if (j == 0 or not _WORD_CHAR.match(text[j - 1])) and (j + n == len(text)
                                                              or not _WORD_CHAR.match(text[j + n])):
            out += (text[start:j], " ")
            start = i = j + n
        else:
            i = j + 1
    return "".join(out) + text[start:] if out else text


def _without_name(text: str, name: str) -> str:
    """``text`` (normalised) with the name and its parts (``python3-foo`` -> ``foo``) removed, longest first."""
    if not name:
        return text
    parts = {name.lower(), *(p for p in re.split(r"[-_.+]", name.lower()) if len(p) > 2)}
    for p in sorted(parts, key=lambda p: (-len(p), p)):
        text = _remove_whole(text, p)
    return _SPACE.sub(" ", text).strip()


def _minhash_keys(text: str, *, shingle: int = 4, bands: int = 10, rows: int = 3, seed: int = 0) -> list[str]:
    """LSH band keys of the MinHash signature of ``text``'s word ``shingle``-grams: two texts share a key with
    probability ``1 - (1 - J^rows)^bands`` for Jaccard similarity ``J`` (about 0.5 at J = 0.4, 0.98 at J = 0.8)."""
    words = _WORD.findall(text)
    if len(words) < 2 * shingle:  # too short to compare by shingles: the exact keys decide
        return []
    grams = {" ".join(words[i:i + shingle]) for i in range(len(words) - shingle + 1)}
    h = np.fromiter((zlib.crc32(g.encode("utf-8")) for g in grams), dtype=np.uint64, count=len(grams))
    a, b = _permutations(bands * rows, seed)
    sig = ((a[:, None] * h[None, :] + b[:, None]) % _PRIME).min(axis=1)
    return [f"m{i}:" + ",".join(str(int(x)) for x in sig[i * rows:(i + 1) * rows]) for i in range(bands)]


_PRIME = np.uint64((1 << 31) - 1)


@functools.lru_cache(maxsize=4)
def _permutations(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random hash functions ``(a * x + b) mod p`` (the same for every run with ``seed``)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, int(_PRIME), size=n, dtype=np.uint64)
    b = rng.integers(0, int(_PRIME), size=n, dtype=np.uint64)
    return a, b


def near_duplicate_groups(examples: Sequence[SummaryExample], *, shingles: bool = True) -> list[int]:
    """A group id per example: examples are in one group when their sources are the same normalised text, the
    same text without their names, or (``shingles``) near-duplicates by MinHash-LSH of word 4-grams, and
    transitively so (union-find)."""
    parent = list(range(len(examples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, ex in enumerate(examples):
        norm = normalize_text(ex.source)
        keys = ["t:" + norm, "n:" + _without_name(norm, ex.name)]
        if shingles:
            keys += _minhash_keys(norm)
        for k in keys:
            j = first.setdefault(k, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[a] = b
    return [find(i) for i in range(len(examples))]


#: changes whenever :func:`near_duplicate_groups` would group differently: old cache files are then not read
GROUPS_VERSION = "groups-v1"


def default_cache() -> Path:
    """``$QKV_CACHE/summaries``, else ``~/.cache/qkv/summaries``: where :func:`cached_groups` keeps its files."""
    root = os.environ.get("QKV_CACHE")
    return Path(root) / "summaries" if root else Path.home() / ".cache" / "qkv" / "summaries"


def _valid_groups(groups, n: int) -> bool:
    """Whether ``groups`` is what :func:`near_duplicate_groups` gives for ``n`` examples: ``n`` integers, each the
    index of a member of its group that is its own group's id (a union-find root)."""
    if not isinstance(groups, np.ndarray) or groups.shape != (n,) or groups.dtype.kind not in "iu":
        return False
    return n == 0 or (int(groups.min()) >= 0 and int(groups.max()) < n and bool((groups[groups] == groups).all()))


def cached_groups(examples: Sequence[SummaryExample], *, cache_dir: str | os.PathLike | None = None) -> list[int]:
    """:func:`near_duplicate_groups` of ``examples``, kept in ``cache_dir`` (:func:`default_cache`) under the
    SHA-256 of the examples' sources and names in order: the Debian corpus's grouping (about ten seconds) is done
    once per content. A cache file that cannot be read or does not fit is rebuilt (with a warning), never trusted;
    files are written to a temporary name and renamed (a concurrent reader sees a whole file or none); a cache
    directory that cannot be written only costs the time."""
    digest = hashlib.sha256(GROUPS_VERSION.encode())
    for ex in examples:
        digest.update(ex.source.encode("utf-8", "surrogatepass") + b"\x00" + ex.name.encode("utf-8", "surrogatepass")
                      + b"\x01")
    directory = Path(cache_dir) if cache_dir is not None else default_cache()
    path = directory / f"{GROUPS_VERSION}-{len(examples)}-{digest.hexdigest()[:40]}.npy"
    if path.exists():
        try:
            groups = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            groups = e
        if _valid_groups(groups, len(examples)):
            return groups.tolist()
        log.warning("%s: not a valid grouping cache (%s); grouping again", path,
                    groups if isinstance(groups, Exception) else "wrong size or ids")
    groups = near_duplicate_groups(examples)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".part", dir=directory)
        try:
            os.chmod(tmp, 0o644)
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.asarray(groups, dtype=np.int64), allow_pickle=False)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        log.warning("cannot keep the grouping in %s (%s): it will be computed again next time", directory, e)
    return groups


def split_summaries(examples: Sequence[SummaryExample], fractions: Sequence[float] = (0.9, 0.05, 0.05), *,
                    seed: int = 0, max_examples: int | None = None,
                    groups: Callable[[Sequence[SummaryExample]], list[int]] = near_duplicate_groups,
                    ) -> dict[str, list[SummaryExample]]:
    """``{"train", "valid", "test"}`` with every group of :func:`near_duplicate_groups` in one split: groups are
    shuffled with ``seed`` and cut at the fractions of the example count; a group larger than a hundredth of the
    corpus (and 20) goes to train (a family that big would fill much of a test split). ``max_examples`` keeps the
    first groups of the shuffled order."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {tuple(fractions)}")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be at least 1, got {max_examples}")
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(groups(examples)):
        members[g].append(i)
    order = list(members.values())
    random.Random(seed).shuffle(order)
    if max_examples is not None:
        kept, count = [], 0
        for m in order:
            if count >= max_examples:
                break
            kept.append(m)
            count += len(m)
        order = kept
    total = sum(len(m) for m in order)
    cap = max(20, total // 100)
    big = [m for m in order if len(m) > cap]
    rest = [m for m in order if len(m) <= cap]
    bounds = (fractions[0] * total, (fractions[0] + fractions[1]) * total)
    out: dict[str, list[SummaryExample]] = {s: [] for s in SPLITS}
    seen = sum(len(m) for m in big)
    for m in big:
        out["train"].extend(examples[i] for i in m)
    for m in rest:
        part = "train" if seen < bounds[0] - 0.5 else "valid" if seen < bounds[1] - 0.5 else "test"
        out[part].extend(examples[i] for i in m)
        seen += len(m)
    return out

