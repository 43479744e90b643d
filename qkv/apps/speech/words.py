"""Words for a character decoder: a word trigram model that scores its beam and corrects its transcript.

A character decoder writes words as it hears them ("to an a lock"); a word model of the language knows which words
exist and which follow which ("to have a look"). :class:`WordModel` is a trigram model with interpolated absolute
discounting (Ney, Essen and Kneser, 1994, "On structuring probabilistic dependences in stochastic language
modelling"; Chen and Goodman, 1998, "An empirical study of smoothing techniques for language modeling", section
2.6), and :meth:`WordModel.correct` the noisy-channel choice of words: each decoded word (or two decoded words
joined) may become a word of the model's vocabulary a few character edits away, and the sentence kept is the one of
best ``weight * log p(words) - edits``. Candidates are found by ``rapidfuzz`` (Levenshtein distance).
:class:`WordScorer` puts the model inside the beam, character by character, with look-ahead (Hori et al., 2018).
"""

from __future__ import annotations

import bisect
import gzip
import math
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...models.decoding import PrefixScorer

__all__ = ["WordModel", "WordScorer", "DEFAULT_WORDS_WEIGHT", "DEFAULT_WORDS_FUSION"]

#: log-probability weight per character edit (chosen on generated sentences' validation split, training voices)
DEFAULT_WORDS_WEIGHT = 0.2
#: the word model's weight inside the beam (:class:`WordScorer`; chosen on generated sentences' validation split)
DEFAULT_WORDS_FUSION = 0.4
#: :class:`WordScorer`'s caches: at most this many floats of cumulative distributions (64 MB; one per context, as
#: long as the vocabulary), and of next-token scores (one row per state)
_CACHED_FLOATS = 2**23
_BOS, _EOS = "<s>", "</s>"


