"""Whether the tokenizer of a language model a run starts from (``init``) covers the run's data: the share of its
training tokens that are ``<unk>`` and the characters it lacks, said in a warning (:func:`warn_uncovered`), never
a model silently trained on unknown tokens."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["uncovered", "warn_uncovered"]

logger = logging.getLogger(__name__)


def uncovered(tokenizer, ids: Iterable[Sequence[int]], texts: Sequence[str]) -> tuple[int, int, list[tuple[str, int]]]:
    """``(unknown, total, characters)``: how many of the token ids ``ids`` are ``<unk>``, of how many, and the
    characters of ``texts`` the tokenizer reads as unknown, most frequent first (each with its count)."""
    from ...data import UNK_ID

    unknown = total = 0
    for row in ids:
        total += len(row)
        unknown += sum(1 for t in row if t == UNK_ID)
    if not unknown:
        return 0, total, []
    counts = Counter(ch for text in texts for ch in text if not ch.isspace())
    lacking = [(ch, n) for ch, n in counts.most_common() if UNK_ID in tokenizer.encode(ch)]
    return unknown, total, lacking


def warn_uncovered(tokenizer, ids: Iterable[Sequence[int]], texts: Sequence[str], init: str) -> int:
    """Log a warning naming ``init`` when the training tokens ``ids`` (of ``texts``) hold ``<unk>``; the count."""
    unknown, total, lacking = uncovered(tokenizer, ids, texts)
    if unknown:
        shown = ", ".join(f"{ch!r} x{n}" for ch, n in lacking[:8]) + (f" and {len(lacking) - 8} more"
                                                                        if len(lacking) > 8 else "")
        logger.warning("init %s: its tokenizer does not cover the data: %d of %d training tokens (%.1f%%) are <unk>%s; "
                       "the model learns them as one unknown token (train the language model on text with them)",
                       init, unknown, total, 100 * unknown / max(total, 1), f" (characters {shown})" if shown else "")
    return unknown
