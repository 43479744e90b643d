"""Text classification readers (movie reviews, CSV/TSV), their errors, stratified splits and k folds."""

import gzip
from collections import Counter
from pathlib import Path

import pytest

from qkv.data.text_classification import kfold_splits, read_movie_reviews, read_table, strata, stratified_split
from tests import SHARED_DATA

DATA = SHARED_DATA / "movie-review-snippets.tsv.gz"

REVIEWS = """id\tsentiment\ttext
1\t2.5\tA gorgeous, witty film.
2\t-1.2\tDull and overlong.
3\t0\tIt is a movie.
4\t0.4\tPleasant enough.
"""


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["reviews.tsv", "reviews.tsv.gz"])
def test_movie_reviews_binary_drops_zeros(tmp_path, name):
    data = read_movie_reviews(write(tmp_path / name, REVIEWS))
    assert data.texts == ["A gorgeous, witty film.", "Dull and overlong.", "Pleasant enough."]
    assert data.labels == [1, 0, 1]
    assert data.label_names == ["negative", "positive"] and data.num_classes == 2
    assert data.skipped == 1 and data.skip_reasons == {"neutral": 1}


def test_movie_reviews_regression_keeps_ratings(tmp_path):
    data = read_movie_reviews(write(tmp_path / "r.tsv", REVIEWS), regression=True)
    assert data.labels == [2.5, -1.2, 0.0, 0.4] and data.regression and data.num_classes == 1


@pytest.mark.parametrize("line,message", [
    ("5\t1.0\t   ", ":6: the text is empty"),
    ("5\tgreat\tA film.", ":6: the rating 'great' is not a number"),
    ("5\t1.0", ":6: expected id<TAB>sentiment<TAB>text"),
])
def test_movie_reviews_bad_rows_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "bad.tsv", REVIEWS + line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        read_movie_reviews(path)
    assert str(path) in str(e.value)
    data = read_movie_reviews(path, on_error="skip")
    assert len(data) == 3 and data.skipped == 2  # the neutral row and the bad one


def test_movie_reviews_real_file():
    if not DATA.exists():
        pytest.skip("the shared movie-review data is not here")
    data = read_movie_reviews(DATA)
    assert len(data) == 10568 and data.skip_reasons == {"neutral": 37}
    assert Counter(data.labels) == {1: 5242, 0: 5326}


CSV = "\n".join(['text,label,source', '"Loved it, truly",pos,a', 'Hated it,neg,b', '"So-so, ""meh""",neutral,c',
                 'Fine,pos,d']) + "\n"


def test_table_csv_by_name(tmp_path):
    data = read_table(write(tmp_path / "d.csv", CSV), text_col="text", label_col="label")
    assert data.texts == ["Loved it, truly", "Hated it", 'So-so, "meh"', "Fine"]
    assert data.label_names == ["neg", "neutral", "pos"]
    assert data.labels == [2, 0, 1, 2]


def test_table_tsv_by_index_without_header_numeric_labels(tmp_path):
    path = write(tmp_path / "d.tsv.gz", "10\tgood one\n2\tbad one\n1\tugly one\n")
    data = read_table(path, text_col=1, label_col=0, header=False)
    assert data.label_names == ["1", "2", "10"]  # numbers sort numerically
    assert data.labels == [2, 1, 0]


def test_table_unknown_labels_raise_or_skip(tmp_path):
    path = write(tmp_path / "d.csv", CSV)
    with pytest.raises(ValueError, match=r"d\.csv:4: unknown label 'neutral' \(known: neg, pos\)"):
        read_table(path, labels=["neg", "pos"])
    data = read_table(path, labels=["neg", "pos"], on_error="skip")
    assert data.labels == [1, 0, 1] and data.skipped == 1 and data.skip_reasons == {"unknown label": 1}


def test_table_empty_text_and_missing_column(tmp_path):
    path = write(tmp_path / "d.csv", "text,label\n,pos\nok,neg\nshort\nfine,pos\n")
    with pytest.raises(ValueError, match=":2: the text is empty"):
        read_table(path)
    data = read_table(path, on_error="skip")
    assert data.texts == ["ok", "fine"] and data.labels == [0, 1]
    assert data.skip_reasons == {"empty text": 1, "missing column": 1}


def test_table_bad_arguments(tmp_path):
    path = write(tmp_path / "d.csv", CSV)
    with pytest.raises(ValueError, match="no column 'review'"):
        read_table(path, text_col="review")
    with pytest.raises(ValueError, match="on_error"):
        read_table(path, on_error="ignore")
    with pytest.raises(ValueError, match="at least two classes"):
        read_table(write(tmp_path / "one.csv", "text,label\na,x\nb,x\n"))
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="not a number"):
        read_table(path, regression=True)


def test_table_regression(tmp_path):
    data = read_table(write(tmp_path / "r.csv", "text,score\na,1.5\nb,-2\n"), label_col="score", regression=True)
    assert data.labels == [1.5, -2.0] and data.num_classes == 1


def labels_3(n=300):
    return [0] * (n // 2) + [1] * (n // 3) + [2] * (n - n // 2 - n // 3)


def test_stratified_split_is_disjoint_proportional_and_seeded():
    labels = labels_3()
    train, valid, test = stratified_split(labels, valid=0.1, test=0.2, seed=3)
    assert sorted(train + valid + test) == list(range(len(labels)))
    for part, frac in ((valid, 0.1), (test, 0.2)):
        counts = Counter(labels[i] for i in part)
        for c, n in Counter(labels).items():
            assert abs(counts[c] - frac * n) <= 1
    assert stratified_split(labels, valid=0.1, test=0.2, seed=3) == (train, valid, test)
    assert stratified_split(labels, valid=0.1, test=0.2, seed=4) != (train, valid, test)
    with pytest.raises(ValueError):
        stratified_split(labels, valid=0.6, test=0.5)


def test_kfold_tests_every_example_once_and_is_stratified():
    labels = labels_3(301)
    folds = kfold_splits(labels, 10, seed=0)
    assert len(folds) == 10
    tested = sorted(i for _, test in folds for i in test)
    assert tested == list(range(301))
    for train, test in folds:
        assert not set(train) & set(test) and len(train) + len(test) == 301
        assert 29 <= len(test) <= 31
        for c, n in Counter(labels).items():
            assert abs(sum(labels[i] == c for i in test) - n / 10) <= 1
    with pytest.raises(ValueError, match="k must be"):
        kfold_splits(labels, 1)


def test_strata_of_ratings_are_quantile_bins():
    ratings = [float(x) for x in range(-50, 50)]
    s = strata(ratings, bins=10)
    assert Counter(s) == {b: 10 for b in range(10)}
    assert s[0] == 0 and s[-1] == 9
