"""The sentiment task end to end on tiny data: `qkv train sentiment` into tmp_path, then `qkv classify` (terminal and
HTML), the library (options, model spec, `SentimentClassifier`), k folds, a CSV file, regression, resume, and the
errors a user meets first."""

import contextlib
import io
import json
import random
from html.parser import HTMLParser

import pytest
import torch

from qkv.apps.base import model_from_spec
from qkv.apps.sentiment import (
    SentimentClassifier,
    SentimentOptions,
    SentimentTask,
    load_data,
    model_spec,
    train_defaults,
)
from qkv.cli import main
from qkv.models import create
from qkv.train import TrainConfig, load_model, train
from qkv.train.checkpoint import load_weights
from tests import FIXTURES
from tests.helpers import FILLER, single_thread, write_reviews
from tests.helpers import SENTIMENT_TINY as TINY
from tests.helpers import SENTIMENT_TINY_TRANSFORMER as TINY_TRANSFORMER

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture
def reviews(tmp_path):
    return write_reviews(tmp_path / "reviews.tsv")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A BiGRU trained by `qkv train sentiment` for 6 epochs: its run directory and what the command printed."""
    root = tmp_path_factory.mktemp("sentiment")
    reviews = write_reviews(root / "reviews.tsv")
    run = root / "run"
    printed = io.StringIO()
    with single_thread(), contextlib.redirect_stdout(printed):
        rc = main(["train", "sentiment", "--data", str(reviews), "--out", str(run), "--epochs", "6", *TINY])
    assert rc == 0
    return run, printed.getvalue()


def by_hand(clf, text):
    """``clf.model`` run directly on one text (no padding, no batching): its logits and pooled weights."""
    ids = clf.tokenizer.encode(text)[: clf.options.max_len]
    with torch.no_grad():
        out = clf.model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
    weights = out.weights[0]
    return out.logits[0], (weights.mean(0) if weights.dim() == 2 else weights), ids


def rebuilt_from_checkpoint(run):
    """The model of ``run/best`` rebuilt from its config's model entry with `qkv.models.create` alone."""
    best = run / "best"
    config = json.loads((best / "config.json").read_text(encoding="utf-8"))["config"]
    model = create(config["model"]["name"], **config["model"]["config"])
    model.load_state_dict(load_weights(best / "model.safetensors"))
    return model.eval(), config


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


