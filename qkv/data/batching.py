"""Padding, collation and length bucketing for sequence pairs.

Axis letters: ``B`` batch, ``S`` source length, ``T`` target length (with the added ``<bos>``/``<eos>``).
Masks are boolean and **True at real tokens** (the project's convention: True where attention is allowed).

Teacher forcing: for a target ``y``, the decoder reads ``tgt_in = [<bos>] + y`` and is trained to predict
``tgt_out = y + [<eos>]``; both have length ``len(y) + 1``.

Example::

    data = EncodedPairs(corpus.train, src_tok, tgt_tok)
    sampler = BucketBatchSampler(data.lengths, batch_size=64, seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=PairCollator())
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in loader:                  # Batch(src (B, S), src_mask (B, S), tgt_in (B, T), ...)
            ...
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch
from torch.utils.data import Dataset, Sampler

from .tokenize import BOS_ID, EOS_ID, PAD_ID, Tokenizer


def pad_sequences(
    seqs: Sequence[Sequence[int]],
    pad_id: int = PAD_ID,
    *,
    min_len: int = 0,
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad integer sequences into ``ids (B, T)``, ``lengths (B,)`` and ``mask (B, T)`` (True = token).

    ``T`` is the longest sequence (at least ``min_len``); an empty batch gives ``(0, min_len)`` tensors.
    """
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    t = max(int(lengths.max()) if len(seqs) else 0, min_len)
    ids = torch.full((len(seqs), t), pad_id, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=dtype)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return ids, lengths, mask


def teacher_forcing(y: Sequence[int], bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> tuple[list[int], list[int]]:
    """``([<bos>] + y, y + [<eos>])``: the decoder's input and its target."""
    y = list(y)
    return [bos_id, *y], [*y, eos_id]


@dataclass
class Batch:
    """A padded batch of sequence pairs.

    Attributes:
        src: ``(B, S)`` source ids, right-padded with ``pad_id``.
        src_mask: ``(B, S)`` bool, True at real tokens.
        src_lengths: ``(B,)`` number of real source tokens.
        tgt_in: ``(B, T)`` decoder inputs ``[<bos>] + y``, padded.
        tgt_out: ``(B, T)`` decoder targets ``y + [<eos>]``, padded with ``pad_id`` (use it as ignore_index).
        tgt_mask: ``(B, T)`` bool, True where ``tgt_in``/``tgt_out`` are real.
        tgt_lengths: ``(B,)`` ``len(y) + 1``.
        index: ``(B,)`` dataset index of each row (to put outputs back in corpus order).
    """

    src: torch.Tensor
    src_mask: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor
    tgt_lengths: torch.Tensor
    index: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def pin_memory(self) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})

    def __len__(self) -> int:
        return self.src.shape[0]

    @property
    def n_tgt_tokens(self) -> int:
        """Number of target tokens predicted (``<eos>`` included): the denominator of a per-token loss."""
        return int(self.tgt_lengths.sum())


def collate_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    src_bos: bool = False,
    src_eos: bool = False,
    index: Sequence[int] | None = None,
) -> Batch:
    """Pad ``(source ids, target ids)`` pairs (without special tokens) into a :class:`Batch`.

    ``src_bos``/``src_eos`` add ``<bos>``/``<eos>`` around the source too (some encoders like an end marker).
    """
    srcs, tgt_ins, tgt_outs = [], [], []
    for src, tgt in pairs:
        src = list(src)
        srcs.append(([bos_id] if src_bos else []) + src + ([eos_id] if src_eos else []))
        tin, tout = teacher_forcing(tgt, bos_id, eos_id)
        tgt_ins.append(tin)
        tgt_outs.append(tout)
    src, src_lengths, src_mask = pad_sequences(srcs, pad_id)
    tgt_in, tgt_lengths, tgt_mask = pad_sequences(tgt_ins, pad_id, min_len=1)
    tgt_out, _, _ = pad_sequences(tgt_outs, pad_id, min_len=1)
    idx = torch.as_tensor(list(index) if index is not None else range(len(pairs)), dtype=torch.long)
    return Batch(src, src_mask, src_lengths, tgt_in, tgt_out, tgt_mask, tgt_lengths, idx)


