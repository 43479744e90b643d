"""Tatoeba/Anki corpus reader: format errors, direction, filtering, caps, grouped deterministic splits."""

import gzip
import os
from collections import Counter

import pytest

from qkv.data import load_parallel, read_pairs, split_grouped
from qkv.data.pairs import infer_languages
from tests import SHARED_DATA

SHARED = str(SHARED_DATA / "tatoeba-eng-fra.tsv.gz")
ATTR = "CC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)"


def _write(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def _corpus_lines(n_sources=200, max_refs=3):
    lines = []
    for i in range(n_sources):
        for j in range(1 + i % max_refs):
            lines.append(f"source {i} is here .\tcible {i} version {j} .\t{ATTR}")
    return lines


def test_reads_plain_and_gz_with_or_without_attribution(tmp_path):
    lines = ["Hi.\tSalut !\t" + ATTR, "Run!\tCours !", "\ufeffnot a bom here\tici"]
    plain = _write(tmp_path / "eng-fra.tsv", lines)
    gz = _write(tmp_path / "eng-fra.tsv.gz", lines, gz=True)
    for p in (plain, gz):
        rows = list(read_pairs(p))
        assert rows[0] == (1, "Hi.", "Salut !")
        assert rows[1] == (2, "Run!", "Cours !")
    bom = _write(tmp_path / "bom.tsv", ["\ufeffHi.\tSalut."])
    assert list(read_pairs(bom)) == [(1, "Hi.", "Salut.")]


@pytest.mark.parametrize(
    "bad, what",
    [("no tab here", "no tab"), ("\tvide", "empty first"), ("vide\t  \tattr", "empty second")],
)
def test_malformed_line_raises_with_file_and_line(tmp_path, bad, what):
    p = _write(tmp_path / "c.tsv", ["a\tb", "", "c\td", bad, "e\tf"])
    with pytest.raises(ValueError, match=rf"c\.tsv:4: malformed line: {what}"):
        load_parallel(p)


def test_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_bytes(b"a\tb\n\xff\xfe\tx\n")
    with pytest.raises(ValueError, match=r"c\.tsv:2: .*UTF-8"):
        load_parallel(p)


def test_malformed_lines_skipped_and_counted(tmp_path):
    lines = _corpus_lines(50)
    lines[3] = "broken"
    lines[10] = "x\t"
    p = _write(tmp_path / "c.tsv", lines)
    c = load_parallel(p, on_error="skip")
    assert c.n_skipped == 2 and c.skipped_lines == [4, 11]
    assert sum(c.sizes().values()) == len(lines) - 2
    assert c.n_lines == len(lines)
    with pytest.raises(ValueError):
        load_parallel(p, on_error="ignore")


def test_direction_by_reverse_or_languages(tmp_path):
    p = _write(tmp_path / "tatoeba-eng-fra.tsv", ["Hi.\tSalut.", "Go.\tVa !"])
    assert infer_languages(p) == ("eng", "fra")
    assert infer_languages("fra.txt") == ("eng", "fra")
    fwd = load_parallel(p, fractions=(1, 0, 0))
    assert ("Hi.", "Salut.") in fwd.train and (fwd.src_lang, fwd.tgt_lang) == ("eng", "fra")
    rev = load_parallel(p, reverse=True, fractions=(1, 0, 0))
    assert ("Salut.", "Hi.") in rev.train and (rev.src_lang, rev.tgt_lang) == ("fra", "eng")
    for kw in ({"src_lang": "fr"}, {"tgt_lang": "en"}, {"src_lang": "fra", "tgt_lang": "eng"}):
        c = load_parallel(p, fractions=(1, 0, 0), **kw)
        assert sorted(c.train) == sorted(rev.train)
    assert sorted(load_parallel(p, src_lang="en", fractions=(1, 0, 0)).train) == sorted(fwd.train)
    with pytest.raises(ValueError, match="not one of"):
        load_parallel(p, src_lang="de")
    with pytest.raises(ValueError, match="same column"):
        load_parallel(p, src_lang="fr", tgt_lang="fr")
    with pytest.raises(ValueError, match="contradicts"):
        load_parallel(p, src_lang="fr", reverse=False)
    anon = _write(tmp_path / "pairs.tsv", ["Hi.\tSalut."])
    with pytest.raises(ValueError, match="columns"):
        load_parallel(anon, src_lang="fr")
    assert load_parallel(anon, columns=("en", "fr"), src_lang="fr", fractions=(1, 0, 0)).train == [("Salut.", "Hi.")]


def test_splits_grouped_by_source_and_complete(tmp_path):
    lines = _corpus_lines(300)
    p = _write(tmp_path / "c.tsv.gz", lines, gz=True)
    c = load_parallel(p, fractions=(0.8, 0.1, 0.1), seed=5)
    srcs = {s: {src for src, _ in c.split(s)} for s in ("train", "valid", "test")}
    assert not srcs["train"] & srcs["test"] and not srcs["train"] & srcs["valid"] and not srcs["valid"] & srcs["test"]
    assert sorted(c.train + c.valid + c.test) == sorted(tuple(line.split("\t")[:2]) for line in lines)
    total = len(lines)
    for name, frac in (("valid", 0.1), ("test", 0.1)):
        assert abs(len(c.split(name)) - frac * total) <= 3  # cut at group boundaries (groups of <= 3)
    refs = dict(c.references("test"))
    counts = Counter(line.split("\t")[0] for line in lines)
    assert all(len(refs[s]) == counts[s] for s in refs)  # every translation of a test source is a reference


def test_deterministic_from_seed(tmp_path):
    p = _write(tmp_path / "c.tsv", _corpus_lines(100))
    a, b = load_parallel(p, seed=1), load_parallel(p, seed=1)
    assert (a.train, a.valid, a.test) == (b.train, b.valid, b.test)
    assert load_parallel(p, seed=2).test != a.test


def test_length_filter_and_cap(tmp_path):
    lines = ["a\tb", "one two three\tun deux trois", "x y z w v u\tq", "long " * 30 + "\tcourt"] + _corpus_lines(100)
    p = _write(tmp_path / "c.tsv", lines)
    c = load_parallel(p, min_length=2, max_length=5)
    kept = c.train + c.valid + c.test
    assert all(2 <= len(s.split()) <= 5 and 2 <= len(t.split()) <= 5 for s, t in kept)
    assert c.n_filtered == 3
    c = load_parallel(p, max_length=8, length_unit="chars")
    assert all(len(s) <= 8 and len(t) <= 8 for s, t in c.train + c.valid + c.test)
    capped = load_parallel(p, max_pairs=57, seed=3)
    assert sum(capped.sizes().values()) == 57 and capped.n_capped == len(lines) - 57
    again = load_parallel(p, max_pairs=57, seed=3)
    assert again.train == capped.train
    with pytest.raises(ValueError):
        load_parallel(p, fractions=(0.5, 0.2, 0.2))
    with pytest.raises(ValueError):
        load_parallel(p, length_unit="bytes")


def test_split_grouped_tiny_and_empty():
    pairs = [(f"s{i}", f"t{i}") for i in range(10)]
    tr, va, te, capped = split_grouped(pairs, (0.8, 0.1, 0.1))
    assert (len(tr), len(va), len(te), capped) == (8, 1, 1, 0)
    assert split_grouped([], (0.8, 0.1, 0.1)) == ([], [], [], 0)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared Tatoeba file not present")
@pytest.mark.slow
def test_real_tatoeba_file():
    c = load_parallel(SHARED, src_lang="en", tgt_lang="fr", max_pairs=20_000, max_length=20, seed=0)
    assert (c.src_lang, c.tgt_lang) == ("eng", "fra")
    assert c.n_skipped == 0 and c.n_lines == 178_009
    assert sum(c.sizes().values()) == 20_000
    assert {s for s, _ in c.train}.isdisjoint(s for s, _ in c.test)
    assert any(len(refs) > 1 for _, refs in c.references("test"))