def test_train_then_classify_with_html(trained, tmp_path, capsys):
    run, out = trained
    assert "test: accuracy" in out
    assert (run / "best" / "model.safetensors").is_file() and (run / "best" / "assets" / "tokenizer").is_dir()
    meta = json.loads((run / "best" / "config.json").read_text())
    assert meta["task"] == "sentiment" and meta["version"] == 2
    config = meta["config"]
    assert config["label_names"] == ["negative", "positive"] and config["regression"] is False
    assert config["model"]["name"] == "bigru-classifier" and config["model"]["config"]["hidden_dim"] == 32
    assert config["options"]["hidden_dim"] == 32 and config["options"]["model"] == "bigru"
    test_acc = float(out.split("test: accuracy ")[1].split(",")[0])
    assert test_acc >= 0.9
    # the training flags not given are the task's presets (train_defaults)
    start = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    preset = train_defaults(SentimentOptions(**config["options"]))
    used = start["train_config"]
    assert used["epochs"] == 6 and used["lr"] == 1e-2 and used["batch_size"] == 16
    for name in ("weight_decay", "schedule", "patience", "monitor"):
        assert used[name] == getattr(preset, name), name
    assert used["monitor"] == "accuracy"

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
    texts_file.write_text("awful\nwonderful film\n", encoding="utf-8")
    assert main(["classify", str(run), "--file", str(texts_file), "--color", "always"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "\x1b[" in lines[0] and lines[1].startswith("positive")


def test_classifier_predicts_what_the_model_computes(trained):
    run, _ = trained
    clf = SentimentClassifier.load(run)
    assert clf.options.model == "bigru" and clf.options.hidden_dim == 32 and clf.label_names == ["negative", "positive"]
    assert clf.model.rnn.hidden_size == 16 and clf.model.rnn.bidirectional  # hidden_dim is both directions together
    texts = ["The camera story wonderful.", "an awful ending", "Awful", " ".join(["wonderful", "film"] * 80)]
    predictions = clf.predict(texts, batch_size=3)  # two batches, padded: the same as one text at a time
    assert [p.text for p in predictions] == texts
    for text, p in zip(texts, predictions, strict=True):
        logits, weights, ids = by_hand(clf, text)
        probs = logits.softmax(-1)
        assert p.label == clf.label_names[int(probs.argmax())] and p.value is None
        assert p.probability == pytest.approx(float(probs.max()), abs=1e-5)
        assert list(p.probabilities) == clf.label_names
        assert [p.probabilities[n] for n in clf.label_names] == pytest.approx(probs.tolist(), abs=1e-5)
        assert len(ids) <= clf.options.max_len == 100 and len(p.tokens) == len(p.weights) == len(ids)
        assert p.weights == pytest.approx(weights.tolist(), abs=1e-5)
    assert predictions[0].tokens == ["The", "camera", "story", "wonderful", "."]
    assert [p.label for p in predictions] == ["positive", "negative", "negative", "positive"]


def test_the_checkpoint_model_entry_rebuilds_the_model(trained):
    run, _ = trained
    model, config = rebuilt_from_checkpoint(run)
    clf = SentimentClassifier.load(run)
    assert config["model"] == clf.config["model"]
    # the options as trained give the same model entry (the vocabulary and classes come from the data)
    spec = model_spec(SentimentOptions(**config["options"]), vocab_size=config["model"]["config"]["vocab_size"],
                      num_classes=2)
    assert spec == config["model"]
    ids = torch.tensor([clf.tokenizer.encode("the wonderful film"), clf.tokenizer.encode("an awful, awful plot")[:3]])
    mask = ids != 0
    with torch.no_grad():
        a, b = model(ids, mask), clf.model(ids, mask)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.weights, b.weights)


def test_empty_texts_are_errors(trained, capsys):
    run, _ = trained
    clf = SentimentClassifier.load(run)
    for texts, n in (([""], 1), (["a wonderful film", "   "], 2), (["\n\t"], 1)):
        with pytest.raises(ValueError, match=f"text {n} is empty"):
            clf.predict(texts)
    assert main(["classify", str(run), ""]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("qkv: error:") and "\n" not in err and "text 1 is empty" in err
    assert captured.out == ""
    assert main(["classify", str(run), "a wonderful film", " "]) == 2  # nothing printed for the good one either
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("qkv: error: text 2 is empty")
    assert main(["classify", str(run)]) == 2
    assert "give texts to classify" in capsys.readouterr().err


def test_classifier_api_and_regression(reviews, tmp_path, capsys):
    run = tmp_path / "reg"
    assert main(["train", "sentiment", "--data", str(reviews), "--out", str(run), "--epochs", "3", "--regression",
                 *TINY]) == 0
    assert "pearson" in capsys.readouterr().out
    clf = SentimentClassifier.load(run)
    assert clf.regression and clf.options.regression
    (p,) = clf.predict(["wonderful"])
    assert p.value is not None and p.label in ("positive", "negative") and len(p.weights) == 1
    assert p.caption.startswith(p.label)
    logits, weights, _ = by_hand(clf, "wonderful")
    assert logits.shape == (1,) and p.value == pytest.approx(float(logits[0]), abs=1e-5)
    assert p.label == ("positive" if p.value > 0 else "negative")
    assert p.weights == pytest.approx(weights.tolist(), abs=1e-6)


def test_transformer_kfold(reviews, tmp_path, capsys):
    run = tmp_path / "kfold"
    args = ["train", "sentiment", "--data", str(reviews), "--out", str(run), "--model", "transformer", "--folds", "2",
            "--epochs", "2", *TINY_TRANSFORMER]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2-fold test accuracy" in out and (run / "fold-1" / "best").is_dir()
    summary = json.loads((run / "kfold.json").read_text())
    assert len(summary["test_accuracy"]) == 2
    model, config = rebuilt_from_checkpoint(run / "fold-0")
    assert config["model"]["name"] == "transformer-classifier"
    assert {k: config["model"]["config"][k] for k in ("dim", "num_heads", "num_layers")} == \
        {"dim": 16, "num_heads": 2, "num_layers": 1}
    assert config["options"]["fold"] == 0 and config["options"]["folds"] == 2
    clf = SentimentClassifier.load(run / "fold-0")
    (p,) = clf.predict(["the wonderful film"])
    logits, weights, _ = by_hand(clf, "the wonderful film")
    ids = torch.tensor([clf.tokenizer.encode("the wonderful film")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, clf.model(ids).logits)
    assert [p.probabilities[n] for n in clf.label_names] == pytest.approx(logits.softmax(-1).tolist(), abs=1e-5)
    assert p.weights == pytest.approx(weights.tolist(), abs=1e-5)


@pytest.mark.parametrize("options", [
    SentimentOptions(model="bilstm", hidden_dim=24, attn_dim=8, mlp_dim=12, hops=2, num_layers=2, embed_dim=10),
    SentimentOptions(model="bigru", hidden_dim=16, embed_dim=8),
    SentimentOptions(model="transformer", dim=16, num_heads=2, ffn_dim=24, pooling="attention", hops=2,
                     num_layers=2, embed_dim=8),
], ids=["bilstm", "bigru", "transformer"])
def test_build_model_is_the_spec(options):
    spec = model_spec(options, vocab_size=50, num_classes=3)
    assert spec["name"] == f"{options.model}-classifier" and json.loads(json.dumps(spec)) == spec  # JSON only
    assert spec["config"]["vocab_size"] == 50 and spec["config"]["num_classes"] == 3
    model = model_from_spec(model_spec(options, vocab_size=50, num_classes=3))
    again = create(spec["name"], **spec["config"])
    assert type(model) is type(again)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in again.state_dict().items()}
    if options.model == "transformer":
        assert spec["config"]["dim"] == 16 and spec["config"]["num_heads"] == 2 and spec["config"]["ffn_dim"] == 24
        assert "hidden_dim" not in spec["config"]
    else:
        assert model.rnn.hidden_size == options.hidden_dim // 2  # both directions together
        assert model.rnn.num_layers == options.num_layers
        assert "num_heads" not in spec["config"] and "dim" not in spec["config"]


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
                            penalty=0.1, embed_dim=16, hidden_dim=32, dropout=0.0, embed_dropout=0.0)
    dataset = load_data(opts)
    assert dataset.skipped == 1 and dataset.label_names == ["1", "3", "5"] and len(dataset) == 150
    task = SentimentTask(opts)
    run = tmp_path / "run"
    result = train(task, TrainConfig(epochs=3, batch_size=16, lr=1e-2, monitor="accuracy", progress=False,
                                     out=str(run)))
    assert task.data.skipped == 1 and task.data.label_names == ["1", "3", "5"]
    assert result.metrics["test"]["accuracy"] > 0.8
    clf = SentimentClassifier(result.model, opts, task.config(), tokenizer=task.tokenizer)
    (p,) = clf.predict(["a wonderful story"])
    assert p.label == "5" and set(p.probabilities) == {"1", "3", "5"}
    assert len(p.weights) == 3 and sum(p.weights) == pytest.approx(1.0, abs=1e-5)  # hops averaged
    # what the run saved predicts the same, and its model entry alone rebuilds the trained model
    loaded = SentimentClassifier.load(run)
    assert loaded.options == opts and loaded.label_names == ["1", "3", "5"]
    (q,) = loaded.predict(["a wonderful story"])
    assert q.probabilities == pytest.approx(p.probabilities, abs=1e-6) and q.weights == pytest.approx(p.weights)
    model, config = rebuilt_from_checkpoint(run)
    assert config["model"] == model_spec(opts, vocab_size=task.tokenizer.vocab_size, num_classes=3)
    assert config["model"]["config"]["hops"] == 2
    result.model.eval()
    batch = task.collate(task.encoded["test"][:20])
    with torch.no_grad():
        assert torch.equal(model(batch["ids"], batch["mask"]).logits,
                           result.model(batch["ids"], batch["mask"]).logits)
    with pytest.raises(ValueError, match="not a 'translate' one"):
        load_model(run, lambda c: create(c["model"]["name"], **c["model"]["config"]), task="translate")


def test_resume_continues_the_run(reviews, tmp_path, capsys):
    run = tmp_path / "resume"
    base = ["train", "sentiment", "--data", str(reviews), "--out", str(run), *TINY]
    assert main([*base, "--epochs", "2", "--max-steps", "3"]) == 0
    assert main([*base, "--epochs", "2"]) == 2  # without --resume, an existing run is not overwritten
    assert "qkv: error:" in capsys.readouterr().err
    assert main([*base, "--epochs", "2", "--resume"]) == 0
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    assert state["position"]["epoch"] == 2


def test_too_small_data_is_an_error(tmp_path, capsys):
    path = tmp_path / "three.tsv"
    path.write_text("id\tsentiment\ttext\n1\t1.0\tgood film\n2\t-1.0\tbad film\n3\t2.0\tgreat film\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match="3 examples give 3 train, 0 valid, 0 test"):
        SentimentTask(SentimentOptions(data=str(path))).setup()
    for extra, counts in (([], "3 train, 0 valid, 0 test"), (["--folds", "2"], "1 train, 0 valid, 2 test")):
        out = tmp_path / f"run{len(extra)}"
        assert main(["train", "sentiment", "--data", str(path), "--out", str(out), "--epochs", "1", *extra,
                     *TINY]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error:") and "\n" not in err, err
        assert "three.tsv" in err and f"3 examples give {counts}" in err
        assert not (out / "best").exists() and not (out / "checkpoint").exists()
        assert not (out / "fold-0").exists() and not list(tmp_path.rglob("model.safetensors"))


def test_user_errors(reviews, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\tsentiment\ttext\n1\t1.0\tgood\n2\tnot-a-number\tbad\n", encoding="utf-8")
    assert main(["train", "sentiment", "--data", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "bad.tsv:3:" in err and "on_error='skip'" in err
    with pytest.raises(ValueError, match="text_col and label_col"):
        SentimentOptions(data=str(reviews), text_col="text")
    assert main(["train", "sentiment", "--data", str(reviews), "--text-col", "text"]) == 2
    err = capsys.readouterr().err
    assert "--text-col and --label-col" in err and err.startswith("qkv: error:")
    with pytest.raises(ValueError, match="hops needs attention pooling"):
        SentimentOptions(data=str(reviews), model="transformer", hops=3)
    assert SentimentOptions(model="transformer", pooling="attention", hops=3).hops == 3
    # an option set for a model it does not apply to is an error, in the library and on the command line
    with pytest.raises(ValueError, match="hidden_dim does not apply to model transformer"):
        SentimentOptions(model="transformer", hidden_dim=32)
    with pytest.raises(ValueError, match="num_heads does not apply to model bigru"):
        SentimentOptions(num_heads=2)
    with pytest.raises(ValueError, match="must be even"):
        SentimentOptions(hidden_dim=15)
    assert main(["train", "sentiment", "--data", str(reviews), "--model", "transformer", "--hidden-dim", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and "--hidden-dim does not apply to --model transformer" in err
    assert main(["train", "sentiment", "--data", str(tmp_path / "missing.tsv")]) == 2
    assert "no such data file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["classify"])


@pytest.mark.parametrize("model", ["bigru", "transformer"])
def test_mixed_precision_training_on_the_cpu(model, tmp_path):
    """bfloat16 autocast mixes float32 parameters (the pooling query) with bfloat16 activations in attention."""
    data = FIXTURES / "v1" / "sentiment.tsv"
    assert main(["train", "sentiment", "--data", str(data), "--model", model, "--amp", "bf16", "--device", "cpu",
                 "--max-steps", "3", "--no-progress", "--out", str(tmp_path / "r")]) == 0


def test_a_text_past_max_len_is_cut_with_a_word(trained, caplog):
    """Words past the run's max_len are not read: a warning naming the text, `cut` on the prediction, a note on the
    page; the prediction equals that of the text cut by hand."""
    from qkv.apps.base import ViewInput

    run, _ = trained
    clf = SentimentClassifier.load(run, "cpu")
    words = ("a gorgeous witty seductive movie " * 40).split()
    assert len(words) > clf.max_len
    with caplog.at_level("WARNING"):
        short, long = clf.predict(["a gorgeous movie", " ".join(words)])
    assert long.cut == len(words) - clf.max_len and short.cut == 0
    assert any(f"text 2 has {len(words)} tokens" in r.getMessage() for r in caplog.records)
    (by_hand,) = clf.predict([" ".join(words[: clf.max_len])])
    assert by_hand.probabilities == pytest.approx(long.probabilities) and by_hand.cut == 0
    assert any("were not read" in note for note in clf.view(ViewInput(text=" ".join(words))).notes)


def test_display_tokens_are_the_text_as_typed(tmp_path):
    """Chinese and full-width text through a mixed word tokeniser: one weight per token, shown as typed."""
    from qkv.data.tokenize import WordTokenizer

    tok = WordTokenizer.train(["质能方程由爱因斯坦提出 a GREAT movie"], min_freq=1)
    options = SentimentOptions(data="x", embed_dim=8, hidden_dim=8)
    model = model_from_spec(model_spec(options, vocab_size=tok.vocab_size, num_classes=2))
    clf = SentimentClassifier(model, options, {"label_names": ["negative", "positive"]}, tokenizer=tok)
    (p,) = clf.predict(["质能方程 由爱因斯坦提出，ａ GREAT movie"])
    assert p.tokens == ["质", "能", "方", "程", "由", "爱", "因", "斯", "坦", "提", "出", "，", "ａ", "GREAT", "movie"]
    assert len(p.weights) == len(p.tokens) and abs(sum(p.weights) - 1) < 1e-5
