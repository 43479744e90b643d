"""Translating a batch of texts with the one decoder (:mod:`qkv.models.decoding`): :func:`translate_batch` and
its result, :class:`Translation`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import Tensor, nn

from ..base import evaluating, length_batches

__all__ = ["Translation", "translate_batch", "source_ids", "MAX_SOURCE_TOKENS"]

logger = logging.getLogger(__name__)

#: the longest source a translator reads, in tokens; longer ones are cut, with a warning
MAX_SOURCE_TOKENS = 256


def source_ids(src_tok, text: str, n: int = 1) -> tuple[list[int], int]:
    """The token ids of ``text`` (text number ``n``) as the model reads them, and how many tokens were cut."""
    from ...data import UNK_ID

    ids = src_tok.encode(text)
    cut = max(0, len(ids) - MAX_SOURCE_TOKENS)
    if cut:
        logger.warning("text %d has %d tokens: the translator reads the first %d and leaves out the last %d",
                       n, len(ids), MAX_SOURCE_TOKENS, cut)
    return ids[:MAX_SOURCE_TOKENS] or [UNK_ID], cut


@dataclass
class Translation:
    """One translated sentence: the ``text`` and its ``tokens`` (target pieces), the ``source_tokens``, the
    alignment ``attention (T, S)`` (a row per target token, the end token's included) and the beam ``score``."""

    source: str
    text: str
    tokens: list[str]
    source_tokens: list[str]
    attention: Tensor
    score: float
    cut: int = 0  #: source tokens past :data:`MAX_SOURCE_TOKENS`, not read (a warning is logged)
    stopped: str = "end"  #: ``"end"``, or ``"max_len"``: the translation had the most tokens allowed


def translate_batch(model: nn.Module, src_tok, tgt_tok, texts: list[str], *, beam: int = 1, max_len: int = 64,
                    batch_size: int = 64, length_penalty: float = 0.6, lm=None, lm_weight: float | None = None,
                    length_reward: float = 0.0) -> list[Translation]:
    """Translate ``texts`` with ``model`` in length-sorted batches (greedy when ``beam`` is 1).

    ``lm``: a language model of the target language (a loaded :class:`~qkv.apps.lm.LanguageModel` whose tokens
    are the target tokenizer's kind) fused into the beam with weight ``lm_weight`` and ``length_reward`` per token
    (:func:`qkv.models.fusion.fusion_scorer`)."""
    from ...data import EOS_ID, pad_sequences
    from ...models.decoding import beam_search
    from ...models.fusion import fusion_scorer

    device = next(model.parameters()).device
    results: dict[int, Translation] = {}
    fusion = fusion_scorer(lm, tgt_tok, weight=lm_weight, reward=length_reward, eos_id=EOS_ID)
    with evaluating(model):
        for idx in length_batches(texts, batch_size, device=device):
            read = [source_ids(src_tok, texts[i], i + 1) for i in idx]
            ids = [x for x, _ in read]
            src, _, mask = pad_sequences(ids)
            fused = {} if fusion is None else {"prefix_scorer": fusion, "prefix_state": fusion.initial_state()}
            hyps = beam_search(model, src.to(device), mask.to(device), beam=beam, max_len=max_len,
                               length_penalty=length_penalty, **fused)
            for i, (ids_i, cut), h in zip(idx, read, hyps, strict=True):
                results[i] = Translation(texts[i], tgt_tok.decode(h.tokens), tgt_tok.tokens_of_ids(h.tokens),
                                         src_tok.tokens_of_ids(ids_i), h.attention[:, :len(ids_i)], float(h.score),
                                         cut, h.stopped)
    return [results[i] for i in range(len(texts))]
