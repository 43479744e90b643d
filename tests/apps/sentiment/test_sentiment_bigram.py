"""The bigram attention classifier (word + hashed bigram vectors, attention pooling) and the bigram option of the
RNNs: the bucket ids against a plain Python loop, padding invisible to the logits, weights that sum to one over the
real words, its options in `qkv train sentiment`, and the errors."""

import json
import math
import random

import pytest
import torch

from qkv.apps.base import model_from_spec
from qkv.apps.sentiment import SentimentClassifier, SentimentOptions, model_spec
from qkv.apps.sentiment.count_init import count_init
from qkv.apps.sentiment.task import BIGRAM_BUCKETS
from qkv.cli import main
from qkv.models import BigramAttentionClassifier, RNNClassifier, create
from qkv.models.classifiers import bigram_ids
from tests.helpers import write_reviews

pytestmark = pytest.mark.usefixtures("one_thread")


def bigram_ids_by_loop(ids: list[list[int]], lengths: list[int], buckets: int) -> list[list[int]]:
    """The documented hash, one pair at a time in Python integers."""
    out = []
    for row, n in zip(ids, lengths, strict=True):
        got = []
        for t in range(len(row)):
            if t + 1 < n:
                x = (row[t] * 1_000_003 + row[t + 1]) % 2 ** 31
                x = ((x ^ (x >> 13)) * 1_274_126_177) % 2 ** 31
                got.append(x % buckets + 1)
            else:
                got.append(0)
        out.append(got)
    return out


def random_batch(gen, b=5, t=9, vocab=200_000):
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    ids = torch.randint(1, vocab, (b, t), generator=gen) * mask
    return ids, mask, lengths


@pytest.mark.parametrize("buckets", [1, 7, 1000, 2 ** 20])
def test_bigram_ids_are_the_python_loop(buckets):
    gen = torch.Generator().manual_seed(buckets)
    ids, mask, lengths = random_batch(gen, b=8, t=12, vocab=2 ** 31 - 1)
    got = bigram_ids(ids, mask, buckets)
    assert got.tolist() == bigram_ids_by_loop(ids.tolist(), lengths.tolist(), buckets)
    assert int(got.max()) <= buckets and bool((got[~mask] == 0).all())
    # the same pair gets the same bucket wherever it stands; a repeated pair in one text too
    pair = torch.tensor([[5, 9, 4, 5, 9]])
    row = bigram_ids(pair, torch.ones_like(pair, dtype=torch.bool), buckets)[0]
    assert row[0] == row[3] and row[4] == 0


def test_bigram_ids_spread_over_the_buckets():
    a, b = torch.meshgrid(torch.arange(1, 201), torch.arange(1, 201), indexing="ij")
    pairs = torch.stack([a.flatten(), b.flatten()], 1)
    got = bigram_ids(pairs, torch.ones_like(pairs, dtype=torch.bool), 1000)[:, 0]
    counts = torch.bincount(got, minlength=1001)[1:].float()
    assert counts.min() > 0 and counts.max() < 3 * counts.mean()  # 40,000 pairs, 1,000 buckets: no pile-up


@pytest.mark.parametrize("make", [
    lambda: BigramAttentionClassifier(60, 3, embed_dim=8, buckets=40, hidden_dim=6, mlp_dim=5),
    lambda: BigramAttentionClassifier(60, 2, embed_dim=8, buckets=40, hops=3),
    lambda: BigramAttentionClassifier(60, 1, embed_dim=8, buckets=0),
    lambda: RNNClassifier(60, 2, embed_dim=8, hidden_dim=10, buckets=40),
], ids=["hidden-mlp", "hops", "words-only", "bigru-bigrams"])
def test_padding_never_changes_the_logits(make):
    torch.manual_seed(0)
    model = make().eval()
    gen = torch.Generator().manual_seed(1)
    ids, mask, lengths = random_batch(gen, b=6, t=10, vocab=60)
    with torch.no_grad():
        out = model(ids, mask)
        weights = out.weights if out.weights.dim() == 3 else out.weights[:, None]
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2]), atol=1e-6)
        assert bool((weights.transpose(0, 1)[:, ~mask] == 0).all())
        for i, n in enumerate(lengths.tolist()):
            alone = model(ids[i:i + 1, :n], mask[i:i + 1, :n])
            assert torch.allclose(alone.logits, out.logits[i:i + 1], atol=1e-5)
            assert torch.allclose(alone.weights[0], out.weights[i][..., :n], atol=1e-6)
            # junk ids under the padding change nothing either
            junk = ids[i:i + 1].clone()
            junk[0, n:] = 7
            assert torch.allclose(model(junk, mask[i:i + 1]).logits, out.logits[i:i + 1], atol=1e-5)


