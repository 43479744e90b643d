"""Text classifiers: pooled weights (sum to 1 on tokens, 0 on padding), padding invariance, a planted-word task
that every model must learn with its attention on the planted word, word vectors, bad input."""

import gzip
import random

import pytest
import torch
import torch.nn.functional as F

from qkv.layers.pooling import AttentionPooling
from qkv.models.classifiers import (
    ClassifierOutput,
    RNNClassifier,
    TransformerClassifier,
    create_classifier,
    load_word_vectors,
)

VOCAB = 41
CONFIGS = {
    "bigru": ("bigru", {"embed_dim": 16, "hidden_dim": 32}),
    "bilstm-3hops": ("bilstm", {"embed_dim": 16, "hidden_dim": 32, "hops": 3, "mlp_dim": 8}),
    "transformer-cls": ("transformer", {"dim": 16, "num_heads": 2, "num_layers": 2}),
    "transformer-pool-2hops": ("transformer", {"dim": 16, "num_heads": 2, "num_layers": 1, "pooling": "attention",
                                               "hops": 2}),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


def build(name, num_classes=2, **kw):
    kind, cfg = CONFIGS[name]
    torch.manual_seed(0)
    return create_classifier(kind, VOCAB, num_classes, **{**cfg, **kw})


def batch(gen, lengths, t=None):
    t = t or max(lengths)
    ids = torch.randint(4, VOCAB, (len(lengths), t), generator=gen)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("name", CONFIGS)
def test_weights_sum_to_one_on_tokens_and_zero_on_padding(name, gen):
    model = build(name).eval()
    ids, mask = batch(gen, [7, 3, 1, 5])
    out = model(ids, mask)
    assert isinstance(out, ClassifierOutput)
    assert out.logits.shape == (4, 2)
    w = out.weights if out.weights.dim() == 3 else out.weights[:, None]
    assert w.shape[0] == 4 and w.shape[-1] == 7
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    assert (w.masked_select(~mask[:, None].expand_as(w)) == 0).all()
    assert (w >= 0).all()


@pytest.mark.parametrize("name", CONFIGS)
def test_padding_does_not_change_the_prediction(name, gen):
    model = build(name).eval()
    ids, mask = batch(gen, [6, 2, 4])
    ref = model(ids, mask)
    padded_ids = torch.cat([ids, torch.zeros(3, 5, dtype=torch.long)], 1)
    padded_mask = torch.cat([mask, torch.zeros(3, 5, dtype=torch.bool)], 1)
    out = model(padded_ids, padded_mask)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights[..., :6], ref.weights, atol=1e-5, rtol=1e-5)
    # alone, without the other rows' padding
    alone = model(ids[1:2, :2], mask[1:2, :2])
    torch.testing.assert_close(alone.logits, ref.logits[1:2], atol=1e-5, rtol=1e-5)
    # whatever the padded ids hold
    noisy = model(torch.where(mask, ids, torch.randint(4, VOCAB, ids.shape, generator=gen)), mask)
    torch.testing.assert_close(noisy.logits, ref.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", CONFIGS)
def test_all_padding_row_is_finite(name):
    model = build(name)
    ids = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    out = model(ids, mask)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.weights).all()
    assert (out.weights[1] == 0).all()
    out.logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def planted(n, seed):
    """Sentences of random filler words (ids 6..40) with one planted word, id 4 (label 0) or 5 (label 1)."""
    rng = random.Random(seed)
    examples, where = [], []
    for _ in range(n):
        length = rng.randint(4, 12)
        tokens = [rng.randint(6, VOCAB - 1) for _ in range(length)]
        y, p = rng.randint(0, 1), rng.randrange(length)
        tokens[p] = 4 + y
        examples.append((tokens, y))
        where.append(p)
    return examples, torch.tensor(where)


def collate(examples):
    from qkv.data.batching import pad_sequences

    ids, _, mask = pad_sequences([x for x, _ in examples])
    return ids, mask, torch.tensor([y for _, y in examples])


# One Transformer layer: with more, self-attention copies the planted word into every position first, and the
# last layer's query may read it anywhere (the prediction stays right, the picture is then less telling).
@pytest.mark.parametrize("name,kw,min_weight", [("bigru", {}, 0.5), ("bilstm-3hops", {}, 0.5),
                                                ("transformer-cls", {"num_layers": 1}, 0.4)])
