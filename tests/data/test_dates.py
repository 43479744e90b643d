"""Date normalisation data: targets, disjoint splits, determinism, the week-year pitfall, locales."""

import datetime as dt
import re

import pytest
from babel.dates import format_date

from qkv.data import date_corpus, make_date_examples, make_dates, split_dates
from qkv.data.dates import DEFAULT_LOCALES, _is_numeric, _numeric_order, check_pattern, locale_patterns, render

REQUIRED = ("zh", "ja", "fr", "es", "de", "ru", "en")


@pytest.fixture(scope="module")
def train_examples():
    return make_date_examples(5000, "train", seed=3)


def _reference(e):
    """Render again with babel's public format_date (not the cached path) and the recorded case."""
    text = format_date(dt.date.fromisoformat(e.target), e.pattern, locale=e.locale)
    text = {"lower": text.lower(), "upper": text.upper(), "capitalised": text[:1].upper() + text[1:]}.get(e.case, text)
    return text


def test_target_is_iso_and_source_renders_that_date(train_examples):
    for e in train_examples:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", e.target)
        d = dt.date.fromisoformat(e.target)
        assert d.isoformat() == e.target
        ref = _reference(e)
        assert e.source in (ref, ref.replace("\u202f", " ").replace("\u00a0", " "))
        if re.fullmatch(r"[\d\s./\-\u200f]+", e.source):  # numeric: the digits are the date's
            assert str(d.year) in e.source and str(d.day) in e.source


def test_splits_are_disjoint_and_cover_the_range():
    parts = {s: set(split_dates(s)) for s in ("train", "valid", "test")}
    assert not parts["train"] & parts["valid"]
    assert not parts["train"] & parts["test"]
    assert not parts["valid"] & parts["test"]
    n = (dt.date(2099, 12, 31) - dt.date(1900, 1, 1)).days + 1
    assert sum(len(p) for p in parts.values()) == n
    assert abs(len(parts["test"]) / n - 0.1) < 0.001


def test_generated_splits_never_share_a_date_whatever_the_seed():
    seen = {s: {t for _, t in make_dates(3000, s, seed=i)} for i, s in enumerate(("train", "valid", "test"))}
    assert not seen["train"] & seen["test"]
    assert not seen["train"] & seen["valid"]
    assert not seen["valid"] & seen["test"]
    allowed = {d.isoformat() for d in split_dates("test")}
    assert seen["test"] <= allowed


def test_deterministic_from_seed():
    assert make_dates(500, seed=7) == make_dates(500, seed=7)
    assert make_dates(500, seed=7) != make_dates(500, seed=8)
    assert make_dates(50, "valid", seed=7) != make_dates(50, "test", seed=7)
    assert split_dates("test", split_seed=1) != split_dates("test", split_seed=0)


@pytest.mark.parametrize("locale", DEFAULT_LOCALES)
def test_week_year_pitfall(locale):
    # 2019-12-30 is in ISO week 1 of 2020: a 'YYYY' pattern would print 2020.
    for d in (dt.date(2019, 12, 30), dt.date(2021, 1, 1), dt.date(2020, 12, 31)):
        for p in locale_patterns(locale):
            assert "Y" not in re.sub(r"'[^']*'", "", p)
            text = render(d, locale, p)
            assert str(d.year) in text, (locale, p, text)
            assert str(d.year + (1 if d.month == 12 else -1)) not in text, (locale, p, text)


def test_check_pattern_rejects_week_year_and_widens_two_digit_years():
    with pytest.raises(ValueError, match="week"):
        check_pattern("d MMM YYYY")
    with pytest.raises(ValueError, match="week"):
        make_dates(1, locales=["en"], patterns={"en": ["dd.MM.YYYY"]})
    assert check_pattern("M/d/yy") == "M/d/y"
    assert check_pattern("d 'yy' MMM y") == "d 'yy' MMM y"  # quoted text is not a field
    with pytest.raises(ValueError):
        check_pattern("h:mm d.M.y")


def test_every_required_locale_appears_with_its_script(train_examples):
    locales = {e.locale for e in train_examples}
    assert set(REQUIRED) <= locales and len(locales) >= 10
    by = {loc: " ".join(e.source for e in train_examples if e.locale == loc) for loc in locales}
    assert "年" in by["zh"] and "年" in by["ja"] and "년" in by["ko"]
    assert re.search("[а-я]", by["ru"]) and re.search("[\u0600-\u06ff]", by["ar"])


def test_many_formats_and_cases(train_examples):
    patterns = {e.pattern for e in train_examples}
    assert len(patterns) >= 40
    assert {"as is", "lower", "upper", "capitalised"} <= {e.case for e in train_examples}
    srcs = {e.source for e in train_examples}
    assert any(s.isupper() for s in srcs) and any("/" in s for s in srcs) and any("." in s for s in srcs)


def test_no_numeric_date_is_ambiguous_between_locales(train_examples):
    # month-first (en) numeric strings only where the day cannot be read as a month
    for e in train_examples:
        if _is_numeric(e.pattern) and _numeric_order(e.pattern) == "Mdy":
            d = dt.date.fromisoformat(e.target)
            assert d.day > 12 or d.day == d.month, e


def test_options_and_errors():
    pairs = make_dates(20, locales=["fr"], patterns={"fr": ["d MMMM y"]})
    assert all(re.fullmatch(r"\d{1,2} \w+ \d{4}", s) for s, _ in pairs)
    short = make_dates(100, start=dt.date(2000, 1, 1), end=dt.date(2000, 12, 31))
    assert all(t.startswith("2000-") for _, t in short)
    with pytest.raises(ValueError):
        make_dates(1, "dev")
    with pytest.raises(ValueError):
        make_dates(1, locales=[])
    with pytest.raises(ValueError):
        make_dates(1, locales=["xx_not_a_locale"])
    assert make_dates(0) == []


def test_date_corpus_is_a_parallel_corpus():
    c = date_corpus(200, 20, 30, seed=1, locales=["en", "zh"])
    assert c.sizes() == {"train": 200, "valid": 20, "test": 30}
    assert {t for _, t in c.train}.isdisjoint({t for _, t in c.test})
    assert c.references("test")[0][1]
