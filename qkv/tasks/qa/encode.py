"""Question answering's encoding: tokens with their character offsets, the question-word flag, answer spans in
tokens, and the batches the readers take.

Words are split by :class:`qkv.data.WordTokenizer`'s expression, characters are every character but white space;
each token keeps ``(start, end)`` offsets in the original text, so the answer printed is always the context's own
text between the first and the last token of the span, whatever the vocabulary made of them (``<unk>`` included).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from ...data.tokenize import _WORD_RE, UNK_ID, CharTokenizer, Tokenizer, WordTokenizer

__all__ = ["Encoded", "token_offsets", "encode_text", "encode_example", "collate_qa"]


@dataclass
class Encoded:
    """One question over one context, as token ids: ``context``/``question`` ids, ``match`` (1 where the context
    token occurs in the question), the context tokens' character ``offsets``, and the answer's token span
    ``start..end`` (inclusive; -1 when the example has no answer inside the kept tokens)."""

    context: list[int]
    question: list[int]
    match: list[int]
    offsets: list[tuple[int, int]]
    start: int = -1
    end: int = -1


def token_offsets(text: str, tokenizer: Tokenizer) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of ``text``'s tokens: words and punctuation marks for a word tokeniser,
    every character but white space for a character tokeniser."""
    if isinstance(tokenizer, CharTokenizer):
        return [(i, i + 1) for i, c in enumerate(text) if not c.isspace()]
    if isinstance(tokenizer, WordTokenizer):
        return [m.span() for m in _WORD_RE.finditer(text)]
    raise ValueError(f"question answering reads words or characters, not {type(tokenizer).__name__} tokens")


def _key(token: str) -> str:
    return token.lower()


def encode_text(text: str, tokenizer: Tokenizer, max_len: int) -> tuple[list[int], list[str], list[tuple[int, int]]]:
    """``(ids, token strings, offsets)`` of the first ``max_len`` tokens of ``text``."""
    offsets = token_offsets(text, tokenizer)[:max_len]
    pieces = [text[a:b] for a, b in offsets]
    if isinstance(tokenizer, CharTokenizer):
        ids = tokenizer.encode("".join(pieces))
    else:
        ids = tokenizer.encode(" ".join(pieces))
        if len(ids) != len(pieces):  # a token the tokeniser splits differently (normalisation): one at a time
            ids = [(tokenizer.encode(p) or [UNK_ID])[0] for p in pieces]
    return ids, pieces, offsets


def encode_example(context: str, question: str, tokenizer: Tokenizer, *, max_context: int, max_question: int,
                   answer: tuple[int, int] | None = None) -> Encoded:
    """An :class:`Encoded` example; ``answer`` is the answer's character span in ``context``."""
    cids, cpieces, offsets = encode_text(context, tokenizer, max_context)
    qids, qpieces, _ = encode_text(question, tokenizer, max_question)
    if not cids:
        raise ValueError("the context has no tokens")
    if not qids:
        raise ValueError("the question has no tokens")
    words = {_key(p) for p in qpieces}
    match = [int(_key(p) in words) for p in cpieces]
    out = Encoded(cids, qids, match, offsets)
    if answer is not None:
        a, b = answer
        inside = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
        if inside:
            out.start, out.end = inside[0], inside[-1]
    return out


def _pad(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, _lengths_mask([len(r) for r in rows], width)


def _lengths_mask(lengths: list[int], width: int) -> Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def collate_qa(examples: list[Encoded], *, word_dropout: float = 0.0, rng: random.Random | None = None) -> dict:
    """A batch: ``context``, ``context_mask``, ``question``, ``question_mask``, ``match`` ``(B, T)`` and the answer
    ``start``, ``end`` ``(B,)``.

    ``word_dropout`` replaces each distinct token of an example (in its question and context alike) by ``<unk>``
    with that probability: training then meets unknown names as the held-out ones will be met.
    """
    contexts, questions = [list(e.context) for e in examples], [list(e.question) for e in examples]
    if word_dropout > 0:
        rng = rng or random
        for c, q in zip(contexts, questions, strict=True):
            dropped = {t for t in set(c) | set(q) if rng.random() < word_dropout}
            if dropped:
                c[:] = [UNK_ID if t in dropped else t for t in c]
                q[:] = [UNK_ID if t in dropped else t for t in q]
    context, context_mask = _pad(contexts)
    question, question_mask = _pad(questions)
    match = torch.zeros(context.shape, dtype=torch.float32)
    for i, e in enumerate(examples):
        match[i, :len(e.match)] = torch.tensor(e.match, dtype=torch.float32)
    return {"context": context, "context_mask": context_mask, "question": question, "question_mask": question_mask,
            "match": match, "start": torch.tensor([e.start for e in examples]),
            "end": torch.tensor([e.end for e in examples])}