@pytest.mark.slow
def test_learns_the_planted_word_and_attends_to_it(name, kw, min_weight):
    train, _ = planted(512, 0)
    test, where = planted(200, 1)
    model = build(name, dropout=0.0, embed_dropout=0.0, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(120):
        ids, mask, y = collate(random.Random(step).sample(train, 32))
        out = model(ids, mask)
        loss = F.cross_entropy(out.logits, y)
        if out.weights.dim() == 3:
            loss = loss + 0.01 * AttentionPooling.penalty(out.weights).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    ids, mask, y = collate(test)
    with torch.no_grad():
        out = model(ids, mask)
    w = out.weights if out.weights.dim() == 3 else out.weights[:, None]  # (B, R, T)
    assert (out.logits.argmax(-1) == y).float().mean() > 0.97
    # the weights shown (averaged over hops) peak on the planted word; the hop that looks at it most (the
    # penalty spreads the other hops elsewhere) gives it most of its weight
    assert (w.mean(1).argmax(-1) == where).float().mean() > 0.9
    on_word = w[torch.arange(len(where)), :, where].amax(-1)
    assert on_word.mean() > min_weight


def test_regression_has_one_output(gen):
    model = build("bigru", num_classes=1)
    ids, mask = batch(gen, [3, 5])
    assert model(ids, mask).logits.shape == (2, 1)


def test_sizes_follow_the_vocabulary():
    """hidden_dim is the RNN's output with both directions; attn_dim defaults to half of it; cell picks the RNN."""
    gru = create_classifier("bigru", VOCAB, 3, embed_dim=8, hidden_dim=12)
    assert isinstance(gru.rnn, torch.nn.GRU) and gru.rnn.hidden_size == 6 and gru.rnn.bidirectional
    assert gru.pool.key_proj.in_features == 12 and gru.pool.key_proj.out_features == 6
    assert gru.head[-1].in_features == 12
    lstm = create_classifier("bilstm", VOCAB, 3, hidden_dim=12, attn_dim=5, hops=2)
    assert isinstance(lstm.rnn, torch.nn.LSTM) and lstm.pool.key_proj.out_features == 5
    assert lstm.head[-1].in_features == 24
    tr = TransformerClassifier(VOCAB, 3, dim=16, num_heads=2, num_layers=1, ffn_dim=24)
    assert tr.layers[0].ffn.fc1.out_features == 24 and isinstance(tr.layers[0].ffn.act, torch.nn.GELU)
    assert isinstance(TransformerClassifier(VOCAB, 3, dim=16, activation="relu").layers[0].ffn.act, torch.nn.ReLU)


def test_mask_defaults_to_all_tokens(gen):
    model = build("transformer-cls").eval()
    ids, mask = batch(gen, [4, 4])
    torch.testing.assert_close(model(ids).logits, model(ids, mask).logits)


def test_bad_inputs_raise():
    model = build("bigru")
    with pytest.raises(ValueError, match="ids must be"):
        model(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown classifier"):
        create_classifier("cnn", 10, 2)
    with pytest.raises(ValueError, match="cell"):
        RNNClassifier(10, 2, cell="elman")
    with pytest.raises(ValueError, match="hidden_dim"):
        RNNClassifier(10, 2, hidden_dim=7)
    with pytest.raises(ValueError, match="pooling"):
        TransformerClassifier(10, 2, pooling="mean")
    with pytest.raises(ValueError, match="hops"):
        TransformerClassifier(10, 2, dim=8, num_heads=2, hops=2)
    with pytest.raises(ValueError, match="pretrained"):
        RNNClassifier(10, 2, pretrained=torch.zeros(9, 4))


@pytest.mark.parametrize("header,compress", [(False, False), (True, True)])
def test_load_word_vectors(tmp_path, header, compress):
    lines = ["good 1 2 3", "Film 4 5 6", "film 7 8 9", "Bad -1 -2 -3", "unused 0 0 1"]
    text = ("5 3\n" if header else "") + "\n".join(lines) + "\n"
    path = tmp_path / ("vec.txt.gz" if compress else "vec.txt")
    if compress:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", "good", "film", "bad", "missing"]
    vectors, found = load_word_vectors(path, vocab)
    assert vectors.shape == (8, 3) and found == 3
    assert vectors[0].abs().sum() == 0
    torch.testing.assert_close(vectors[4], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(vectors[5], torch.tensor([7.0, 8.0, 9.0]))  # the exact form beats "Film"
    torch.testing.assert_close(vectors[6], torch.tensor([-1.0, -2.0, -3.0]))  # lower-case fallback
    assert vectors[7].abs().sum() > 0  # random, not zero
    model = RNNClassifier(8, 2, hidden_dim=8, pretrained=vectors, freeze_embeddings=True)
    torch.testing.assert_close(model.embedding.weight, vectors)
    assert not model.embedding.weight.requires_grad


def test_load_word_vectors_rejects_ragged_rows(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a 1 2 3\nb 1 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.txt:2: 2 numbers, expected 3"):
        load_word_vectors(path, ["<pad>", "a", "b"])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_load_word_vectors_refuses_non_finite_vectors(tmp_path, value):
    path = tmp_path / "v.txt"
    path.write_text(f"a 1 2 3\nb 1 {value} 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"v\.txt:2: the vector of 'b' holds nan or inf"):
        load_word_vectors(path, ["<pad>", "a", "b"])
    path.write_bytes(b"a 1 2 3\nb \xff 2 3\n")
    with pytest.raises(ValueError, match=r"v\.txt:2: not UTF-8"):
        load_word_vectors(path, ["<pad>", "a", "b"])
