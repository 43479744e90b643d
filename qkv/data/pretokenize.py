"""Text as people type it, cut into word-level pieces: CJK one character at a time, Latin (and other spaced
scripts') words and numbers whole, every other mark on its own, and compatibility forms normalised (NFKC).

Chinese and Japanese put no spaces between words, and whether a learner types some (``质能方程 由 爱因斯坦``) must not
matter: every Han, kana, Hangul and Bopomofo character is a piece of its own, so spaces between them change nothing.
A word segmenter (jieba, MeCab) would give fewer, more meaningful pieces, at the price of a dependency, a dictionary
and errors on the names and numbers that questions ask about; characters are what Chinese readers are usually
trained on (e.g. Chinese BERT's vocabulary), and a model reading them learns their combinations.

Pieces are found on the original text, so each keeps its ``(start, end)`` offsets into it (an answer is the text's
own characters), and its string is then normalised: NFKC turns full-width letters, digits and punctuation
(``Ｅ＝ｍｃ２``, ``１９０５``, ``？``) into their ASCII forms, half-width katakana into full-width, superscripts into
digits (``mc²`` -> ``mc2``), so ``１９０５年`` and ``1905年`` give the same pieces: ``1905``, ``年``.

Rules, in order, on the original text:

- a CJK character (with any combining marks, voiced-sound marks, or Hangul vowels and finals after it): one piece;
- a word: letters, digits, underscores and combining marks of any other script, kept whole, joined across an
  apostrophe between letters (``don't``, ``l'homme``) and across ``.`` or ``,`` between digits (``3.14``,
  ``1,000``): ``1905年`` is ``1905`` then ``年``;
- white space, control characters and invisible format characters (zero-width space, joiners, soft hyphen,
  BOM): nothing;
- any other character (punctuation, symbols, emoji): one piece each.

Example:
    >>> [t for _, _, t in split_mixed("质能方程由爱因斯坦于１９０５年提出。")][-6:]
    ['于', '1905', '年', '提', '出', '。']
    >>> [t for _, _, t in split_mixed("E=mc² isn't 3.14")]
    ['E', '=', 'mc2', "isn't", '3.14']
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["split_mixed", "mixed_tokens", "join_mixed", "is_cjk"]

# Han (with extensions and compatibility ideographs), kana (and half-width katakana), Hangul, Bopomofo, and the
# ideographic iteration marks and numerals
_CJK_RANGES = ("\u1100-\u11ff\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u303b\u303c\u3040-\u30ff"
               "\u3100-\u312f\u3130-\u318f\u31a0-\u31bf\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
               "\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U000323af")
# what joins the character before it into one piece: Hangul vowels and finals, (half-width) voiced-sound marks
_CJK_TAIL = "\u1160-\u11ff\ud7b0-\ud7ff\u3099\u309a\uff9e\uff9f"
_INVISIBLE = "\x00-\x1f\x7f-\x9f\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff"  # and controls


@functools.cache
def _marks() -> str:
    """Ranges of every combining mark (categories Mn, Mc, Me), which Python's ``\\w`` does not match."""
    ranges, start, prev = [], None, None
    for cp in list(range(0x20000)) + list(range(0xE0100, 0xE01F0)):
        if unicodedata.category(chr(cp))[0] == "M":
            if start is None or cp != prev + 1:
                if start is not None:
                    ranges.append((start, prev))
                start = cp
            prev = cp
    ranges.append((start, prev))
    return "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in ranges)


# an apostrophe between letters, a point or comma between digits (full-width ones too)
_JOIN = "(?:(?<=\\w)['’＇](?=\\w)|(?<=\\d)[.,．，](?=\\d))"
# the same rules on ASCII text, ten times faster
_ASCII = re.compile(f"\\w+(?:{_JOIN}\\w+)*|[^\\s\x00-\x1f\x7f]", re.ASCII)


@functools.cache
def _pattern() -> re.Pattern:
    cjk, marks = f"[{_CJK_RANGES}]", _marks()
    letter = f"(?:(?!{cjk})\\w|[＿{marks}])"
    # _JOIN with the full-width low line and combining marks counted as word characters on both sides
    join = f"(?:(?<=[\\w＿{marks}])['’＇](?=[\\w＿{marks}])|(?<=\\d)[.,．，](?=\\d))"
    return re.compile(f"{cjk}[{_CJK_TAIL}{marks}]*|{letter}+(?:{join}{letter}+)*|(?![{_INVISIBLE}])\\S[{marks}]*")


def is_cjk(char: str) -> bool:
    """Whether ``char`` (one character) is a Han, kana, Hangul or Bopomofo character."""
    return re.fullmatch(f"[{_CJK_RANGES}]", char) is not None


def _normalize(piece: str) -> str:
    if piece.isascii():
        return piece
    piece = unicodedata.normalize("NFKC", piece).strip() or piece
    return piece.replace("’", "'") if len(piece) > 1 else piece  # it’s as it's; a lone ’ stays a quote


def split_mixed(text: str, *, lowercase: bool = False) -> list[tuple[int, int, str]]:
    """The pieces of ``text`` as ``(start, end, string)``: ``text[start:end]`` is the piece as typed, ``string``
    its NFKC form (lower-cased with ``lowercase``); see the module docstring for the rules."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = []
    for m in (_ASCII if text.isascii() else _pattern()).finditer(text):
        piece = _normalize(m.group())
        out.append((m.start(), m.end(), piece.lower() if lowercase else piece))
    return out


def mixed_tokens(text: str, *, lowercase: bool = False) -> list[str]:
    """The strings of :func:`split_mixed`'s pieces (faster, without the offsets)."""
    if isinstance(text, str) and text.isascii():
        return _ASCII.findall(text.lower() if lowercase else text)
    return [piece for _, _, piece in split_mixed(text, lowercase=lowercase)]


def _glued(piece: str) -> bool:
    """Whether ``piece`` is written without spaces around it (CJK characters and CJK punctuation)."""
    c = piece[:1]
    return bool(c) and (is_cjk(c) or "\u3000" <= c <= "\u303f" or "\uff00" <= c <= "\uffef")


def join_mixed(pieces: list[str]) -> str:
    """Pieces back into text: a space between two pieces unless one of them is CJK (``1905 年`` -> ``1905年``)."""
    out: list[str] = []
    for i, p in enumerate(pieces):
        if i and not (_glued(p) or _glued(pieces[i - 1])):
            out.append(" ")
        out.append(p)
    return "".join(out)

