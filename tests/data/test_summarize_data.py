"""Summarisation readers with hostile rows (one-line errors naming file:line, or skipped and counted), the split that
keeps near-identical families together (the Debian descriptions), and the facts as generation."""

import gzip
import json
import re

import pytest

from qkv.apps.summarize.data import (
    SummaryExample,
    cached_groups,
    debian_corpus,
    facts_corpus,
    near_duplicate_groups,
    read_stories,
    read_summaries,
    read_table_summaries,
    split_summaries,
)
from tests import SHARED_DATA

DEBIAN = SHARED_DATA / "debian-descriptions.jsonl.gz"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "qkv-cache"))  # the splits' grouping cache: not the user's


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = [{"text": f"document number {i} talks about topic {i}", "summary": f"topic {i}"} for i in range(3)]


@pytest.mark.parametrize("bad, message, reason", [
    ('{"text": "a", "summary": ', "not valid JSON", "bad JSON"),
    ('["text", "summary"]', "not an object", "not an object"),
    ({"text": "a b c"}, "no 'summary' field", "missing column"),
    ({"text": "a b c", "summary": 7}, "the target is int", "target not text"),
    ({"text": "   ", "summary": "x"}, "the source text is empty", "empty source"),
])
def test_jsonl_bad_rows_name_file_and_line_or_are_skipped_and_counted(tmp_path, bad, message, reason):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD[0], bad, GOOD[1]])
    with pytest.raises(ValueError, match=rf"^{path}:2: .*{message}") as e:
        read_table_summaries(path, fmt="jsonl")
    assert "\n" not in str(e.value)
    examples, reasons = read_table_summaries(path, fmt="jsonl", on_error="skip")
    assert [x.target for x in examples] == ["topic 0", "topic 1"] and reasons == {reason: 1}
    assert examples[1].where == f"{path}:3"


def test_jsonl_other_columns_gzip_and_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    rows = [{"article": "long text one", "abstract": "one", "id": "a"}, {}, {"article": "long text two",
                                                                           "abstract": "two", "id": "b"}]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[2]) + "\n")
    examples, _ = read_table_summaries(path, source="article", target="abstract", fmt="jsonl", name="id")
    assert [(x.source, x.target, x.name) for x in examples] == [("long text one", "one", "a"),
                                                                ("long text two", "two", "b")]


@pytest.mark.parametrize("fmt, sep", [("csv", ","), ("tsv", "\t")])
def test_csv_and_tsv_rows(tmp_path, fmt, sep):
    path = tmp_path / f"d.{fmt}"
    lines = [sep.join(["id", "text", "summary"]), sep.join(["1", "first text here", "first"]),
             sep.join(["2", "only two fields"]), sep.join(["3", "", "empty source"]),
             sep.join(["4", "fourth text", "fourth"])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}:3: 2 fields, the header has 3"):
        read_table_summaries(path, fmt=fmt)
    examples, reasons = read_table_summaries(path, fmt=fmt, on_error="skip")
    assert [x.target for x in examples] == ["first", "fourth"]
    assert reasons == {"wrong field count": 1, "empty source": 1}
    with pytest.raises(ValueError, match=rf"^{path}:1: the header has no column 'abstract'"):
        read_table_summaries(path, fmt=fmt, target="abstract")