class WordModel:
    """A word trigram model of ``sentences`` (each already normalised: lower case, words split by spaces).

    ``p(w | u v) = max(c(u v w) - D, 0) / c(u v .) + D * N(u v .) / c(u v .) * p(w | v)``, likewise down to the
    unigram ``(c(w) + k) / (N + k (V + 1))`` (``+ 1``: any word not seen); a context never seen backs off whole.
    The probabilities of the vocabulary, the end and one unseen word sum to 1 in every context.
    """

    def __init__(self, sentences: Iterable[str], *, discount: float = 0.7, add: float = 0.1):
        if not 0 < discount < 1:
            raise ValueError(f"discount must be in (0, 1), got {discount}")
        self.discount, self.add = discount, add
        self.unigrams: Counter[str] = Counter()
        self.bigrams: Counter[tuple[str, str]] = Counter()
        self.trigrams: Counter[tuple[str, str, str]] = Counter()
        for sentence in sentences:
            words = [_BOS, _BOS, *sentence.split(), _EOS]
            if len(words) == 3:
                continue
            for i in range(2, len(words)):
                self.unigrams[words[i]] += 1
                self.bigrams[words[i - 1], words[i]] += 1
                self.trigrams[words[i - 2], words[i - 1], words[i]] += 1
        if not self.unigrams:
            raise ValueError("a word model needs at least one sentence")
        self._context: dict[tuple[str, ...], list[int]] = {}  # context -> [count, distinct followers]
        for grams in (self.bigrams, self.trigrams):
            for gram, count in grams.items():
                entry = self._context.setdefault(gram[:-1], [0, 0])
                entry[0] += count
                entry[1] += 1
        # the unigram's denominator: N + k (V + 1)
        self._unigram_total = sum(self.unigrams.values()) + add * (len(self.unigrams) + 1)
        self.vocab = sorted(w for w in self.unigrams if w != _EOS)
        self._candidates: dict[str, list[tuple[str, int]]] = {}

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kw) -> WordModel:
        """The model of a text file, one sentence per line (``.gz`` is read), each normalised as transcripts are
        (:func:`qkv.data.speech.normalize_transcript`). A missing or empty file is a ``ValueError`` naming it."""
        from ...data.speech import normalize_transcript

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such text file (the word model's sentences, one per line)")
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                lines = [normalize_transcript(line.split("\t")[0]) for line in f]
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a readable UTF-8 text file ({e})") from None
        sentences = [s for s in lines if s]
        if not sentences:
            raise ValueError(f"{path}: no sentence (the word model's sentences, one per line)")
        return cls(sentences, **kw)

    def prob(self, u: str, v: str, w: str) -> float:
        """``p(w | u v)`` (``u``, ``v``: ``"<s>"`` at the start of a sentence; ``w``: ``"</s>"`` its end)."""
        p = (self.unigrams.get(w, 0) + self.add) / self._unigram_total
        for context, grams, gram in (((v,), self.bigrams, (v, w)), ((u, v), self.trigrams, (u, v, w))):
            seen = self._context.get(context)
            if seen:
                count, followers = seen
                p = max(grams.get(gram, 0) - self.discount, 0) / count + self.discount * followers / count * p
        return p

    def candidates(self, word: str, limit: int = 12) -> list[tuple[str, int]]:
        """Up to ``limit`` words of the vocabulary at most half of ``word``'s length (at least 1) character edits
        away, with their edit counts, closest first."""
        if word not in self._candidates:
            from rapidfuzz import process
            from rapidfuzz.distance import Levenshtein

            found = process.extract(word, self.vocab, scorer=Levenshtein.distance, limit=limit,
                                    score_cutoff=max(1, len(word) // 2))
            self._candidates[word] = [(w, int(d)) for w, d, _ in found]
        return self._candidates[word]

    def correct(self, text: str, weight: float = DEFAULT_WORDS_WEIGHT, *, beam: int = 16) -> str:
        """``text``'s words, each (or two neighbours joined: "a way" -> "away") kept or replaced by a close word of
        the vocabulary: the sentence of highest ``weight * log p(sentence) - character edits``, searched left to
        right keeping ``beam`` partial sentences per decoded word. ``weight`` 0 returns ``text`` as it is (no word
        is worth an edit), as does an empty text."""
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        words = text.split()
        if not words or weight == 0:
            return text
        # partial sentences ending after decoded word i: (score, last two words, words so far)
        ends: dict[int, list[tuple[float, tuple[str, str], tuple[str, ...]]]] = {0: [(0.0, (_BOS, _BOS), ())]}
        for i in range(len(words)):
            kept = sorted(ends.pop(i), key=lambda h: -h[0])[:beam]  # every word is reached by one of span 1
            for span in (1, 2)[: len(words) - i]:
                heard = "".join(words[i:i + span])
                options = self.candidates(heard)
                if span == 1 and all(w != heard for w, _ in options):
                    options = [*options, (heard, 0)]  # a word the model does not know may stay as it is
                for score, (u, v), out in kept:
                    for w, edits in options:
                        ends.setdefault(i + span, []).append(
                            (score + weight * math.log(self.prob(u, v, w)) - edits, (v, w), (*out, w)))
        final = [(score + weight * math.log(self.prob(u, v, _EOS)), out) for score, (u, v), out in ends[len(words)]]
        return " ".join(max(final)[1])

    def distribution(self, u: str, v: str):
        """``p(w | u v)`` of every word of :attr:`vocab` (a float64 numpy array in its sorted order), computed as
        :meth:`prob` does, at once."""
        import numpy as np

        if not hasattr(self, "_followers"):
            index = {w: i for i, w in enumerate(self.vocab)}
            unigram = np.array([self.unigrams[w] + self.add for w in self.vocab], dtype=np.float64)
            self._unigram = unigram / self._unigram_total
            grouped: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
            for grams in (self.bigrams, self.trigrams):
                for gram, count in grams.items():
                    if gram[-1] in index:
                        ids, counts = grouped.setdefault(gram[:-1], ([], []))
                        ids.append(index[gram[-1]])
                        counts.append(count)
            self._followers = {c: (np.array(i), np.array(n, dtype=np.float64)) for c, (i, n) in grouped.items()}
        p = self._unigram
        for context in ((v,), (u, v)):
            seen = self._context.get(context)
            if seen:
                count, followers = seen
                p = self.discount * followers / count * p
                if context in self._followers:
                    ids, counts = self._followers[context]
                    p[ids] += (counts - self.discount) / count
        return p.copy() if p is self._unigram else p


class WordScorer(PrefixScorer):
    """The word model inside a character decoder's beam: a :class:`~qkv.models.decoding.PrefixScorer` adding
    ``weight * log p(word | two words before)`` over the characters of each word, with look-ahead.

    Hori, Cho and Watanabe, 2018, "End-to-end Speech Recognition with Word-based RNN Language Models"
    (https://arxiv.org/abs/1808.02608), look-ahead word model, with a trigram: a character that extends the word
    being spelt to the prefix ``s`` scores ``log L(s) - log L(s minus its last character)``, where ``L(s)`` is the
    probability of all the words of the vocabulary that begin with ``s`` after the words before (``L("") = 1``); the
    space or end that closes it scores ``log p(word) - log L(word)``, so a known word costs exactly its
    ``log p(word | u v)`` by the time it ends; a word leaving the vocabulary costs the model's unseen-word probability
    once, its remaining characters nothing; the end also scores ``log p(</s> | v w)``.

    ``tokens``: the decoder's token strings by id (characters; ``" "`` separates words); ``eos_id`` its end.
    Any other token (``<unk>``) is spelt like a character that no word of the vocabulary has there.
    """

    def __init__(self, words: WordModel, tokens: list[str], *, weight: float, eos_id: int):
        if weight < 0:
            raise ValueError(f"the word model's weight in the beam must be >= 0, got {weight}")
        self.words, self.weight, self.eos_id = words, float(weight), eos_id
        self.tokens = list(tokens)
        self.space = self.tokens.index(" ") if " " in self.tokens else -1
        # every other token spells: a special one (<unk>) leaves the vocabulary like a letter no word has there
        self.letters = [(i, t) for i, t in enumerate(self.tokens) if i not in (self.space, eos_id)]
        # caches: the cumulative distributions of the latest contexts (each as long as the vocabulary), the
        # vocabulary's range of each prefix, the state after each prefix of the last step, the scores of each state
        self._cum: dict[tuple[str, str], Any] = {}
        self._ranges: dict[str, tuple[int, int]] = {}
        self._parsed: dict[tuple[int, ...], tuple[str, str, str, bool]] = {}
        self._scores: dict[tuple[str, str, str, bool], Any] = {}

    def initial_state(self) -> None:
        return None

    def _range(self, prefix: str) -> tuple[int, int]:
        if prefix not in self._ranges:
            vocab = self.words.vocab
            self._ranges[prefix] = (bisect.bisect_left(vocab, prefix), bisect.bisect_left(vocab, prefix + "\U0010ffff"))
        return self._ranges[prefix]

    def _ahead(self, u: str, v: str, prefix: str) -> float:
        """``L(prefix)``: the probability of the words beginning with ``prefix`` after ``u v``."""
        import numpy as np

        if not prefix:
            return 1.0
        if (u, v) not in self._cum:
            if len(self._cum) >= max(16, _CACHED_FLOATS // (len(self.words.vocab) + 1)):  # the oldest context goes
                del self._cum[next(iter(self._cum))]
            self._cum[u, v] = np.concatenate([[0.0], np.cumsum(self.words.distribution(u, v))])
        lo, hi = self._range(prefix)
        cum = self._cum[u, v]
        return float(cum[hi] - cum[lo])

    def _parse(self, ids: tuple[int, ...], before: dict) -> tuple[str, str, str, bool]:
        """``(u, v, word being spelt, whether it left the vocabulary)`` after the tokens ``ids``, from the state of
        ``ids[:-1]`` in ``before`` (the previous step's) where it is there."""
        if not ids:
            return _BOS, _BOS, "", False
        parent = before.get(ids[:-1])
        u, v, partial, outside = parent if parent is not None else self._parse(ids[:-1], {})
        token = ids[-1]
        if token == self.space:
            return v, partial, "", False
        if 0 <= token < len(self.tokens) and token != self.eos_id:
            partial = partial + self.tokens[token]
            outside = outside or self._ahead(u, v, partial) <= 0
        return u, v, partial, outside

    def _row(self, key: tuple[str, str, str, bool]):
        """The scores ``(V,)`` of every next token after the state ``key`` (weighted)."""
        if key not in self._scores:
            if len(self._scores) * len(self.tokens) >= _CACHED_FLOATS:
                self._scores.clear()
            u, v, partial, outside = key
            scores = [0.0] * len(self.tokens)
            unseen = math.log(self.words.prob(u, v, "\x00"))
            here = self._ahead(u, v, partial)
            if not outside:
                for i, t in self.letters:
                    ahead = self._ahead(u, v, partial + t)
                    scores[i] = math.log(ahead / here) if ahead > 0 else unseen - math.log(here)
            if outside:
                close, w = 0.0, partial
            elif not partial:  # nothing spelt: an empty word
                close, w = unseen, ""
            elif self._exact(partial):
                close, w = math.log(self.words.prob(u, v, partial) / here), partial
            else:  # a prefix, not a word
                close, w = unseen - math.log(here), partial
            close = self.weight * close
            if self.space >= 0:
                scores[self.space] = close
            if 0 <= self.eos_id < len(scores):
                scores[self.eos_id] = (close + self.weight * math.log(self.words.prob(v, w, _EOS))) if partial \
                    else self.weight * math.log(self.words.prob(u, v, _EOS))
            for i, _ in self.letters:
                scores[i] *= self.weight
            self._scores[key] = torch.tensor(scores)
        return self._scores[key]

    def _exact(self, word: str) -> bool:
        lo, hi = self._range(word)
        return lo < hi and self.words.vocab[lo] == word

    def __call__(self, prefixes: Tensor, state: None) -> tuple[Tensor, None]:
        before, self._parsed = self._parsed, {}  # only the last step's prefixes are extended
        keys = [tuple(p) for p in prefixes.tolist()]
        for key in keys:
            if key not in self._parsed:
                self._parsed[key] = self._parse(key, before)
        return torch.stack([self._row(self._parsed[key]) for key in keys]).to(prefixes.device), None
