"""The sentiment task end to end on tiny data: `qkv train sentiment` into tmp_path, then `qkv classify` (terminal and
HTML), k folds, a CSV file, regression, resume, and the errors a user meets first."""

import json
import random
from html.parser import HTMLParser

import pytest
import torch

from qkv.cli import main
from qkv.tasks.sentiment import SentimentClassifier, SentimentOptions, SentimentTask
from qkv.train import TrainConfig, train

FILLER = ["the", "movie", "plot", "actor", "scene", "story", "film", "script", "cast", "director", "music", "ending",
          "camera", "moment", "hour", "character", "dialogue", "year", "studio", "screen"]
TINY = ["--embed-dim", "16", "--hidden-dim", "16", "--dropout", "0", "--embed-dropout", "0", "--no-progress",
        "--lr", "1e-2", "--batch-size", "16", "--warmup-steps", "0"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is faster, and does not fight other processes for the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def sentences(n, seed=0):
    """Filler sentences where one planted word decides: 'wonderful' (positive) or 'awful' (negative)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        positive = i % 2 == 0
        words.insert(rng.randrange(len(words) + 1), "wonderful" if positive else "awful")
        rating = rng.uniform(0.5, 3.5) * (1 if positive else -1)
        out.append((" ".join(words).capitalize() + ".", rating))
    return out


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "reviews.tsv"
    lines = ["id\tsentiment\ttext"] + [f"{i}\t{r:.3f}\t{t}" for i, (t, r) in enumerate(sentences(600), 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Tokens(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.spans, self._in = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "span":
            self._in = True
            self.spans.append(["", float(dict(attrs)["title"])])

    def handle_endtag(self, tag):
        self._in = False if tag == "span" else self._in

    def handle_data(self, data):
        if self._in:
            self.spans[-1][0] += data


def test_train_then_classify_with_html(reviews, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "sentiment", "--data", str(reviews), "--out", str(run), "--epochs", "6", *TINY]) == 0
    out = capsys.readouterr().out
    assert "test: accuracy" in out
    assert (run / "best" / "model.safetensors").is_file() and (run / "best" / "assets" / "tokenizer").is_dir()
    config = json.loads((run / "best" / "config.json").read_text())
    assert config["task"] == "sentiment" and config["config"]["label_names"] == ["negative", "positive"]
    test_acc = float(out.split("test: accuracy ")[1].split(",")[0])
    assert test_acc >= 0.9

    html_path = tmp_path / "page.html"
    texts = ["The camera story wonderful.", "An awful <script>alert(1)</script> ending."]
    assert main(["classify", str(run), *texts, "--html", str(html_path), "--color", "never"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("positive ") and "wonderful" in lines[0] and "\x1b[" not in lines[0]
    assert lines[1].startswith("negative ")
    top = lines[0].split("\t")[-1]
    assert top.startswith("[wonderful ")  # the planted word is the most attended
    page = html_path.read_text(encoding="utf-8")
    parser = Tokens()
    parser.feed(page)
    assert "script" not in parser.tags and "<script" not in page and "&lt;" in page
    assert "<" in [w for w, _ in parser.spans]  # the word tokeniser splits "<script>": each piece is escaped
    words = [w for w, _ in parser.spans]
    assert words[:4] == ["The", "camera", "story", "wonderful"]  # shown as written, original case
    weights = [w for _, w in parser.spans[:5]]
    assert max(weights) == weights[3] and sum(weights) == pytest.approx(1.0, abs=1e-3)

    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("awful\n\nwonderful film\n", encoding="utf-8")
    assert main(["classify", str(run), "--file", str(texts_file), "--color", "always"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "\x1b[" in lines[0] and lines[1].startswith("positive")


def test_classifier_api_and_regression(reviews, tmp_path, capsys):
    run = tmp_path / "reg"
    assert main(["train", "sentiment", "--data", str(reviews), "--out", str(run), "--epochs", "3", "--regression",
                 *TINY]) == 0
    assert "pearson" in capsys.readouterr().out
    clf = SentimentClassifier.load(run)
    (p,) = clf.predict(["wonderful"])
    assert p.value is not None and p.label in ("positive", "negative") and len(p.weights) == 1
    assert p.caption.startswith(p.label)


def test_transformer_kfold(reviews, tmp_path, capsys):
    run = tmp_path / "kfold"
    args = ["train", "sentiment", "--data", str(reviews), "--out", str(run), "--model", "transformer", "--folds", "2",
            "--epochs", "2", "--heads", "2", "--layers", "1", *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2-fold test accuracy" in out and (run / "fold-1" / "best").is_dir()
    summary = json.loads((run / "kfold.json").read_text())
    assert len(summary["test_accuracy"]) == 2


def test_csv_data_multiclass_and_hops(tmp_path):
    rows = ["review,stars"]
    rng = random.Random(1)
    for i in range(150):
        word, stars = [("awful", "1"), ("fine", "3"), ("wonderful", "5")][i % 3]
        words = [rng.choice(FILLER) for _ in range(4)] + [word]
        rng.shuffle(words)
        rows.append(f"\"{' '.join(words)}\",{stars}")
    rows.append(",5")  # empty text: skipped and counted
    path = tmp_path / "stars.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    opts = SentimentOptions(data=str(path), text_col="review", label_col="stars", on_error="skip", hops=2,
                            penalty=0.1, embed_dim=16, hidden_dim=16, dropout=0.0, embed_dropout=0.0)
    task = SentimentTask(opts)
    result = train(task, TrainConfig(epochs=3, batch_size=16, lr=1e-2, monitor="accuracy", progress=False))
    assert task.dataset.skipped == 1 and task.dataset.label_names == ["1", "3", "5"]
    assert result.metrics["test"]["accuracy"] > 0.8
    clf = SentimentClassifier(result.model, task.tokenizer, task.config())
    (p,) = clf.predict(["a wonderful story"])
    assert p.label == "5" and set(p.probabilities) == {"1", "3", "5"}
    assert len(p.weights) == 3 and sum(p.weights) == pytest.approx(1.0, abs=1e-5)  # hops averaged


def test_resume_continues_the_run(reviews, tmp_path, capsys):
    run = tmp_path / "resume"
    base = ["train", "sentiment", "--data", str(reviews), "--out", str(run), *TINY]
    assert main([*base, "--epochs", "2", "--max-steps", "3"]) == 0
    assert main([*base, "--epochs", "2"]) == 2  # without --resume, an existing run is not overwritten
    assert "qkv: error:" in capsys.readouterr().err
    assert main([*base, "--epochs", "2", "--resume"]) == 0
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    assert state["position"]["epoch"] == 2


def test_user_errors(reviews, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\tsentiment\ttext\n1\t1.0\tgood\n2\tnot-a-number\tbad\n", encoding="utf-8")
    assert main(["train", "sentiment", "--data", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "bad.tsv, line 3" in err and "on_error='skip'" in err
    with pytest.raises(ValueError, match="--text-col and --label-col"):
        SentimentOptions(data=str(reviews), text_col="text")
    with pytest.raises(ValueError, match="pooling attention"):
        SentimentOptions(data=str(reviews), model="transformer", hops=3)
    with pytest.raises(SystemExit):
        main(["classify"])
