"""Multilingual date normalisation: human-written dates -> ISO 8601, generated offline from babel's CLDR data.

``"lundi 30 décembre 2019"``, ``"2019年12月30日星期一"``, ``"30.12.2019"``, ``"DEC 30, 2019"`` -> ``"2019-12-30"``.
The task of the attention tutorials' translation examples, small enough to train on a laptop CPU in minutes, with
an alignment (day <-> day, month name <-> month digits) that is easy to read in a heat map.

How a source string is made, for a calendar date drawn from its split:

* a locale (default: 14 of them, :data:`DEFAULT_LOCALES`);
* a pattern: the locale's CLDR ``full``/``long``/``medium``/``short`` date formats, month-name patterns such as
  ``d MMM y`` or ``EEEE, d. MMMM y``, and numeric patterns in the locale's own day/month/year order with ``/``,
  ``.``, ``-`` or space as separator, zero-padded or not (the order stays the locale's, so ``03/07/2019`` is never
  ambiguous within one locale);
* a letter case (as written, lower, upper, capitalised), and ordinary spaces in place of no-break spaces at times.

Two pitfalls are handled: two-digit years (CLDR ``short`` formats such as ``M/d/yy``) are widened to four digits,
so that the century is recoverable; and Babel's ``Y`` is the *week-based* year (``2019-12-30`` is in week 1 of
2020), so patterns only use ``y`` and a pattern containing ``Y`` is rejected.

Splits are made over calendar dates, not strings: every date of the range belongs to exactly one of
train/valid/test (a function of the date and ``split_seed`` only), so no test date is ever seen in training, in
any format, whatever the sampling ``seed``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import random
from collections.abc import Sequence
from typing import NamedTuple

from .pairs import SPLITS, ParallelCorpus

DEFAULT_LOCALES: tuple[str, ...] = (
    "en", "fr", "de", "es", "it", "pt", "nl", "pl", "ru", "tr", "ar", "zh", "ja", "ko",
)
DEFAULT_START = _dt.date(1900, 1, 1)
DEFAULT_END = _dt.date(2099, 12, 31)
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)

# Month-name patterns for scripts with spaces; CJK locales get their own, CLDR's own formats are always added.
_NAMED_PATTERNS = (
    "d MMMM y", "d MMM y", "dd MMMM y", "EEEE d MMMM y", "EEEE, d MMMM y", "EEE d MMM y", "EEE, d MMM y",
    "EEEE, d. MMMM y", "d. MMMM y", "MMMM d, y", "MMM d, y", "EEEE, MMMM d, y", "MMM d y", "d-MMM-y",
)
_CJK_PATTERNS = {
    "zh": ("y年M月d日", "y年MM月dd日", "y年M月d日 EEEE", "y年M月d日(EEEE)", "y年M月d日，EEEE", "EEEE y年M月d日",
           "y年M月d号", "y-M-d"),
    "ja": ("y年M月d日", "y年MM月dd日", "y年M月d日(E)", "y年M月d日（EEEE）", "y年M月d日 EEEE", "y.M.d"),
    "ko": ("y년 M월 d일", "y년 MM월 dd일", "y년 M월 d일 EEEE", "y년 M월 d일 (E)", "y. M. d.", "y.M.d"),
}
_SEPARATORS = ("/", ".", "-", " ")
_ALLOWED_FIELDS = frozenset("yMLdE")
_CASES = ("as is", "lower", "upper", "capitalised")
_CASE_WEIGHTS = (0.6, 0.15, 0.15, 0.1)


class DateExample(NamedTuple):
    """One generated pair with how it was made (so a test can render it again)."""

    source: str
    target: str
    locale: str
    pattern: str
    case: str


def check_pattern(pattern: str) -> str:
    """Return ``pattern`` with two-digit years widened to ``y``; reject week-years and non-date fields.

    >>> check_pattern("M/d/yy")
    'M/d/y'
    """
    from babel.dates import tokenize_pattern, untokenize_pattern

    tokens, changed = [], False
    for kind, value in tokenize_pattern(pattern):
        if kind == "field":
            char, count = value
            if char == "Y":
                raise ValueError(f"pattern {pattern!r} uses 'Y', the week-based year (2019-12-30 would read 2020); "
                                 "use 'y'")
            if char not in _ALLOWED_FIELDS:
                raise ValueError(f"pattern {pattern!r} has field {char * count!r}; only {sorted(_ALLOWED_FIELDS)}")
            if char == "y" and count == 2:
                value, changed = ("y", 1), True
        tokens.append((kind, value))
    return untokenize_pattern(tokens) if changed else pattern


def _is_numeric(pattern: str) -> bool:
    """True if the pattern writes the month as a number and has no weekday."""
    from babel.dates import tokenize_pattern

    fields = [v for k, v in tokenize_pattern(pattern) if k == "field"]
    return all(c != "E" and not (c in "ML" and n >= 3) for c, n in fields)


def _numeric_order(short_pattern: str) -> str:
    """The order of day, month and year fields of a pattern, e.g. ``"M/d/y"`` -> ``"Mdy"``."""
    from babel.dates import tokenize_pattern

    order = ""
    for kind, value in tokenize_pattern(short_pattern):
        if kind == "field" and value[0] in "dMy" and value[0] not in order:
            order += value[0]
    return order if sorted(order) == sorted("dMy") else "dMy"


@functools.cache
def locale_patterns(locale: str) -> tuple[str, ...]:
    """All date patterns used for ``locale``: CLDR's four formats, named-month and numeric variants."""
    from babel.dates import get_date_format

    loc = _locale(locale)
    patterns: list[str] = []
    for width in ("full", "long", "medium", "short"):
        try:
            patterns.append(check_pattern(get_date_format(width, locale=loc).pattern))
        except ValueError:
            continue  # a CLDR format with an era or other field: skip it
    lang = loc.language
    patterns += _CJK_PATTERNS.get(lang, _NAMED_PATTERNS)
    order = _numeric_order(get_date_format("short", locale=loc).pattern)
    widths = {"d": ("d", "dd"), "M": ("M", "MM"), "y": ("y",)}
    for sep in _SEPARATORS:
        for dw in widths["d"]:
            for mw in widths["M"]:
                chosen = {"d": dw, "M": mw, "y": "y"}
                patterns.append(sep.join(chosen[c] for c in order))
    unique = tuple(dict.fromkeys(check_pattern(p) for p in patterns))
    return unique


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str):
    from babel.dates import parse_pattern

    return parse_pattern(pattern)


