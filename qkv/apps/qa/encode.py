"""Question answering's encoding: tokens with their character offsets, the question-word flag, answer spans in
tokens, the overlapping windows of a long context, and the batches the readers take.

A word tokeniser's tokens are its own pieces (:meth:`qkv.data.WordTokenizer.spans`: with the mixed tokeniser every
CJK character is a token, Latin words and numbers stay whole, full-width forms are normalised; a tokeniser saved
before that splits at its old word expression), a character tokeniser's are every character but white space. Each
token keeps ``(start, end)`` offsets in the text as typed, so the answer printed is always the context's own text
between the first and the last token of the span, whatever the vocabulary made of them (``<unk>`` included).

A context longer than the reader's ``max_context`` tokens is read in overlapping windows (:func:`windows`), as
SQuAD readers of long documents do (Devlin et al., 2019, "BERT", https://arxiv.org/abs/1810.04805, section 4.2):
windows of ``max_context`` tokens whose starts are ``stride`` tokens apart, the last one ending at the context's
end. A question longer than ``max_question`` tokens is cut, and the cut is counted (:attr:`Encoded.question_cut`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...data.tokenize import UNK_ID, CharTokenizer, Tokenizer, WordTokenizer

__all__ = ["Encoded", "token_offsets", "encode_text", "encode_example", "windows", "crop", "training_window",
           "collate_qa", "rare_dropout"]


@dataclass
class Encoded:
    """One question over one context, or over a window of it, as token ids.

    ``context``/``question`` ids, ``match`` (per context token: 1 where it occurs in the question, plus 2 where
    it starts with a capital letter; :func:`qkv.models.reading.token_flags` unpacks them), the context
    tokens' character ``offsets`` in the whole context, the answer's token span ``start..end`` (inclusive; -1 when
    the example has no answer inside these tokens), ``first``: the index of this window's first token in the
    whole context (0 for a whole context), and ``question_tokens``: the question's tokens before the cut at
    ``max_question``.
    """

    context: list[int]
    question: list[int]
    match: list[int]
    offsets: list[tuple[int, int]]
    start: int = -1
    end: int = -1
    first: int = 0
    question_tokens: int = 0

    @property
    def question_cut(self) -> int:
        """How many question tokens were left out (past ``max_question``)."""
        return max(0, self.question_tokens - len(self.question))


def token_offsets(text: str, tokenizer: Tokenizer) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of ``text``'s tokens in ``text`` as typed: the word tokeniser's
    :meth:`~qkv.data.WordTokenizer.spans`, or every character but white space for a character tokeniser."""
    if isinstance(tokenizer, CharTokenizer):
        return [(i, i + 1) for i, c in enumerate(text) if not c.isspace()]
    if isinstance(tokenizer, WordTokenizer):
        return tokenizer.spans(text)
    raise ValueError(f"question answering reads words or characters, not {type(tokenizer).__name__} tokens")


def encode_text(text: str, tokenizer: Tokenizer, max_len: int | None = None
                ) -> tuple[list[int], list[str], list[tuple[int, int]]]:
    """``(ids, keys, offsets)`` of the first ``max_len`` tokens of ``text`` (all with None): the ids, each token's
    key for the question-word flag (its normalised, lower-cased form: ``１９０５`` and ``1905`` match) and its
    offsets in ``text``."""
    offsets = token_offsets(text, tokenizer)
    if isinstance(tokenizer, CharTokenizer):
        ids, keys = tokenizer.encode("".join(text[a:b] for a, b in offsets)), [text[a:b] for a, b in offsets]
    else:
        ids, keys = tokenizer.encode(text), tokenizer.tokens(text)
        if len(ids) != len(offsets):  # an old tokeniser that splits its normalised text differently: one at a time
            pieces = [tokenizer.tokens(text[a:b]) for a, b in offsets]
            ids = [(tokenizer.encode(text[a:b]) or [UNK_ID])[0] for a, b in offsets]
            keys = [p[0] if p else text[a:b] for p, (a, b) in zip(pieces, offsets, strict=True)]
    if max_len is not None:
        ids, keys, offsets = ids[:max_len], keys[:max_len], offsets[:max_len]
    return ids, [k.lower() for k in keys], offsets


