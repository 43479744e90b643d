"""Words after spelling: a word trigram model that corrects a character decoder's transcript.

A character decoder writes words as it hears them ("to an a lock"); a word model of the language knows which words
exist and which follow which ("to have a look"). :class:`WordModel` is a trigram model with interpolated absolute
discounting (Ney, Essen and Kneser, 1994, "On structuring probabilistic dependences in stochastic language
modelling"; Chen and Goodman, 1998, "An empirical study of smoothing techniques for language modeling", section
2.6), and :meth:`WordModel.correct` the noisy-channel choice of words: each decoded word (or two decoded words
joined) may become a word of the model's vocabulary a few character edits away, and the sentence kept is the one of
best ``weight * log p(words) - edits``. Candidates are found by ``rapidfuzz`` (Levenshtein distance).
"""

from __future__ import annotations

import gzip
import math
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

__all__ = ["WordModel", "DEFAULT_WORDS_WEIGHT"]

#: log-probability weight per character edit (chosen on generated sentences' validation split, training voices)
DEFAULT_WORDS_WEIGHT = 0.2
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