def test_csv_quoted_newlines_and_broken_quotes(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('text,summary\n"a text, with a comma\nand a newline",short\nplain text,plain\n', encoding="utf-8")
    examples, _ = read_table_summaries(path, fmt="csv")
    assert examples[0].source == "a text, with a comma\nand a newline" and examples[1].where == f"{path}:4"
    bad = tmp_path / "bad.csv"
    bad.write_text('text,summary\n"unclosed quote,x\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{bad}:2: a quote opens a field on this line and never closes"):
        read_table_summaries(bad, fmt="csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty file"):
        read_table_summaries(empty, fmt="csv")
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,summary\ncaf\xe9,x\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{latin}:2: not UTF-8"):
        read_table_summaries(latin, fmt="csv")


def _story(path, body, highlights):
    text = "\n\n".join(body) + "".join(f"\n\n@highlight\n\n{h}" for h in highlights) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def test_cnn_dailymail_stories(tmp_path):
    stories = tmp_path / "stories"
    stories.mkdir()
    _story(stories / "a.story", ["(CNN) -- First paragraph.", "Second paragraph."], ["One point", "Two points"])
    _story(stories / "b.story", ["Text of b."], [])  # no highlight: no summary
    (stories / "c.story").write_text("Text of c.\n\n@highlight\n\n\n", encoding="utf-8")  # a highlight with nothing
    _story(stories / "d.story", [], ["Only a highlight"])  # no text
    with pytest.raises(ValueError, match=r"b\.story:1: a story without any @highlight"):
        read_stories(stories)
    examples, reasons = read_stories(stories, on_error="skip")
    assert [(x.source, x.target, x.name) for x in examples] == [
        ("(CNN) -- First paragraph. Second paragraph.", "One point Two points", "a")]
    assert reasons == {"no highlight": 1, "empty highlight": 1, "empty source": 1}
    one = read_stories(stories / "a.story")[0]
    assert one[0].where == f"{stories / 'a.story'}:5"
    corpus = read_summaries(stories, on_error="skip", fractions=(0, 0, 1))
    assert corpus.skipped == 3 and len(corpus.split("test")) == 1


def test_format_is_told_by_the_name(tmp_path):
    with pytest.raises(ValueError, match=r"cannot tell the format.*\(format\)"):
        read_summaries(_jsonl(tmp_path / "d.txt", GOOD))
    with pytest.raises(FileNotFoundError, match="no such data file"):
        read_summaries(tmp_path / "missing.jsonl")
    corpus = read_summaries(_jsonl(tmp_path / "d.txt", GOOD), fmt="jsonl", fractions=(1, 0, 0))
    assert len(corpus.train) == 3


def test_near_duplicates_are_grouped_by_text_name_and_shingles():
    base = ("frobnicator is a fast tool that converts images between many formats and keeps their colour profiles "
            "intact while doing so")
    examples = [
        SummaryExample(base, "a", name="frobnicator"),
        SummaryExample(base.upper().replace(" ", "   "), "b", name="other"),  # case and whitespace
        SummaryExample(base.replace("frobnicator", "frobnicator2"), "c", name="frobnicator2"),  # its own name
        SummaryExample(base + " This package contains the documentation.", "d", name="frobnicator-doc"),  # shingles
        SummaryExample("a completely different text about a web server written in go with many plugins", "e",
                       name="webby"),
    ]
    groups = near_duplicate_groups(examples)
    assert len(set(groups[:4])) == 1 and groups[4] != groups[0]
    exact = near_duplicate_groups(examples, shingles=False)
    assert exact[3] != exact[0] and len(set(exact[:3])) == 1


def test_split_keeps_every_family_in_one_split():
    examples = []
    for family in range(60):
        text = f"family {family} shares this long description about widget number {family} and its many uses"
        examples += [SummaryExample(text, f"member {m}", name=f"pkg{family}-{m}") for m in range(1 + family % 3)]
    splits = split_summaries(examples, seed=3)
    side = {}
    for name, exs in splits.items():
        for ex in exs:
            assert side.setdefault(ex.source, name) == name
    assert all(splits.values()) and sum(map(len, splits.values())) == len(examples)
    assert split_summaries(examples, seed=3) == splits  # deterministic
    capped = split_summaries(examples, seed=3, max_examples=10)
    assert 10 <= sum(map(len, capped.values())) <= 12
    with pytest.raises(ValueError, match="fractions"):
        split_summaries(examples, (0.5, 0.5, 0.5))


def _families(rng, n=40):
    """Random texts of words, some repeated with a package name swapped in or a sentence added (near-duplicates)."""
    words = ["tool", "library", "fast", "images", "server", "plugin", "data", "files", "network", "colour", "web"]
    examples = []
    for i in range(n):
        text = " ".join(rng.choice(words) + str(rng.randrange(30)) for _ in range(12 + rng.randrange(10)))
        examples.append(SummaryExample(text, "s", name=f"pkg{i}"))
        if rng.random() < 0.5:
            examples.append(SummaryExample(f"pkg{i}x {text} Documentation.", "d", name=f"pkg{i}x"))
    return examples


def test_grouping_cache_is_reused_keyed_by_content_and_rebuilt_when_corrupt(tmp_path, monkeypatch, caplog):
    import random

    import numpy as np

    from qkv.apps.summarize import split as summary_split

    rng = random.Random(5)
    examples = _families(rng)
    want = near_duplicate_groups(examples)
    assert len(set(want)) < len(examples)  # some families
    assert cached_groups(examples, cache_dir=tmp_path) == want
    (path,) = tmp_path.glob("*.npy")
    real = summary_split.near_duplicate_groups
    monkeypatch.setattr(summary_split, "near_duplicate_groups", lambda exs: pytest.fail("grouped again"))
    assert cached_groups(examples, cache_dir=tmp_path) == want  # read back
    monkeypatch.setattr(summary_split, "near_duplicate_groups", real)
    changed = [SummaryExample(e.source, e.target, name=e.name) for e in examples]
    changed[-1].source += " and one word more"
    assert cached_groups(changed, cache_dir=tmp_path) == near_duplicate_groups(changed)
    assert len(list(tmp_path.glob("*.npy"))) == 2  # another content, another file
    n = len(examples)
    for bad in (b"not a numpy file", np.arange(n - 1), np.full(n, n), (np.arange(n) + 1) % n, np.zeros(n) + 0.5):
        if isinstance(bad, bytes):
            path.write_bytes(bad)
        else:
            np.save(path, bad)
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert cached_groups(examples, cache_dir=tmp_path) == want
        assert "not a valid grouping cache" in caplog.text
        assert np.load(path).tolist() == want  # rewritten whole
    assert not list(tmp_path.glob("*.part"))
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    with caplog.at_level("WARNING"):
        assert cached_groups(examples, cache_dir=blocked / "sub") == want  # cannot be written: computed anyway
    assert "cannot keep the grouping" in caplog.text


def test_name_removal_matches_the_regular_expression_it_replaces():
    import random
    import re

    from qkv.apps.summarize.split import _remove_whole

    rng = random.Random(0)
    alphabet = "ab-_. é1"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(20)))
        part = "".join(rng.choice(alphabet) for _ in range(1 + rng.randrange(3)))
        assert _remove_whole(text, part) == re.sub(rf"(?<!\w){re.escape(part)}(?!\w)", " ", text), (text, part)


