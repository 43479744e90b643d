"""Padding, teacher-forcing collation, and the deterministic length-bucketing sampler."""

import random

import pytest
import torch
from torch.utils.data import DataLoader

from qkv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    BucketBatchSampler,
    CharTokenizer,
    EncodedPairs,
    PairCollator,
    collate_pairs,
    make_dates,
    pad_sequences,
    teacher_forcing,
)


def test_pad_sequences_shapes_and_mask():
    ids, lengths, mask = pad_sequences([[5, 6, 7], [8], []], pad_id=PAD_ID)
    assert ids.shape == mask.shape == (3, 3) and ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert lengths.tolist() == [3, 1, 0]
    assert mask.tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    assert pad_sequences([[1]], pad_id=9, min_len=3)[0].tolist() == [[1, 9, 9]]
    empty, el, em = pad_sequences([])
    assert empty.shape == (0, 0) and el.shape == (0,) and em.shape == (0, 0)


def test_teacher_forcing():
    assert teacher_forcing([7, 8]) == ([BOS_ID, 7, 8], [7, 8, EOS_ID])
    assert teacher_forcing([]) == ([BOS_ID], [EOS_ID])


def test_collate_pairs_teacher_forcing_and_padding():
    b = collate_pairs([([4, 5, 6], [7]), ([4], [8, 9, 10])])
    assert b.src.shape == b.src_mask.shape == (2, 3)
    assert b.tgt_in.shape == b.tgt_out.shape == b.tgt_mask.shape == (2, 4)
    assert b.tgt_in.tolist() == [[BOS_ID, 7, PAD_ID, PAD_ID], [BOS_ID, 8, 9, 10]]
    assert b.tgt_out.tolist() == [[7, EOS_ID, PAD_ID, PAD_ID], [8, 9, 10, EOS_ID]]
    assert b.tgt_lengths.tolist() == [2, 4] and b.src_lengths.tolist() == [3, 1]
    assert b.tgt_mask.sum().item() == b.n_tgt_tokens == 6
    assert torch.equal(b.tgt_mask, b.tgt_out != PAD_ID)
    # tgt_out is tgt_in shifted left by one at every real position
    assert torch.equal(b.tgt_in[:, 1:][b.tgt_mask[:, 1:]], b.tgt_out[:, :-1][b.tgt_mask[:, 1:]])
    s = collate_pairs([([4], [7])], src_bos=True, src_eos=True)
    assert s.src.tolist() == [[BOS_ID, 4, EOS_ID]]
    assert len(b.to("cpu")) == 2


def test_dataloader_over_encoded_dates():
    pairs = make_dates(300, seed=2, locales=["en", "zh", "ru"])
    src_tok = CharTokenizer.train(s for s, _ in pairs)
    tgt_tok = CharTokenizer.train("0123456789-")
    data = EncodedPairs(pairs, src_tok, tgt_tok)
    assert data.lengths == [max(len(s), 11) for s, _ in pairs]
    sampler = BucketBatchSampler(data.lengths, batch_size=32, seed=0)
    seen = []
    for batch in DataLoader(data, batch_sampler=sampler, collate_fn=PairCollator()):
        assert batch.src.shape[0] <= 32 and batch.tgt_in.shape == (batch.src.shape[0], 11)
        for row, i in enumerate(batch.index.tolist()):
            n = int(batch.src_lengths[row])
            assert src_tok.decode(batch.src[row, :n].tolist()) == pairs[i][0]
            assert tgt_tok.decode(batch.tgt_out[row].tolist()) == pairs[i][1]
            assert not batch.src_mask[row, n:].any() and batch.src_mask[row, :n].all()
        seen += batch.index.tolist()
    assert sorted(seen) == list(range(300))


def _lengths(n=1000, seed=0):
    rng = random.Random(seed)
    return [rng.randint(1, 60) for _ in range(n)]


def test_bucket_sampler_covers_everything_and_buckets():
    lengths = _lengths()
    s = BucketBatchSampler(lengths, batch_size=20, seed=1)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert len(s) == len(batches) and all(len(b) <= 20 for b in batches)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    rng = random.Random(0)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    unbucketed = sum(20 * max(lengths[i] for i in order[k: k + 20]) for k in range(0, len(order), 20))
    assert padded < 0.8 * unbucketed  # bucketing removes most of the padding


def test_bucket_sampler_deterministic_from_seed_and_epoch():
    lengths = _lengths()
    a, b = BucketBatchSampler(lengths, batch_size=16, seed=3), BucketBatchSampler(lengths, batch_size=16, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(BucketBatchSampler(lengths, batch_size=16, seed=4)) != first
    fixed = list(BucketBatchSampler(lengths, batch_size=16, shuffle=False))
    flat = [lengths[i] for bt in fixed for i in bt]
    assert flat == sorted(flat)


def test_bucket_sampler_max_tokens_and_drop_last():
    lengths = _lengths()
    s = BucketBatchSampler(lengths, max_tokens=300, seed=0)
    for b in s:
        assert len(b) * max(lengths[i] for i in b) <= 300 or len(b) == 1
    assert sorted(i for b in s for i in b) == list(range(len(lengths)))
    d = BucketBatchSampler(lengths, batch_size=64, drop_last=True)
    assert all(len(b) == 64 for b in d)
    with pytest.raises(ValueError):
        BucketBatchSampler(lengths)


def test_bucket_sampler_replicas_share_one_order():
    lengths = _lengths(103)
    whole = BucketBatchSampler(lengths, batch_size=10, seed=5).batches()
    assert len(whole) % 2 == 1  # odd: the order wraps around so both ranks get as many batches
    ranks = [list(BucketBatchSampler(lengths, batch_size=10, seed=5, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(BucketBatchSampler(lengths, batch_size=10, num_replicas=2))
    assert ranks[0] == whole[0::2] and ranks[1] == whole[1::2] + whole[:1]
    with pytest.raises(ValueError):
        BucketBatchSampler(lengths, batch_size=10, num_replicas=2, rank=2)


def test_readme_example(tmp_path):
    # the example of the README's "Data" section
    from qkv.data import date_corpus, load_tokenizer

    corpus = date_corpus(n_train=2000, n_valid=100, n_test=100, seed=0)
    src_tok = CharTokenizer.train(s for s, _ in corpus.train)
    tgt_tok = CharTokenizer.train(t for _, t in corpus.train)
    data = EncodedPairs(corpus.train, src_tok, tgt_tok)
    sampler = BucketBatchSampler(data.lengths, batch_size=64, seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=PairCollator())
    sampler.set_epoch(0)
    batch = next(iter(loader))
    assert batch.src.shape == batch.src_mask.shape and batch.tgt_in.shape == (len(batch), 11)
    assert batch.tgt_in[0, 0] == tgt_tok.bos_id and batch.tgt_out[0, -1] == tgt_tok.eos_id
    src_tok.save(tmp_path / "src")
    assert load_tokenizer(tmp_path / "src") == src_tok