def encode_example(context: str, question: str, tokenizer: Tokenizer, *, max_question: int,
                   answer: tuple[int, int] | None = None) -> Encoded:
    """An :class:`Encoded` example of the whole ``context`` and the first ``max_question`` tokens of
    ``question``; ``answer`` is the answer's character span in ``context``."""
    cids, ckeys, offsets = encode_text(context, tokenizer)
    qids, qkeys, _ = encode_text(question, tokenizer)
    if not cids:
        raise ValueError("the context has no tokens")
    if not qids:
        raise ValueError("the question has no tokens")
    n_question = len(qids)
    qids, qkeys = qids[:max_question], qkeys[:max_question]
    words = set(qkeys)
    flags = [int(k in words) + 2 * context[a:b][:1].isupper() for k, (a, b) in zip(ckeys, offsets, strict=True)]
    out = Encoded(cids, qids, flags, offsets, question_tokens=n_question)
    if answer is not None:
        a, b = answer
        inside = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
        if inside:
            out.start, out.end = inside[0], inside[-1]
    return out


def windows(n: int, max_context: int, stride: int) -> list[tuple[int, int]]:
    """The token ranges ``[a, b)`` read of a context of ``n`` tokens: one when ``n <= max_context``; else windows
    of ``max_context`` tokens starting every ``stride`` tokens, the last one ending at ``n``."""
    if max_context < 1 or not 1 <= stride <= max_context:
        raise ValueError(f"need 1 <= stride <= max_context, got stride {stride} and max_context {max_context}")
    if n <= max_context:
        return [(0, n)]
    starts = list(range(0, n - max_context, stride)) + [n - max_context]
    return [(a, a + max_context) for a in starts]


def crop(e: Encoded, a: int, b: int) -> Encoded:
    """The window ``[a, b)`` of the whole-context example ``e``: its tokens, the answer span counted from ``a``
    (-1 unless the whole span lies inside), ``first = a``; the offsets stay those of the whole context."""
    inside = a <= e.start and e.end < b
    return replace(e, context=e.context[a:b], match=e.match[a:b], offsets=e.offsets[a:b],
                   start=e.start - a if inside else -1, end=e.end - a if inside else -1, first=a)


def training_window(e: Encoded, max_context: int, stride: int) -> Encoded | None:
    """What a training example reads: the first window (of :func:`windows`) holding the whole answer span, or
    None when none does (no answer, or one longer than ``max_context``)."""
    if e.start < 0:
        return None
    for a, b in windows(len(e.context), max_context, stride):
        if a <= e.start and e.end < b:
            return crop(e, a, b)
    return None


def rare_dropout(examples: list[Encoded], vocab_size: int, alpha: float) -> list[float]:
    """Per token id, the probability ``alpha / (alpha + n)`` of becoming ``<unk>`` in training, ``n`` its count in
    the contexts and questions of ``examples`` (Kiperwasser and Goldberg, 2016, "Simple and Accurate Dependency
    Parsing Using Bidirectional LSTM Feature Representations", https://arxiv.org/abs/1603.04351): rare tokens -- names
    above all -- are often met unknown, as names never seen in training will be, while common words almost never are.
    Padding and ``<unk>`` itself: 0."""
    counts = [0] * vocab_size
    for e in examples:
        for t in (*e.context, *e.question):
            counts[t] += 1
    return [0.0 if t <= UNK_ID or alpha <= 0 else alpha / (alpha + n) for t, n in enumerate(counts)]


def _pad(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, _lengths_mask([len(r) for r in rows], width)


def _lengths_mask(lengths: list[int], width: int) -> Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def collate_qa(examples: list[Encoded], *, word_dropout: float = 0.0, rng: random.Random | None = None,
               rare: Sequence[float] | None = None) -> dict:
    """A batch: ``context``, ``context_mask``, ``question``, ``question_mask``, ``match`` ``(B, T)`` (the token
    flags of :class:`Encoded`) and the answer
    ``start``, ``end`` ``(B,)``.

    ``word_dropout`` replaces each distinct token of an example (in its question and context alike) by ``<unk>``
    with that probability: training then meets unknown names as the held-out ones will be met. ``rare[id]``, when
    given, is a further probability for each token id (:func:`rare_dropout`: the rarer the token, the likelier).
    """
    contexts, questions = [list(e.context) for e in examples], [list(e.question) for e in examples]
    if word_dropout > 0 or rare is not None:
        rng = rng or random
        for c, q in zip(contexts, questions, strict=True):
            dropped = {t for t in set(c) | set(q)
                       if rng.random() < word_dropout or (rare is not None and rng.random() < rare[t])}
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