@pytest.mark.skipif(not DEBIAN.is_file(), reason=f"no Debian descriptions at {DEBIAN}")
def test_debian_descriptions_split_without_shared_descriptions(tmp_path):
    sample = tmp_path / "debian.jsonl"
    with gzip.open(DEBIAN, "rt", encoding="utf-8") as f:
        sample.write_text("".join(next(f) for _ in range(3000)), encoding="utf-8")
    corpus = debian_corpus(sample)
    assert all(corpus.sizes().values()) and sum(corpus.sizes().values()) == 3000
    seen = {}
    for name, exs in corpus.splits.items():
        for ex in exs:
            key = " ".join(ex.source.lower().split())
            assert seen.setdefault(key, name) == name, f"{ex.name}'s description is in {seen[key]} and {name}"
    assert "\n" not in corpus.train[0].source
    # the 0ad family (the same first paragraph, one line more each) stays together
    families = {name: {e.name for e in exs if e.name.startswith("0ad")} for name, exs in corpus.splits.items()}
    assert sum(bool(v) for v in families.values()) == 1


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_facts_as_generation_hold_out_their_entities(lang):
    from qkv.data.facts import entity_names

    corpus = facts_corpus(lang, n_train=300, n_eval=40)
    assert set(corpus.splits) == {"train", "valid", "test", "test_phrasings"}
    for ex in corpus.train[:50] + corpus.split("test"):
        assert ex.target and ex.target in ex.source  # the answer is written out from the passage
    if lang == "en":
        held = entity_names(lang)["held_out"]
        train_text = " ".join(ex.source for ex in corpus.train)
        test_answers = {ex.target for ex in corpus.split("test")}
        assert any(a in held for a in test_answers)
        # (as words: a held-out "Hornos" may be the start of a training name "Hornosrud")
        assert not any(re.search(rf"\b{re.escape(a)}\b", train_text) for a in test_answers & held)
