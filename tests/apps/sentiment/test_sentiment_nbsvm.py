"""The NBSVM path (a naive-Bayes-weighted bag of words and hashed bigrams added to a classifier's logits): its logits
against a plain float64 loop, padding invisible, every classifier's output the same model without it plus the path,
the ratios from the training split only, `qkv train sentiment --nbsvm` end to end, and the errors."""

import json
import random

import pytest
import torch

from qkv.apps.sentiment import SentimentClassifier, SentimentOptions, SentimentTask, model_spec
from qkv.cli import main
from qkv.models import BigramAttentionClassifier, NBSVMLogits, RNNClassifier, TransformerClassifier
from qkv.models.classifiers import bigram_ids, log_count_ratios
from tests.helpers import write_reviews

pytestmark = pytest.mark.usefixtures("one_thread")


def path_by_loop(path: NBSVMLogits, ids: list[int]) -> torch.Tensor:
    """The documented sum, one position at a time in float64: bias + r_w u over words + r_b v over bigrams."""
    out = path.bias.double().clone()
    t = torch.tensor([ids])
    b = bigram_ids(t, torch.ones_like(t, dtype=torch.bool), path.buckets)[0].tolist()
    for w, h in zip(ids, b, strict=True):
        out += path.word_ratios[w].double() * path.words[w].double()
        if h:
            out += path.bigram_ratios[h].double() * path.bigrams[h].double()
    return out


def fitted_path(seed: int, vocab: int = 40, classes: int = 3, buckets: int = 23) -> tuple[NBSVMLogits, list]:
    rng = random.Random(seed)
    texts = [[rng.randrange(1, vocab) for _ in range(rng.randrange(1, 9))] for _ in range(80)]
    examples = [(t, rng.randrange(classes)) for t in texts]
    path = NBSVMLogits(vocab, classes, buckets)
    path.fit(examples)
    with torch.no_grad():
        for p in path.parameters():
            p.normal_(generator=torch.Generator().manual_seed(seed))
    return path, examples


def test_the_path_is_the_documented_sum_and_padding_is_invisible():
    for seed in range(3):
        path, examples = fitted_path(seed)
        ids = [examples[i][0] for i in range(6)]
        n = max(map(len, ids))
        batch = torch.tensor([x + [0] * (n - len(x)) for x in ids])
        mask = batch != 0
        got = path(batch, mask)
        for i, x in enumerate(ids):
            assert torch.allclose(got[i].double(), path_by_loop(path, x), atol=1e-5)
        wider = torch.cat([batch, torch.randint(1, 40, (len(ids), 4))], 1)  # junk where the mask is False
        assert torch.allclose(path(wider, torch.cat([mask, torch.zeros(len(ids), 4, dtype=torch.bool)], 1)), got)
        per = path.contributions(batch, mask)
        assert torch.allclose(per.sum(1) + path.bias, got, atol=1e-6) and bool((per[~mask] == 0).all())


def test_fit_reads_the_log_count_ratios_and_an_unfitted_path_gives_its_bias():
    path, examples = fitted_path(1)
    r_words, r_bigrams = log_count_ratios(examples, 3, 40, 23)
    assert torch.equal(path.word_ratios, r_words) and torch.equal(path.bigram_ratios, r_bigrams)
    # a word every text of class 0 holds and no other text: the largest ratio of class 0
    examples = [([5, 7], 0), ([5, 9], 0), ([6, 7], 1), ([8, 9], 1)]
    r_words, _ = log_count_ratios(examples, 2, 10, 7)
    assert r_words[5, 0] > 0 > r_words[5, 1] and int(r_words[:, 0].argmax()) == 5 and float(r_words[7, 0]) == 0.0
    fresh = NBSVMLogits(10, 2, 7)
    with torch.no_grad():
        fresh.bias.copy_(torch.tensor([0.3, -0.2]))
        fresh.words.fill_(1.0)
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(fresh(ids, ids > 0), torch.tensor([[0.3, -0.2]]))  # ratios 0 until fitted
    with pytest.raises(ValueError, match="label 4 is not a class"):
        log_count_ratios([([1, 2], 4)], 2, 10, 7)
    with pytest.raises(ValueError, match="needs classes"):
        NBSVMLogits(10, 1, 7)
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        NBSVMLogits(10, 2, 0)


@pytest.mark.parametrize("cls, kw", [(RNNClassifier, {"hidden_dim": 8, "embed_dim": 8}),
                                     (RNNClassifier, {"hidden_dim": 8, "embed_dim": 8, "cell": "lstm", "hops": 2}),
                                     (TransformerClassifier, {"dim": 8, "num_heads": 2, "num_layers": 1}),
                                     (TransformerClassifier, {"dim": 8, "num_heads": 2, "pooling": "attention"}),
                                     (BigramAttentionClassifier, {"embed_dim": 8, "buckets": 31})])