@functools.cache
def _locale(locale: str):
    from babel import Locale  # babel (the "train" extra) is needed only when dates are generated

    return Locale.parse(locale)


def render(date: _dt.date, locale: str, pattern: str, case: str = "as is") -> str:
    """Write ``date`` in ``locale`` with a (checked) CLDR ``pattern`` and a letter ``case``."""
    text = _compiled(pattern).apply(date, _locale(locale))
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    if case == "capitalised":
        return text[:1].upper() + text[1:]
    if case != "as is":
        raise ValueError(f"case must be one of {_CASES}, got {case!r}")
    return text


@functools.lru_cache(maxsize=16)
def _split_ordinals(start: int, end: int, split_seed: int, fractions: tuple[float, float, float]):
    ordinals = list(range(start, end + 1))
    random.Random(split_seed).shuffle(ordinals)
    n = len(ordinals)
    a = round(fractions[0] * n)
    b = a + round(fractions[1] * n)
    return {"train": tuple(ordinals[:a]), "valid": tuple(ordinals[a:b]), "test": tuple(ordinals[b:])}


def split_dates(
    split: str,
    *,
    start: _dt.date = DEFAULT_START,
    end: _dt.date = DEFAULT_END,
    split_seed: int = 0,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> list[_dt.date]:
    """The calendar dates of ``split``: the range ``start..end`` shuffled by ``split_seed`` and cut at
    ``fractions`` (train, valid, test). The three splits partition the range."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(f < 0 for f in fr) or abs(sum(fr) - 1) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions!r}")
    ordinals = _split_ordinals(start.toordinal(), end.toordinal(), split_seed, fr)[split]
    return [_dt.date.fromordinal(o) for o in ordinals]


def make_date_examples(
    n: int,
    split: str = "train",
    *,
    seed: int = 0,
    locales: Sequence[str] | None = None,
    patterns: dict[str, Sequence[str]] | None = None,
    start: _dt.date = DEFAULT_START,
    end: _dt.date = DEFAULT_END,
    split_seed: int = 0,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> list[DateExample]:
    """``n`` examples of ``split`` with their locale, pattern and case (see :func:`make_dates`)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    locales = tuple(locales) if locales is not None else DEFAULT_LOCALES
    if not locales:
        raise ValueError("locales is empty")
    table = {}
    for loc in locales:
        pats = patterns.get(loc) if patterns is not None and loc in patterns else locale_patterns(loc)
        table[loc] = tuple(check_pattern(p) for p in pats)
        if not table[loc]:
            raise ValueError(f"no patterns for locale {loc!r}")
        _locale(loc)  # fail early on an unknown locale
    # Day-first and month-first numeric dates in one set would make "03/07/2019" ambiguous: when both orders
    # are present, month-first locales (en) write a date whose day could be a month with a month name instead.
    numeric = {(loc, p): _numeric_order(p) for loc in locales for p in table[loc] if _is_numeric(p)}
    orders = set(numeric.values())
    month_first_ambiguous = "dMy" in orders and "Mdy" in orders
    worded = {loc: tuple(p for p in table[loc] if (loc, p) not in numeric) for loc in locales}
    dates = split_dates(split, start=start, end=end, split_seed=split_seed, fractions=fractions)
    if not dates:
        raise ValueError(f"split {split!r} of {start}..{end} has no dates")
    rng = random.Random(f"qkv-dates:{seed}:{split}")
    chosen_dates = rng.choices(dates, k=n)
    chosen_locales = rng.choices(locales, k=n)
    cases = rng.choices(_CASES, weights=_CASE_WEIGHTS, k=n)
    plain_space = rng.choices((False, True), k=n)
    out = []
    for date, loc, case, plain in zip(chosen_dates, chosen_locales, cases, plain_space, strict=True):
        pattern = rng.choice(table[loc])
        if (month_first_ambiguous and numeric.get((loc, pattern)) == "Mdy" and date.day <= 12
                and date.day != date.month and worded[loc]):
            pattern = rng.choice(worded[loc])
        text = render(date, loc, pattern, case)
        if plain:
            text = text.replace("\u202f", " ").replace("\u00a0", " ")
        out.append(DateExample(text, date.isoformat(), loc, pattern, case))
    return out


def make_dates(
    n: int,
    split: str = "train",
    *,
    seed: int = 0,
    locales: Sequence[str] | None = None,
    **kwargs,
) -> list[tuple[str, str]]:
    """``n`` pairs ``(human-written date, ISO 8601 date)`` whose dates all belong to ``split``.

    Deterministic from ``(seed, split)``; the split of calendar dates depends only on ``split_seed``,
    ``start``, ``end`` and ``fractions`` (keyword arguments, see :func:`split_dates`), so train, valid and test
    never share a date. ``locales`` defaults to :data:`DEFAULT_LOCALES`; ``patterns`` maps a locale to its own
    list of CLDR patterns.

    >>> make_dates(2, seed=1, locales=["fr"])  # doctest: +SKIP
    [('mer. 14 févr. 1973', '1973-02-14'), ('7-6-2032', '2032-06-07')]
    """
    return [(e.source, e.target) for e in make_date_examples(n, split, seed=seed, locales=locales, **kwargs)]


def date_corpus(
    n_train: int = 50_000,
    n_valid: int = 1_000,
    n_test: int = 1_000,
    *,
    seed: int = 0,
    locales: Sequence[str] | None = None,
    **kwargs,
) -> ParallelCorpus:
    """The date task as a :class:`~qkv.data.pairs.ParallelCorpus` (same object as a real corpus)."""
    parts = {
        name: make_dates(n, name, seed=seed, locales=locales, **kwargs)
        for name, n in zip(SPLITS, (n_train, n_valid, n_test), strict=True)
    }
    return ParallelCorpus(parts["train"], parts["valid"], parts["test"], src_lang="date", tgt_lang="iso",
                          origin="dates", n_lines=n_train + n_valid + n_test)
