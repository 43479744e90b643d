"""Strict CSV/TSV for every table reader of qkv (speech manifests, summaries, text tables): quoted fields round-trip,
and a stray quote never merges rows silently: it is an error naming the line where the quote opens, or (where a
field may hold line breaks) a warning naming the lines it took."""

import csv
import io
import logging
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkv.apps.summarize.data import read_table_summaries
from qkv.data.files import table_rows
from qkv.data.speech import read_manifest
from qkv.data.text_classification import read_table
from tests import ROOT

FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _clip(folder, name="manifest"):
    """The audio file the manifests name (only they need one: soundfile is the speech extra's)."""
    if not name.startswith("manifest"):
        return None
    sf = pytest.importorskip("soundfile")
    path = folder / "clip.wav"
    if not path.exists():
        sf.write(path, (0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32), 16_000)
    return path


# Each reader: (file name, header, the fields of a row holding `text`, whether a field may hold line breaks, and
# the texts the reader returns, in order).
READERS = {
    "manifest-csv": ("m.csv", ["path", "sentence"], lambda t: ["clip.wav", t], False,
                     lambda p: [u.text for u in read_manifest(p)[0]]),
    "summaries-csv": ("s.csv", ["text", "summary"], lambda t: [t, "short"], True,
                      lambda p: [e.source for e in read_table_summaries(p, fmt="csv")[0]]),
    "summaries-tsv": ("s.tsv", ["text", "summary"], lambda t: [t, "short"], True,
                      lambda p: [e.source for e in read_table_summaries(p, fmt="tsv")[0]]),
    "table-csv": ("t.csv", ["text", "label"], lambda t: [t, "pos" if len(t) % 2 else "neg"], True,
                  lambda p: read_table(p, labels=["neg", "pos"]).texts),
    "table-tsv": ("t.tsv", ["text", "label"], lambda t: [t, "pos" if len(t) % 2 else "neg"], True,
                  lambda p: read_table(p, labels=["neg", "pos"]).texts),
}

WORDS = st.lists(st.sampled_from(["one", "two", "three", "four", "five", "six"]), min_size=1, max_size=3).map(" ".join)
TEXT = st.lists(st.one_of(WORDS, st.sampled_from([",", '"', "'", " ", '""', "\t"])), min_size=1, max_size=6).map(
    "".join).filter(lambda t: re.search("[a-z]", t) and t == t.strip())


def _write(path, header, rows, delimiter):
    buf = io.StringIO()
    csv.writer(buf, delimiter=delimiter, lineterminator="\n").writerows([header, *rows])
    path.write_text(buf.getvalue(), encoding="utf-8")


def _expected(name, text):
    from qkv.data.speech import normalize_transcript

    return normalize_transcript(text) if name.startswith("manifest") else text


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(texts=st.lists(TEXT, min_size=2, max_size=6), data=st.data())
def test_a_stray_quote_is_an_error_at_its_line_or_said(name, texts, data, tmp_path, caplog):
    file, header, row, multiline, read = READERS[name]
    _clip(tmp_path, name)
    delimiter = "\t" if file.endswith(".tsv") else ","
    path = tmp_path / file
    _write(path, header, [row(t) for t in texts], delimiter)
    assert read(path) == [_expected(name, t) for t in texts]  # quoted fields round-trip
    # a stray quote opening the text field of one row: unclosed, or closed with text after it
    k = data.draw(st.integers(0, len(texts) - 1))
    stray = data.draw(st.sampled_from(['"{} and more', '"{}" and more', '"{}']))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    fields = row("two words")
    fields[0 if header[0] == "text" else 1] = stray.format("two words")
    lines[k + 1] = delimiter.join(fields) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    caplog.clear()
    try:
        got = read(path)
    except ValueError as e:  # at the quote's line; a row found bad after the quote took lines: said in a warning
        assert str(e).startswith(f"{path}:{k + 2}: ") and "\n" not in str(e), str(e)
        assert "quote" in str(e) or f":{k + 2}: a quoted field runs over lines {k + 2}-" in caplog.text, str(e)
        return
    # read without an error: only where a field may hold line breaks, and then said with the lines it took
    assert multiline, f"{name}: a stray quote on line {k + 2} was read silently: {got}"
    assert len(got) < len(texts) and f":{k + 2}: a quoted field runs over lines {k + 2}-" in caplog.text


@pytest.mark.parametrize("name", READERS)
def test_the_error_names_the_opening_line_not_the_end_of_the_file(name, tmp_path):
    file, header, row, _, read = READERS[name]
    _clip(tmp_path, name)
    delimiter = "\t" if file.endswith(".tsv") else ","
    path = tmp_path / file
    rows = [row(t) for t in ["one", "two", "three", "four", "five"]]
    lines = [delimiter.join(header)] + [delimiter.join(r) for r in rows]
    col = 0 if header[0] == "text" else 1
    fields = row('"an unclosed quote')
    fields[col] = '"an unclosed quote'
    lines[2] = delimiter.join(fields)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: a quote opens a field on this line"):
        read(path)