def test_every_classifier_adds_the_path_to_its_own_logits(cls, kw):
    torch.manual_seed(0)
    plain = cls(50, 3, **kw).eval()
    with_path = cls(50, 3, nbsvm=29, **kw).eval()
    missing, unexpected = with_path.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("nbsvm.") for k in missing)
    path, _ = fitted_path(2, vocab=50, buckets=29)
    with_path.nbsvm.load_state_dict(path.state_dict())
    ids = torch.randint(1, 50, (4, 7))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 4:] = False
    ids[1, 4:] = 0
    a, b = plain(ids, mask), with_path(ids, mask)
    assert torch.allclose(b.logits, a.logits + path(ids, mask), atol=1e-5)
    assert torch.equal(a.weights, b.weights)  # the attention is the model's own
    b.logits.sum().backward()
    assert with_path.nbsvm.words.grad is not None and with_path.nbsvm.words.grad[0].abs().sum() == 0
    assert plain(ids, mask).logits.shape == (4, 3)
    with pytest.raises(ValueError, match="nbsvm must be >= 0"):
        cls(50, 3, nbsvm=-1, **kw)


def test_the_task_fits_the_ratios_on_the_training_split_only(tmp_path):
    data = write_reviews(tmp_path / "reviews.tsv")
    opts = SentimentOptions(data=str(data), nbsvm=True, nbsvm_buckets=101, embed_dim=8, hidden_dim=8)
    assert model_spec(opts, vocab_size=30, num_classes=2)["config"]["nbsvm"] == 101
    assert "nbsvm" not in model_spec(SentimentOptions(data=str(data)), vocab_size=30, num_classes=2)["config"]
    task = SentimentTask(opts)
    task.setup()
    model = task.build_model()
    r_words, r_bigrams = log_count_ratios(task.encoded["train"], 2, task.tokenizer.vocab_size, 101)
    assert torch.equal(model.nbsvm.word_ratios, r_words) and torch.equal(model.nbsvm.bigram_ratios, r_bigrams)
    assert float(model.nbsvm.word_ratios.abs().sum()) > 0


def test_train_with_nbsvm_then_classify(tmp_path, capsys):
    data = write_reviews(tmp_path / "reviews.tsv")
    run = tmp_path / "run"
    assert main(["train", "sentiment", "--data", str(data), "--out", str(run), "--epochs", "3", "--nbsvm",
                 "--nbsvm-buckets", "500", "--embed-dim", "8", "--hidden-dim", "8", "--batch-size", "16"]) == 0
    capsys.readouterr()
    clf = SentimentClassifier.load(run)
    assert clf.model.nbsvm is not None and float(clf.model.nbsvm.word_ratios.abs().sum()) > 0  # saved, read back
    text = "a wonderful , moving film"
    pred = clf.predict([text])[0]
    ids = clf.tokenizer.encode(text)
    t = torch.tensor([ids])
    with torch.no_grad():
        per = clf.model.nbsvm.contributions(t, torch.ones_like(t, dtype=torch.bool))[0]
    k = clf.label_names.index(pred.label)
    assert pred.ngram_scores == pytest.approx((per[:, k] - per.mean(-1)).tolist(), abs=1e-6)
    assert len(pred.ngram_scores) == len(pred.tokens)
    assert main(["classify", str(run), text, "--json", str(tmp_path / "out.json")]) == 0
    written = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    row = written[0] if isinstance(written, list) else written["results"][0]
    assert row["ngram_scores"] == pytest.approx(pred.ngram_scores, abs=1e-6)
    assert main(["view", str(run), text, "--out", str(tmp_path / "page.html")]) == 0
    assert "NBSVM" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_nbsvm_errors(tmp_path, capsys):
    data = write_reviews(tmp_path / "reviews.tsv")
    with pytest.raises(ValueError, match="nbsvm does not apply to regression"):
        SentimentOptions(data=str(data), nbsvm=True, regression=True)
    with pytest.raises(ValueError, match="nbsvm_buckets goes with nbsvm"):
        SentimentOptions(data=str(data), nbsvm_buckets=10)
    assert main(["train", "sentiment", "--data", str(data), "--nbsvm", "--regression"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and "--nbsvm" in err and "\n" not in err
    assert main(["train", "sentiment", "--data", str(data), "--nbsvm", "--nbsvm-buckets", "0"]) == 2
    assert "--nbsvm-buckets" in capsys.readouterr().err
