"""Data: corpora readers, generated tasks, tokenisers and batching (depends on no other qkv layer)."""

from .batching import (
    Batch,
    BucketBatchSampler,
    EncodedPairs,
    PairCollator,
    collate_pairs,
    pad_sequences,
    teacher_forcing,
)
from .dates import DateExample, date_corpus, make_date_examples, make_dates, split_dates
from .pairs import ParallelCorpus, load_parallel, read_pairs, split_grouped
from .tokenize import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CharTokenizer,
    SubwordTokenizer,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "Batch", "BucketBatchSampler", "EncodedPairs", "PairCollator", "collate_pairs", "pad_sequences",
    "teacher_forcing", "DateExample", "date_corpus", "make_date_examples", "make_dates", "split_dates",
    "ParallelCorpus", "load_parallel", "read_pairs", "split_grouped", "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID",
    "CharTokenizer", "SubwordTokenizer", "Tokenizer", "WordTokenizer", "load_tokenizer", "train_tokenizer",
]
