"""Documents for language models: the three file formats, the splits, and bad files as one-line errors."""

import gzip
import json

import pytest

from qkv.apps.lm.documents import load_documents, read_documents
from tests import SHARED_DATA


def test_text_jsonl_and_tsv_give_the_same_documents(tmp_path):
    docs = ["The cat sat.", "Un chat  est\tassis.", "猫が座った。"]
    (tmp_path / "a.txt").write_text("\n".join([docs[0], "", docs[1].replace("\t", " "), docs[2]]) + "\n")
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "id": 1}) + "\n")
    (tmp_path / "a.tsv").write_text("".join(f"{i}\t{d.replace(chr(9), ' ')}\n" for i, d in enumerate(docs)))
    want = [" ".join(d.split()) for d in docs]
    assert read_documents(tmp_path / "a.txt") == want
    assert read_documents(tmp_path / "a.jsonl.gz") == want
    assert read_documents(tmp_path / "a.tsv", "1") == want


@pytest.mark.parametrize("content, column, match", [
    (b"", None, "no text"),
    (b"\n  \n", None, "no text"),
    (b"ok\n\x00\x01\x02binary\n", None, ":2: a NUL byte"),
    (b"ok\n\xff\xfe\n", None, ":2: not UTF-8"),
])
def test_bad_text_files_name_the_line(tmp_path, content, column, match):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        read_documents(path, column)


@pytest.mark.parametrize("lines, column, match", [
    (['{"text": "a"}', '[1, 2]'], None, ":2: the record has no field 'text'"),
    (['{"text": "a"}', '{"body": "b"}'], None, ":2: the record has no field"),
    (['{"text": 3}'], None, ":1: the field 'text' is not a string"),
    (['{"text": "a"', ], None, ":1: not a JSON record"),
    (['{"body": "a"}'], "body", None),
])
def test_bad_jsonl_records_name_the_line(tmp_path, lines, column, match):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    if match is None:
        assert read_documents(path, column) == ["a"]
    else:
        with pytest.raises(ValueError, match=match):
            read_documents(path, column)


def test_tsv_columns_are_checked(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("a\tb\nc\n")
    with pytest.raises(ValueError, match=r"d.tsv:2: no column 1"):
        read_documents(path, "1")
    with pytest.raises(ValueError, match="0-based number"):
        read_documents(path, "second")
    with pytest.raises(ValueError, match="for .jsonl or .tsv"):
        read_documents(tmp_path / "x.txt", "1")


def test_splits_are_disjoint_seeded_and_cover_the_distinct_documents(tmp_path):
    path = tmp_path / "d.txt"
    lines = [f"document number {i}" for i in range(200)]
    path.write_text("\n".join(lines + lines[:10]) + "\n")
    a, b, c = load_documents(str(path), seed=1), load_documents(str(path), seed=1), load_documents(str(path), seed=2)
    assert (a.train, a.valid, a.test) == (b.train, b.valid, b.test)
    assert a.valid != c.valid
    assert len(a.valid) == len(a.test) == 10
    assert sorted(a.train + a.valid + a.test) == sorted(lines)
    path.write_text("one\ntwo\none\n")
    with pytest.raises(ValueError, match="2 distinct document"):
        load_documents(str(path))
    with pytest.raises(FileNotFoundError):
        load_documents(str(tmp_path / "missing.txt"))


@pytest.mark.skipif(not (SHARED_DATA / "debian-descriptions.jsonl.gz").is_file(), reason="no ../shared/data here")
def test_the_named_corpora_read_from_shared_data(monkeypatch):
    from qkv.apps.lm import documents

    monkeypatch.setitem(documents.NAMED_CORPORA, "debian",
                        (str(SHARED_DATA / "debian-descriptions.jsonl.gz"), "text"))
    corpus = load_documents("debian", max_documents=500)
    assert len(corpus.train) + len(corpus.valid) + len(corpus.test) == 500
    assert all(isinstance(d, str) and d for d in corpus.train)
