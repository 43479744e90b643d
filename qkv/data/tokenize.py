"""Tokenisers with one small interface: characters (dates, any script), subwords (BPE or unigram, trained with
Hugging Face ``tokenizers``) and words (with a frequency cut-off; CJK one character at a time, Latin words and
numbers whole, full-width forms normalised: :mod:`qkv.data.pretokenize`).

Every tokeniser has the same four special tokens at the same ids (``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2,
``<unk>`` 3), ``encode``/``decode``/``tokens``, ``vocab_size``, and ``save(dir)``/``load_tokenizer(dir)`` as JSON
files only (no pickle): ``qkv_tokenizer.json`` describes the tokeniser, and the subword one adds the library's own
``tokenizer.json``.

Example::

    tok = CharTokenizer.train(["2019-12-30", "lundi 30 décembre 2019"])
    tok.encode("2019", add_eos=True)        # [.., .., .., .., 2]
    sub = SubwordTokenizer.train(corpus_train_targets, vocab_size=8000)
    sub.tokens("Je suis là.")               # ['▁Je', '▁suis', '▁là.']
    tok.save("out/tokenizer"); load_tokenizer("out/tokenizer")
"""

from __future__ import annotations

import abc
import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from .pretokenize import join_mixed, mixed_tokens, split_mixed

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
CONFIG_FILE = "qkv_tokenizer.json"
FORMAT_VERSION = 1


class Tokenizer(abc.ABC):
    """Common interface. Ids ``0..3`` are ``<pad> <bos> <eos> <unk>`` in every tokeniser."""

    kind: str = ""
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    specials = SPECIALS

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def _encode(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def _decode(self, ids: list[int]) -> str: ...

    @abc.abstractmethod
    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (one per id of ``encode(text)``), e.g. to label a heat map."""

    @abc.abstractmethod
    def _config(self) -> dict: ...

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self._encode(text)
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]

    def decode(self, ids: Iterable[int], *, stop_at_eos: bool = True) -> str:
        """Text of ``ids``; ``<pad>`` and ``<bos>`` are dropped, and the text ends at the first ``<eos>``
        (or ``<eos>`` is dropped too, with ``stop_at_eos=False``). ``<unk>`` stays visible."""
        kept = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                if stop_at_eos:
                    break
                continue
            if i in (self.pad_id, self.bos_id):
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} out of range for a vocabulary of {self.vocab_size}")
            kept.append(i)
        return self._decode(kept)

    def id_to_token(self, i: int) -> str:
        return self.tokens_of_ids([i])[0]

    @abc.abstractmethod
    def tokens_of_ids(self, ids: Sequence[int]) -> list[str]:
        """The token string of each id (special tokens included), for labelling decoder outputs."""

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the tokeniser as JSON file(s) in ``directory`` (created if needed); returns the directory."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = {"type": self.kind, "format_version": FORMAT_VERSION, "specials": list(SPECIALS), **self._config()}
        _write_json(d / CONFIG_FILE, config)
        return d

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._config() == self._config()

    def __hash__(self) -> int:
        return hash((self.kind, self.vocab_size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _check_specials(config: dict, where: Path) -> None:
    if config.get("specials", list(SPECIALS)) != list(SPECIALS):
        raise ValueError(f"{where}: special tokens {config.get('specials')} differ from {list(SPECIALS)}")
    if config.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise ValueError(f"{where}: format_version {config['format_version']} is newer than this qkv reads")


class CharTokenizer(Tokenizer):
    """One id per Unicode code point seen in training (CJK, Arabic, marks included); others map to ``<unk>``.

    ``decode(encode(x)) == x`` for any ``x`` made of known characters.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        chars = list(dict.fromkeys(chars))
        for c in chars:
            if len(c) != 1:
                raise ValueError(f"CharTokenizer vocabulary entries must be single characters, got {c!r}")
        self._chars = chars
        self._index = {c: i + len(SPECIALS) for i, c in enumerate(chars)}

    @classmethod
    def train(cls, texts: Iterable[str], *, min_freq: int = 1, extra_chars: str = "") -> CharTokenizer:
        """The characters of ``texts`` that occur at least ``min_freq`` times (sorted by code point)."""
        counts: Counter[str] = Counter()
        for t in texts:
            counts.update(t)
        chars = sorted({c for c, n in counts.items() if n >= min_freq} | set(extra_chars))
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self._chars)

    def _encode(self, text: str) -> list[int]:
        get = self._index.get
        return [get(c, UNK_ID) for c in text]

    def _decode(self, ids: list[int]) -> str:
        return "".join(self.tokens_of_ids(ids))

    def tokens(self, text: str) -> list[str]:
        return [c if c in self._index else UNK for c in text]

    def tokens_of_ids(self, ids: Sequence[int]) -> list[str]:
        n = len(SPECIALS)
        return [SPECIALS[i] if i < n else self._chars[i - n] for i in (int(i) for i in ids)]

    def _config(self) -> dict:
        return {"chars": self._chars}

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        return _expect(load_tokenizer(directory), cls)