def test_the_bigram_vectors_are_added_to_the_words():
    model = BigramAttentionClassifier(20, 2, embed_dim=4, buckets=30, embed_dropout=0.0).eval()
    ids = torch.tensor([[3, 4, 5]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    x = model.embedding(ids) + model.bigrams(bigram_ids(ids, mask, 30))
    pooled, weights = model.pool(x, mask)
    with torch.no_grad():
        out = model(ids, mask)
        assert torch.allclose(out.logits, model.head(pooled), atol=1e-6)
        assert torch.allclose(out.weights, weights)
        # a bigram's vector moves its first word's score and no other bigram's
        before = model(ids).weights
        model.bigrams.weight[bigram_ids(ids, mask, 30)[0, 0]] += 1.0
        assert not torch.allclose(model(ids).weights, before)
    assert model.bigrams.weight.shape == (31, 4)


@pytest.mark.parametrize("kwargs, match", [
    ({"buckets": -1}, "buckets must be >= 0"),
    ({"num_classes": 0}, "num_classes must be >= 1"),
])
def test_bad_model_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BigramAttentionClassifier(**{"vocab_size": 10, "num_classes": 2, **kwargs})
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        bigram_ids(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "bigram", "num_layers": 2}, "num_layers=2: the bigram model"),
    ({"model": "transformer", "buckets": 10}, "buckets"),
    ({"model": "bigru", "bigram_hidden": 10}, "bigram_hidden"),
    ({"model": "bigram", "buckets": -1}, "buckets"),
])
def test_bad_options_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        SentimentOptions(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options, buckets", [
    (SentimentOptions(model="bigram", embed_dim=8, bigram_hidden=6, attn_dim=5, hops=2), BIGRAM_BUCKETS),
    (SentimentOptions(model="bigram", embed_dim=8, buckets=0), 0),
    (SentimentOptions(model="bigru", embed_dim=8, hidden_dim=10, buckets=33), 33),
], ids=["bigram", "words-only", "bigru-bigrams"])
def test_the_spec_builds_the_model(options, buckets):
    spec = model_spec(options, vocab_size=40, num_classes=2)
    assert json.loads(json.dumps(spec)) == spec and spec["name"] == f"{options.model}-classifier"
    model, again = model_from_spec(spec), create(spec["name"], **spec["config"])
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in again.state_dict().items()}
    assert model.buckets == buckets and (model.bigrams is None) == (buckets == 0)


def test_train_and_classify_with_the_bigram_model(tmp_path, capsys):
    reviews = write_reviews(tmp_path / "reviews.tsv", n=300)
    run = tmp_path / "run"
    assert main(["train", "sentiment", "--data", str(reviews), "--out", str(run), "--model", "bigram",
                 "--embed-dim", "16", "--buckets", "500", "--epochs", "8", "--count-init", "--batch-size", "16",
                 "--lr", "0.01",
                 "--dropout", "0", "--embed-dropout", "0", "--no-progress"]) == 0
    clf = SentimentClassifier.load(run)
    assert clf.config["model"]["name"] == "bigram-classifier" and clf.config["model"]["config"]["buckets"] == 500
    text = "the wonderful film"
    (p,) = clf.predict([text])
    ids = torch.tensor([clf.tokenizer.encode(text)])
    with torch.no_grad():
        out = clf.model(ids)
    assert p.weights == pytest.approx(out.weights[0].tolist(), abs=1e-5) and sum(p.weights) == pytest.approx(1)
    out = capsys.readouterr().out
    assert float(out.split("test: accuracy ")[1].split(",")[0]) >= 0.9  # the words decide these labels


def test_word_dropout_leaves_words_out_in_training_only():
    torch.manual_seed(0)
    model = BigramAttentionClassifier(60, 2, embed_dim=8, buckets=40, word_dropout=0.5)
    gen = torch.Generator().manual_seed(3)
    ids, mask, _ = random_batch(gen, b=64, t=10, vocab=60)
    weights = model(ids, mask).weights.detach()
    assert torch.allclose(weights.sum(-1), torch.ones(64), atol=1e-6) and bool((weights[~mask] == 0).all())
    dropped = (weights == 0) & mask
    assert 0.3 < dropped.sum() / mask.sum() < 0.6  # about half the words, never the first
    assert bool((weights[:, 0] > 0).all())
    model.eval()
    assert bool((model(ids, mask).weights[mask] > 0).all())
    with pytest.raises(ValueError, match="word_dropout must be in"):
        BigramAttentionClassifier(10, 2, word_dropout=1.0)


def ratios_by_hand(texts, labels, num_classes, rows, alpha=1.0):
    """NBSVM's log-count ratios of every class against the rest, from sets of ids, in Python floats."""
    counts = [[0.0] * num_classes for _ in range(rows)]
    for ids, y in zip(texts, labels, strict=True):
        for i in set(ids):
            counts[i][y] += 1
    out = []
    for c in range(num_classes):
        p = [row[c] + alpha for row in counts]
        q = [sum(row) - row[c] + alpha for row in counts]
        out.append([0.0 if sum(counts[i]) == 0 else math.log(p[i] / sum(p)) - math.log(q[i] / sum(q))
                    for i in range(rows)])
    return torch.tensor(out, dtype=torch.float64).T


def test_count_init_is_the_log_count_ratios():
    rng = random.Random(0)
    texts = [[rng.randrange(1, 25) for _ in range(rng.randrange(1, 8))] for _ in range(60)]
    labels = [rng.randrange(3) for _ in texts]
    model = BigramAttentionClassifier(30, 3, embed_dim=6, buckets=17)
    count_init(model, list(zip(texts, labels, strict=True)), 3)
    assert torch.allclose(model.embedding.weight[:, :3].double(), ratios_by_hand(texts, labels, 3, 30), atol=1e-5)
    pairs = [[int(b) for b in bigram_ids(torch.tensor([t]), torch.ones(1, len(t), dtype=torch.bool), 17)[0]
              if b > 0] for t in texts]
    assert torch.allclose(model.bigrams.weight[:, :3].double(), ratios_by_hand(pairs, labels, 3, 18), atol=1e-5)
    assert torch.equal(model.head[-1].weight[:, :3], torch.eye(3))
    assert bool((model.embedding.weight[0] == 0).all())  # padding stays zero
    with pytest.raises(ValueError, match="without bigram_hidden"):
        count_init(BigramAttentionClassifier(30, 3, embed_dim=6, hidden_dim=4), [], 3)
    with pytest.raises(ValueError, match="count_init needs the bigram model"):
        SentimentOptions(model="bigram", count_init=True, hops=2)