def test_a_tsv_manifest_keeps_quotes_as_characters(tmp_path):
    _clip(tmp_path)
    path = tmp_path / "cv.tsv"
    path.write_text('path\tsentence\nclip.wav\t"Hello," she said\nclip.wav\tfour "rows\nclip.wav\tstay\n'
                    'clip.wav\tfour"\n', encoding="utf-8")
    assert [u.text for u in read_manifest(path)[0]] == ["hello she said", "four rows", "stay", "four"]


def test_four_rows_stay_four_utterances_or_fail(tmp_path):
    _clip(tmp_path)
    path = tmp_path / "m.csv"
    path.write_text('path,sentence\nclip.wav,"one\nclip.wav,two\nclip.wav,three"\nclip.wav,four\n', encoding="utf-8")
    for on_error in ("raise", "skip"):
        with pytest.raises(ValueError, match=r"m\.csv:2: a quote opens a field on this line and does not close on "
                                             "it \\(it closes on line 4"):
            read_manifest(path, on_error=on_error)


def test_multiline_fields_are_read_with_their_first_line_and_counted(tmp_path, caplog):
    path = tmp_path / "x.csv"
    path.write_text('a,b\n"one\ntwo",x\n\n"three""",y\n"four\n\nfive","six\nseven"\n', encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert list(table_rows(path, multiline=True)) == [(1, ["a", "b"]), (2, ["one\ntwo", "x"]),
                                                          (5, ['three"', "y"]), (6, ["four\n\nfive", "six\nseven"])]
    assert "x.csv:2: a quoted field runs over lines 2-3" in caplog.text and "2 records hold line breaks" in caplog.text
    with pytest.raises(ValueError, match=r"x\.csv:2: .*closes on line 3"):
        list(table_rows(path))
    path.write_text('a,b\n"fine",x\n"ok\nyes","a"b\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"x\.csv:4: a quoted field opens on this line and has text after"):
        list(table_rows(path, multiline=True))


def test_a_lone_carriage_return_names_its_line(tmp_path):
    path = tmp_path / "cr.csv"
    path.write_bytes(b"text,summary\nfine,x\nab\rcd,x\n")
    with pytest.raises(ValueError, match=r"cr\.csv:3: a carriage return \(\\r\) alone inside a line"):
        list(table_rows(path))


def test_every_table_reader_reads_through_table_rows():
    """A CSV reader written apart would not be strict: only qkv/data/files.py may call the csv module's reader."""
    users = [p.relative_to(ROOT) for p in (ROOT / "qkv").rglob("*.py")
             if re.search(r"csv\.(reader|DictReader|Sniffer)", p.read_text(encoding="utf-8"))]
    assert users == [ROOT.joinpath("qkv/data/files.py").relative_to(ROOT)]


def test_a_comma_in_an_unquoted_field_is_a_row_too_long_never_a_cut_text(tmp_path):
    _clip(tmp_path)
    manifest = tmp_path / "m.csv"
    manifest.write_text('path,sentence\nclip.wav, "one, two"\nclip.wav,three, four\nclip.wav,five\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"m\.csv:3: more fields than the header \(3, not 2: a comma inside"):
        read_manifest(manifest)
    utterances, skipped = read_manifest(manifest, on_error="skip")
    assert [u.text for u in utterances] == ["one two", "five"] and skipped == {"more fields than the header": 1}
    headerless_manifest = tmp_path / "h.csv"
    headerless_manifest.write_text("clip.wav\nclip.wav,one\nclip.wav,two, three\nclip.wav,four\n", encoding="utf-8")
    utterances, skipped = read_manifest(headerless_manifest, on_error="skip")
    assert [u.text for u in utterances] == ["one", "four"]
    assert skipped == {"more fields than most rows": 1, "expected 2 columns (audio path, transcript)": 1}
    table = tmp_path / "t.csv"
    table.write_text('text,label\nLoved it, truly,pos\n"Fine, really",pos\nBad,neg\nAwful,neg\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.csv:2: 3 fields, the header has 2: a comma inside an unquoted field"):
        read_table(table)
    data = read_table(table, on_error="skip")
    assert data.texts == ["Fine, really", "Bad", "Awful"] and data.skip_reasons == {"too many fields": 1}
    assert data.label_names == ["neg", "pos"]
    headerless = tmp_path / "h.csv"
    headerless.write_text("a,pos\nb,neg\nc, d,neg\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"h\.csv:3: 3 fields, the first row has 2"):
        read_table(headerless, header=False, text_col=0, label_col=1)