@dataclass
class PairCollator:
    """``collate_fn`` for a DataLoader over :class:`EncodedPairs` (items ``(index, src_ids, tgt_ids)``)."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    src_bos: bool = False
    src_eos: bool = False

    def __call__(self, items: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> Batch:
        return collate_pairs([(s, t) for _, s, t in items], pad_id=self.pad_id, bos_id=self.bos_id,
                             eos_id=self.eos_id, src_bos=self.src_bos, src_eos=self.src_eos,
                             index=[i for i, _, _ in items])


class EncodedPairs(Dataset):
    """Text pairs encoded once with a source and a target tokeniser (no special tokens added).

    ``data[i]`` is ``(i, src_ids, tgt_ids)``; ``lengths`` (source and target lengths, the larger of each pair)
    feeds :class:`BucketBatchSampler`. ``max_src_len``/``max_tgt_len`` truncate.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        *,
        max_src_len: int | None = None,
        max_tgt_len: int | None = None,
    ):
        tgt_tokenizer = tgt_tokenizer or src_tokenizer
        self.pairs = list(pairs)
        self.src = [s[:max_src_len] for s in src_tokenizer.encode_batch(p[0] for p in self.pairs)]
        self.tgt = [t[:max_tgt_len] for t in tgt_tokenizer.encode_batch(p[1] for p in self.pairs)]
        # decoder sequences get one extra token (<bos> or <eos>)
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt, strict=True)]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[int, list[int], list[int]]:
        return i, self.src[i], self.tgt[i]


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of indices of similar length, so that little of a padded batch is padding.

    Shuffled indices are cut into pools of ``pool_batches`` batches; each pool is sorted by length and cut into
    batches; the batches are shuffled. The order depends only on ``(seed, epoch)`` (call :meth:`set_epoch`), so a
    resumed run sees the same batches. ``shuffle=False`` sorts everything by length, in order.

    Args:
        lengths: length of each example (e.g. :attr:`EncodedPairs.lengths`).
        batch_size: examples per batch, or
        max_tokens: a cap on ``batch rows x longest length`` (padded tokens) per batch (one of the two, or both).
        drop_last: drop a pool's last batch when it is smaller than ``batch_size``.
        num_replicas, rank: for data-parallel training, each rank gets every ``num_replicas``-th batch of the same
            order; the list is wrapped around so that all ranks get the same number of batches.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pool_batches: int = 50,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if batch_size is None and max_tokens is None:
            raise ValueError("give batch_size, max_tokens or both")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.lengths = [int(n) for n in lengths]
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pool_batches = pool_batches
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _cut(self, ordered: list[int]) -> list[list[int]]:
        batches, current, longest = [], [], 0
        for i in ordered:
            n = max(self.lengths[i], 1)
            full = self.batch_size is not None and len(current) >= self.batch_size
            too_many = (self.max_tokens is not None and current
                        and (len(current) + 1) * max(longest, n) > self.max_tokens)
            if full or too_many:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        if current and not (self.drop_last and self.batch_size is not None and len(current) < self.batch_size):
            batches.append(current)
        return batches

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """All batches of ``epoch`` (default: the current one), before the split between ranks."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        key = lambda i: self.lengths[i]  # noqa: E731
        if not self.shuffle:
            out = self._cut(sorted(range(len(self.lengths)), key=key))
        else:
            rng = random.Random(f"qkv-buckets:{self.seed}:{epoch}")
            order = list(range(len(self.lengths)))
            rng.shuffle(order)
            pool = (self.batch_size or max(1, self.max_tokens // max(max(self.lengths, default=1), 1))) \
                * self.pool_batches
            out = []
            for start in range(0, len(order), pool):
                out.extend(self._cut(sorted(order[start: start + pool], key=key)))
            rng.shuffle(out)
        self._cache = (epoch, out)
        return out

    def __iter__(self) -> Iterator[list[int]]:
        out = self.batches()
        if self.num_replicas > 1:
            per_rank = math.ceil(len(out) / self.num_replicas)
            out = (out * (1 + (per_rank * self.num_replicas) // max(len(out), 1)))[: per_rank * self.num_replicas]
            out = out[self.rank:: self.num_replicas]
        return iter([list(b) for b in out])

    def __len__(self) -> int:
        n = len(self.batches())
        return math.ceil(n / self.num_replicas) if self.num_replicas > 1 else n
