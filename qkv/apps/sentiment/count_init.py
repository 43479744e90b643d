"""The bigram model's start from counts: Wang & Manning's naive-Bayes log-count ratios as its first vector dimensions.

NBSVM (Wang & Manning, 2012, "Baselines and Bigrams: Simple, Good Sentiment and Topic Classification",
https://aclanthology.org/P12-2018) scales each word and bigram feature by its log-count ratio
``r = log((p + a) / |p + a|_1) - log((q + a) / |q + a|_1)``, ``p`` and ``q`` the (binarized) counts of texts of the
class and of the other classes holding it. :func:`count_init` writes ``r`` of every class (one against the rest)
into the first ``C`` dimensions of the word and bigram vectors of a :class:`~qkv.models.BigramAttentionClassifier`
and makes the output layer read class ``c``'s logit from dimension ``c``; the other dimensions keep their random
start. Training then moves everything; the attention starts from its random start and learns which words to read.
The counts come from the training split only.
"""

from __future__ import annotations

import torch

from ...models.classifiers import BigramAttentionClassifier, log_count_ratios

__all__ = ["log_count_ratios", "count_init"]


@torch.no_grad()
def count_init(model: BigramAttentionClassifier, examples, num_classes: int) -> None:
    """Start ``model``'s first ``num_classes`` vector dimensions from the log-count ratios of ``examples``."""
    if model.hidden.__class__.__name__ != "Identity" or model.pool.num_queries != 1:
        raise ValueError("count_init needs the bigram model without bigram_hidden and with one hop")
    dim = model.embedding.embedding_dim
    if num_classes > dim:
        raise ValueError(f"count_init needs embed_dim >= the number of classes ({num_classes}), got {dim}")
    r_words, r_bigrams = log_count_ratios(examples, num_classes, model.embedding.num_embeddings, model.buckets)
    model.embedding.weight[:, :num_classes] = r_words
    if model.bigrams is not None:
        model.bigrams.weight[:, :num_classes] = r_bigrams
    out = model.head[-1]
    out.weight[:, :num_classes] = torch.eye(num_classes)
    out.weight[:, num_classes:] *= 0.1  # the random dimensions start quiet beside the counts
