"""Summarising a batch of texts with the one decoder (:mod:`qkv.models.decoding`): the extended vocabulary of each
source (:func:`encode_example`), the training batch (:func:`collate`), :func:`summarize_batch` and its result
:class:`Summary`, the metrics (:func:`summary_metrics`) and the lead / first-words baselines."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from ..base import evaluating, length_batches

__all__ = ["Encoded", "SummaryBatch", "Summary", "encode_example", "collate", "summarize_batch", "summary_metrics",
           "rouge_words", "lead", "first_words", "output_text", "written_out", "output_words"]

logger = logging.getLogger(__name__)


@dataclass
class Encoded:
    """One example as the model reads it: ``src`` (words outside the vocabulary as ``<unk>``), ``src_ext`` (those
    words as ``V + j``, ``j`` their index in ``oovs``), the source ``words`` read, the target's extended ids ending
    with ``<eos>`` (None without a target) and the source words ``cut``."""

    src: list[int]
    src_ext: list[int]
    oovs: list[str]
    words: list[str]
    tgt: list[int] | None = None
    cut: int = 0


def encode_example(tok, source: str, target: str | None = None, *, max_source: int = 400,
                   max_target: int = 100) -> Encoded:
    """:class:`Encoded` of ``source`` (and ``target``) with the word tokeniser ``tok`` (vocabulary ``V``): a target
    word outside the vocabulary is its source copy ``V + j`` when the source has it, else ``<unk>``."""
    from ...data import EOS_ID, UNK_ID

    v = tok.vocab_size
    words_all = tok.split(source)
    words, ids = words_all[:max_source], tok.encode(source)[:max_source]
    oovs: list[str] = []
    ext = []
    for w, i in zip(words, ids, strict=True):
        if i == UNK_ID:
            if w not in oovs:
                oovs.append(w)
            i = v + oovs.index(w)
        ext.append(i)
    if not words:
        words, ids, ext = ["<unk>"], [UNK_ID], [UNK_ID]
    tgt = None
    if target is not None:
        tgt = []
        for w, i in zip(tok.split(target)[:max_target], tok.encode(target)[:max_target], strict=True):
            tgt.append(v + oovs.index(w) if i == UNK_ID and w in oovs else i)
        tgt.append(EOS_ID)
    return Encoded(ids, ext, oovs, words, tgt, len(words_all) - len(words))


@dataclass
class SummaryBatch:
    """Padded tensors of a batch: ``src``, ``src_mask``, ``src_ext`` ``(B, S)``, ``n_ext`` (the most source words
    outside the vocabulary), and for training ``tgt_in``, ``tgt_out``, ``tgt_mask`` ``(B, T)``."""

    src: Tensor
    src_mask: Tensor
    src_ext: Tensor
    n_ext: int
    tgt_in: Tensor | None = None
    tgt_out: Tensor | None = None
    tgt_mask: Tensor | None = None


def collate(items: Sequence[Encoded]) -> SummaryBatch:
    """One batch of encoded examples (with targets when every item has one)."""
    from ...data import BOS_ID, pad_sequences

    src, _, mask = pad_sequences([e.src for e in items])
    src_ext, _, _ = pad_sequences([e.src_ext for e in items])
    n_ext = max(len(e.oovs) for e in items)
    if any(e.tgt is None for e in items):
        return SummaryBatch(src, mask, src_ext, n_ext)
    tgt_in, _, _ = pad_sequences([[BOS_ID, *e.tgt[:-1]] for e in items])
    tgt_out, _, tgt_mask = pad_sequences([e.tgt for e in items])
    return SummaryBatch(src, mask, src_ext, n_ext, tgt_in, tgt_out, tgt_mask)


@dataclass
class Summary:
    """One output: its ``text`` (:func:`written_out`: copied runs as the source wrote them) and ``tokens``, the
    source words read, the attention ``(T, S)`` (a row per output
    token, the end token's included), ``p_gen (T,)`` (the probability of generating rather than copying, at each
    step), ``copied`` (per output word: a source word outside the vocabulary, which only copying can give), the
    ``coverage (S,)`` after the last step (the attention rows summed), the beam ``score``, the source words cut and
    what the decoder gave at each of its steps (``decoded``: special tokens included, which ``tokens`` and ``text``
    leave out; a page of its attention rows names them so), and why decoding ``stopped`` (``"end"``, or
    ``"max_len"``: it had the most tokens allowed)."""

    source: str
    text: str
    tokens: list[str]
    source_tokens: list[str]
    attention: Tensor
    p_gen: Tensor
    copied: list[bool]
    coverage: Tensor
    score: float
    cut: int = 0
    decoded: list[str] = field(default_factory=list)
    stopped: str = "end"


def output_text(words: Sequence[str]) -> str:
    """Words joined as text (spaces between Latin words, none around CJK characters)."""
    from ...data.pretokenize import join_mixed

    return join_mixed(list(words))


_CLOSING = set(".,;:!?)]}%")


def written_out(words: Sequence[str], source_words: Sequence[str], source: str,
                spans: Sequence[tuple[int, int]] | None) -> str:
    """The output ``words`` as text: each longest run of them that is a run of ``source_words`` is written as the
    source wrote it (``spans``: each source word's ``(start, end)`` in ``source``), so a copied name keeps its case
    and its hyphens (``kavik - valgil`` -> ``Kavik-Valgil``); other words are joined as :func:`output_text` joins
    them, with no space before closing punctuation. Without ``spans`` (or spans that do not fit):
    :func:`output_text`."""
    from ...data.pretokenize import is_cjk

    if spans is None or len(spans) < len(source_words):
        return output_text(words)
    pieces: list[str] = []
    i = 0
    while i < len(words):
        best, at = 0, -1
        for j in range(len(source_words)):
            n = 0
            while i + n < len(words) and j + n < len(source_words) and words[i + n] == source_words[j + n]:
                n += 1
            if n > best:
                best, at = n, j
        if best:
            pieces.append(source[spans[at][0]:spans[at + best - 1][1]])
            i += best
        else:
            pieces.append(words[i])
            i += 1
    out: list[str] = []
    for k, piece in enumerate(pieces):
        prev = pieces[k - 1] if k else ""
        if k and piece and prev and not (is_cjk(prev[-1]) or is_cjk(piece[0]) or piece[0] in _CLOSING
                                         or prev[-1] in "([{"):
            out.append(" ")
        out.append(piece)
    return "".join(out)


def summarize_batch(model: nn.Module, tok, texts: Sequence[str], *, beam: int = 1, max_len: int = 40,
                    min_len: int = 0, batch_size: int = 32, length_penalty: float = 0.0,
                    coverage_penalty: float = 0.0, no_repeat_ngram_size: int = 0,
                    max_source: int = 400, records: list | None = None, lm=None, lm_weight: float | None = None,
                    length_reward: float = 0.0) -> list[Summary]:
    """Summaries of ``texts`` by the one decoder over the extended vocabulary (greedy when ``beam`` is 1); the
    ``p_gen`` of each chosen word comes from the model run once more, teacher-forced, on the decoded output.
    ``records``: a list that receives the attention records of the decoding (:func:`qkv.capture_attention`).
    ``lm``: a language model of the summaries' tokens fused into the beam (:func:`qkv.models.fusion.fusion_scorer`;
    a copied source word outside the vocabulary is scored as its ``<unk>``)."""
    from contextlib import nullcontext

    from ...capture import capture_attention
    from ...data import BOS_ID, EOS_ID, pad_sequences
    from ...models.decoding import beam_search
    from ...models.fusion import fusion_scorer

    device = next(model.parameters()).device
    out: dict[int, Summary] = {}
    fusion = fusion_scorer(lm, tok, weight=lm_weight, reward=length_reward, eos_id=EOS_ID)
    with evaluating(model):
        for idx in length_batches(texts, batch_size, device=device):
            enc = [encode_example(tok, texts[i], max_source=max_source) for i in idx]
            b = collate(enc)
            src, mask, ext = b.src.to(device), b.src_mask.to(device), b.src_ext.to(device)
            with capture_attention(model) if records is not None else nullcontext() as captured:
                hyps = beam_search(model, src, mask, ext, b.n_ext, beam=beam, max_len=max_len, min_len=min_len,
                                   length_penalty=length_penalty, coverage_penalty=coverage_penalty,
                                   source_mask=mask, no_repeat_ngram_size=no_repeat_ngram_size, normalize=False,
                                   **({} if fusion is None else {"prefix_scorer": fusion,
                                                                 "prefix_state": fusion.initial_state()}))
            if records is not None:
                records.extend(captured)
            tgt_in, _, _ = pad_sequences([[BOS_ID, *h.tokens] for h in hyps])
            p_gen = model(src, mask, tgt_in.to(device), ext, b.n_ext).p_gen.cpu()
            for row, (i, e, h) in enumerate(zip(idx, enc, hyps, strict=True)):
                n = h.attention.shape[0]
                attn = h.attention[:, :len(e.words)]
                words, copied, rows = output_words(h.tokens, attn, e, tok)
                rows += list(range(len(h.tokens), n))  # the end token's row
                attn = attn[rows]
                spans = tok.spans(texts[i]) if hasattr(tok, "spans") else None
                text = written_out(words, e.words, texts[i], spans)
                decoded = [e.oovs[t - tok.vocab_size] if t >= tok.vocab_size else tok.tokens_of_ids([t])[0]
                           for t in h.tokens]
                out[i] = Summary(texts[i], text, words, e.words, attn, p_gen[row, :n][rows], copied,
                                 attn.sum(0), float(h.score), e.cut, decoded, h.stopped)
    return [out[i] for i in range(len(texts))]


def output_words(tokens: Sequence[int], attention: Tensor, enc: Encoded,
                 tok) -> tuple[list[str], list[bool], list[int]]:
    """The words of decoded ``tokens`` (ids of the extended vocabulary), whether each is a copy, and the step of
    each: the special tokens ``<pad>``, ``<bos>`` and ``<eos>`` are left out, and ``<unk>`` (a word the model knows
    only as unknown) is replaced by the source word it attends to most at that step (``attention (T, S)``), the word
    a copy would give (Luong et al., 2015, "Addressing the Rare Word Problem in Neural Machine Translation"); it is
    left out only when the source has no word."""
    from ...data import BOS_ID, EOS_ID, PAD_ID, UNK_ID
    from ...data.tokenize import SPECIALS

    v = tok.vocab_size
    words, copied, steps = [], [], []
    for step, t in enumerate(tokens):
        if t in (PAD_ID, BOS_ID, EOS_ID):
            continue
        if t == UNK_ID:
            word = enc.words[int(attention[step].argmax())] if step < attention.shape[0] and attention.shape[1] \
                else SPECIALS[UNK_ID]
            if word in SPECIALS:  # an empty source (read as one <unk>)
                continue
            words.append(word)
            copied.append(True)
        else:
            words.append(enc.oovs[t - v] if t >= v else tok.tokens_of_ids([t])[0])
            copied.append(t >= v)
        steps.append(step)
    return words, copied, steps


_ALNUM = re.compile(r"\w")


def rouge_words(text: str) -> list[str]:
    """The words ROUGE counts: the mixed tokeniser's (CJK characters one by one), lower-cased, without
    punctuation marks."""
    from ...data.pretokenize import mixed_tokens

    return [w for w in mixed_tokens(text, lowercase=True) if _ALNUM.search(w)]


def lead(text: str) -> str:
    """The first sentence of ``text`` (up to the first ``.``, ``!``, ``?`` or ``。`` followed by a space or the
    end), the lead baseline."""
    m = re.search(r"[.!?](\s|$)|[。！？]", text)
    return text[:m.end()].strip() if m else text.strip()


def first_words(text: str, n: int = 8) -> str:
    """The first ``n`` whitespace-separated words of ``text``."""
    return " ".join(text.split()[:n])


def summary_metrics(outputs: Sequence[str], refs: Sequence[str], *, answers: bool = False,
                    summaries: Sequence[Summary] | None = None) -> dict[str, float]:
    """ROUGE-1/2/L (x 100, :func:`rouge_words`), and with ``summaries``: ``repeated_trigrams`` (the share of the
    outputs' trigrams that repeat one of the same output), ``copied`` (the share of output words found in their
    source), ``copied_oov`` (the share that are source words outside the vocabulary: copies only) and ``p_gen``
    (its mean over the output words); ``answers``: SQuAD's ``exact_match`` and ``f1`` too (fractions)."""
    from ...metrics import repeated_ngram_rate, rouge, squad_metrics

    figures = rouge(outputs, refs, tokenize=rouge_words)
    if summaries is not None:
        figures["repeated_trigrams"] = repeated_ngram_rate([s.tokens for s in summaries], 3)
        words = sum(len(s.tokens) for s in summaries) or 1
        figures["copied"] = sum(sum(w in set(s.source_tokens) for w in s.tokens) for s in summaries) / words
        figures["copied_oov"] = sum(sum(s.copied) for s in summaries) / words
        figures["p_gen"] = sum(float(s.p_gen[:len(s.tokens)].sum()) for s in summaries) / words
        figures["length"] = sum(len(s.tokens) for s in summaries) / max(1, len(summaries))
    if answers:
        figures.update({k: v for k, v in squad_metrics(outputs, [[r] for r in refs]).items() if k != "questions"})
    return figures