_WORD_RE = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")
_CLITIC = r"['’][sS]"  # the possessive (or "is") clitic: "Eiffel's", "it's"
_CLITIC_RE = re.compile(rf"(?<=\w){_CLITIC}\Z")  # ... at the end of a word
_CLITIC_TOKEN = re.compile(_CLITIC)


def _split_clitics(pieces: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """``(start, end, string)`` pieces with a word's final ``'s`` made a piece of its own (``Eiffel's`` ->
    ``Eiffel``, ``'s``), as the Penn Treebank tokenises: the name and the clitic are two words."""
    out = []
    for a, b, w in pieces:
        m = _CLITIC_RE.search(w)
        if m is None or len(w) != b - a:  # (a piece whose normal form changed its length stays whole)
            out.append((a, b, w))
        else:
            out += [(a, a + m.start(), w[:m.start()]), (a + m.start(), b, w[m.start():])]
    return out


class WordTokenizer(Tokenizer):
    """Words and punctuation marks; a vocabulary of the words seen at least ``min_freq`` times (at most
    ``max_size``, most frequent first).

    With ``mixed`` (what :meth:`train` makes) text is cut by :func:`qkv.data.pretokenize.split_mixed`: every CJK
    character is a word of its own (so spaces between them change nothing), Latin words and numbers stay whole
    (``1905年`` -> ``1905``, ``年``), full-width letters, digits and punctuation are normalised (NFKC), and
    ``decode`` puts spaces between words but not around CJK. Without it (a tokeniser saved before ``mixed``
    existed) words are runs of word characters of the NFC text, CJK runs included, joined by spaces in ``decode``.
    With ``clitics`` a word's final ``'s`` is a word of its own (``Eiffel's company`` -> ``eiffel``, ``'s``,
    ``company``): a reader can then point at the name without the clitic.
    """

    kind = "word"

    def __init__(self, words: Iterable[str], *, lowercase: bool = True, mixed: bool = False, clitics: bool = False):
        self._words = list(dict.fromkeys(words))
        self.lowercase, self.mixed, self.clitics = lowercase, bool(mixed), bool(clitics)
        self._index = {w: i + len(SPECIALS) for i, w in enumerate(self._words)}

    def split(self, text: str) -> list[str]:
        if self.clitics:
            return [w for _, _, w in self._pieces(text)]
        if self.mixed:
            return mixed_tokens(text, lowercase=self.lowercase)
        text = unicodedata.normalize("NFC", text)
        if self.lowercase:
            text = text.lower()
        return _WORD_RE.findall(text)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` offsets of the words of ``text`` in ``text`` itself (one per id of ``encode(text)``:
        the words as typed, before normalisation), e.g. to print an answer span as the text's own characters."""
        if self.clitics:
            return [(a, b) for a, b, _ in self._pieces(text)]
        if self.mixed:
            return [(a, b) for a, b, _ in split_mixed(text)]
        return [m.span() for m in _WORD_RE.finditer(text)]

    def _pieces(self, text: str) -> list[tuple[int, int, str]]:
        """``(start, end, word)`` of ``text``'s words, the clitics split off (``clitics``)."""
        if self.mixed:
            pieces = split_mixed(text, lowercase=self.lowercase)
        else:
            pieces = [(m.start(), m.end(), unicodedata.normalize("NFC", m.group())) for m in _WORD_RE.finditer(text)]
            pieces = [(a, b, w.lower() if self.lowercase else w) for a, b, w in pieces]
        return _split_clitics(pieces)

    @classmethod
    def train(cls, texts: Iterable[str], *, min_freq: int = 2, max_size: int | None = None, lowercase: bool = True,
              mixed: bool = True, clitics: bool = False) -> WordTokenizer:
        probe = cls([], lowercase=lowercase, mixed=mixed, clitics=clitics)
        counts: Counter[str] = Counter()
        for t in texts:
            counts.update(probe.split(t))
        ranked = sorted((w for w, n in counts.items() if n >= min_freq and w not in SPECIALS),
                        key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(ranked, lowercase=lowercase, mixed=mixed, clitics=clitics)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self._words)

    def _encode(self, text: str) -> list[int]:
        get = self._index.get
        return [get(w, UNK_ID) for w in self.split(text)]

    def _decode(self, ids: list[int]) -> str:
        words = self.tokens_of_ids(ids)
        if self.clitics:  # "'s" back onto its word
            glued: list[str] = []
            for w in words:
                if glued and _CLITIC_TOKEN.fullmatch(w):
                    glued[-1] += w
                else:
                    glued.append(w)
            words = glued
        return join_mixed(words) if self.mixed else " ".join(words)

    def tokens(self, text: str) -> list[str]:
        return self.split(text)

    def tokens_of_ids(self, ids: Sequence[int]) -> list[str]:
        n = len(SPECIALS)
        return [SPECIALS[i] if i < n else self._words[i - n] for i in (int(i) for i in ids)]

    def _config(self) -> dict:
        config = {"lowercase": self.lowercase, "mixed": self.mixed, "words": self._words}
        if self.clitics:  # (absent: a tokeniser saved before the option, or without it)
            config["clitics"] = True
        return config

    @classmethod
    def load(cls, directory: str | os.PathLike) -> WordTokenizer:
        return _expect(load_tokenizer(directory), cls)


class SubwordTokenizer(Tokenizer):
    """BPE or unigram subwords trained with Hugging Face ``tokenizers``.

    Text is normalised (NFC, runs of white space -- no-break spaces included -- to one space, stripped), split at
    spaces with the ``▁`` marker (SentencePiece style), so ``decode(encode(x)) == normalize(x)`` for text made
    of characters seen in training.
    """

    kind = "subword"
    TOKENIZER_FILE = "tokenizer.json"

    def __init__(self, hf_tokenizer, *, model: str = "bpe"):
        self._tok = hf_tokenizer
        self.model = model
        for i, s in enumerate(SPECIALS):
            if hf_tokenizer.token_to_id(s) != i:
                raise ValueError(f"the tokenizers model must have {s!r} at id {i}")

    @staticmethod
    def _pipeline(model):
        from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

        tok = Tokenizer(model)
        tok.normalizer = normalizers.Sequence(
            [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
        )
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        return tok

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int = 8000,
        model: Literal["bpe", "unigram"] = "bpe",
        min_freq: int = 2,
        max_chars: int = 1000,
    ) -> SubwordTokenizer:
        """Learn ``vocab_size`` subwords from ``texts`` (the training split only).

        ``max_chars`` caps the initial alphabet (BPE keeps the most frequent characters; rarer ones become
        ``<unk>``).
        """
        from tokenizers import models, trainers

        if model == "bpe":
            tok = cls._pipeline(models.BPE(unk_token=UNK, fuse_unk=True))
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_freq,
                                          special_tokens=list(SPECIALS), limit_alphabet=max_chars,
                                          show_progress=False)
        elif model == "unigram":
            tok = cls._pipeline(models.Unigram())
            trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), unk_token=UNK,
                                              max_piece_length=16, show_progress=False)
        else:
            raise ValueError(f"model must be 'bpe' or 'unigram', got {model!r}")
        tok.train_from_iterator(texts, trainer)
        return cls(tok, model=model)

    def normalize(self, text: str) -> str:
        """The text as the tokeniser sees it; what ``decode(encode(text))`` gives back."""
        return self._tok.normalizer.normalize_str(text)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        head = [self.bos_id] if add_bos else []
        tail = [self.eos_id] if add_eos else []
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets: ~40% faster
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [head + e.ids + tail for e in encode(list(texts), add_special_tokens=False)]

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def tokens(self, text: str) -> list[str]:
        return self._tok.encode(text, add_special_tokens=False).tokens

    def tokens_of_ids(self, ids: Sequence[int]) -> list[str]:
        return [self._tok.id_to_token(int(i)) for i in ids]

    def _config(self) -> dict:
        return {"model": self.model, "tokenizer_file": self.TOKENIZER_FILE}

    def _canonical(self) -> dict:
        # unigram scores may change in the last bit through a save/load: compare floats to 12 digits
        return json.loads(self._tok.to_str(), parse_float=lambda x: round(float(x), 12))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.model == self.model and other._canonical() == self._canonical()

    __hash__ = Tokenizer.__hash__

    def save(self, directory: str | os.PathLike) -> Path:
        d = super().save(directory)
        tmp = d / (self.TOKENIZER_FILE + ".tmp")
        self._tok.save(str(tmp))
        os.replace(tmp, d / self.TOKENIZER_FILE)
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike) -> SubwordTokenizer:
        return _expect(load_tokenizer(directory), cls)


def _expect(tok: Tokenizer, cls: type) -> Tokenizer:
    if not isinstance(tok, cls):
        raise ValueError(f"expected a {cls.__name__}, the directory holds a {type(tok).__name__}")
    return tok


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Read a tokeniser written by ``save`` (any kind)."""
    d = Path(directory)
    path = d / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {d}")
    config = json.loads(path.read_text(encoding="utf-8"))
    _check_specials(config, path)
    kind = config.get("type")
    if kind == "char":
        return CharTokenizer(config["chars"])
    if kind == "word":
        return WordTokenizer(config["words"], lowercase=config["lowercase"], mixed=config.get("mixed", False),
                             clitics=config.get("clitics", False))
    if kind == "subword":
        from tokenizers import Tokenizer as HFTokenizer

        return SubwordTokenizer(HFTokenizer.from_file(str(d / config["tokenizer_file"])), model=config["model"])
    raise ValueError(f"{path}: unknown tokenizer type {kind!r}")


def train_tokenizer(kind: Literal["char", "subword", "bpe", "unigram", "word"], texts: Iterable[str],
                    **kwargs) -> Tokenizer:
    """Factory: ``train_tokenizer("bpe", texts, vocab_size=8000)``, ``train_tokenizer("char", texts)``, ..."""
    if kind == "char":
        return CharTokenizer.train(texts, **kwargs)
    if kind == "word":
        return WordTokenizer.train(texts, **kwargs)
    if kind in ("bpe", "unigram"):
        return SubwordTokenizer.train(texts, model=kind, **kwargs)
    if kind == "subword":
        return SubwordTokenizer.train(texts, **kwargs)
    raise ValueError(f"unknown tokenizer kind {kind!r}; one of 'char', 'subword', 'bpe', 'unigram', 'word'")
