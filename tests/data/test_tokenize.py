"""Tokenisers: round trips, special ids, save/load as JSON, the three kinds behind one interface."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CharTokenizer,
    SubwordTokenizer,
    WordTokenizer,
    load_tokenizer,
    make_dates,
    train_tokenizer,
)
from tests import FIXTURES

FRENCH = [
    "Je suis là.", "Il fait beau aujourd'hui.", "Qu'est-ce que c'est ?", "Tom a chassé Jerry.",
    "Nous avons mangé des pommes.", "Elle ne veut pas partir.", "Où est la gare ?", "C'est très bien !",
    "Le chat dort sur le canapé.", "Ils sont allés à la plage hier.",
] * 20


@pytest.fixture(scope="module")
def dates():
    return make_dates(2000, seed=0)


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def subword(request):
    return SubwordTokenizer.train(FRENCH, vocab_size=120, model=request.param, min_freq=1)


def test_special_ids_are_the_same_everywhere(dates, subword):
    toks = [CharTokenizer.train(s for s, _ in dates), WordTokenizer.train(FRENCH, min_freq=1), subword]
    for tok in toks:
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
        assert tok.tokens_of_ids([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
        ids = tok.encode(FRENCH[0] if tok is not toks[0] else dates[0][0], add_bos=True, add_eos=True)
        assert ids[0] == BOS_ID and ids[-1] == EOS_ID and PAD_ID not in ids
        assert all(0 <= i < tok.vocab_size for i in ids)


def test_char_round_trip_on_every_script(dates):
    tok = CharTokenizer.train(s for s, _ in dates)
    for src, _ in dates:
        ids = tok.encode(src)
        assert UNK_ID not in ids
        assert tok.decode(ids) == src
        assert tok.tokens(src) == list(src) == tok.tokens_of_ids(ids)
    assert "年" in tok.tokens("2019年") and tok.decode(tok.encode("星期一")) == "星期一"


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
@settings(max_examples=200, deadline=None)
def test_char_round_trip_property(text):
    tok = CharTokenizer.train([text])
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text


def test_char_unknown_and_decode_rules():
    tok = CharTokenizer.train(["abc"])
    assert tok.encode("abz") == [4, 5, UNK_ID]
    assert tok.decode([BOS_ID, 4, 5, EOS_ID, 6, PAD_ID]) == "ab"  # stops at <eos>
    assert tok.decode([4, EOS_ID, 6, PAD_ID], stop_at_eos=False) == "ac"
    assert tok.decode([4, UNK_ID]) == "a<unk>"
    with pytest.raises(ValueError):
        tok.decode([99])


def test_subword_round_trip_normalised(subword):
    for text in FRENCH[:10] + ["  Je   suis\u00a0là. ", "Tom a mangé."]:
        ids = subword.encode(text)
        assert subword.decode(ids) == subword.normalize(text) == " ".join(text.split())
        assert len(subword.tokens(text)) == len(ids)
    assert subword.encode_batch(FRENCH[:3], add_eos=True) == [subword.encode(t, add_eos=True) for t in FRENCH[:3]]
    assert UNK_ID in subword.encode("Ωmega")  # unseen character


def test_word_tokenizer():
    tok = WordTokenizer.train(["Great movie!", "great acting, bad plot", "A bad, bad film."], min_freq=2)
    assert tok.tokens("Great, BAD movie!") == ["great", ",", "bad", "movie", "!"]
    ids = tok.encode("Great, BAD movie!")
    assert ids[1:3] == [tok.encode(",")[0], tok.encode("bad")[0]] and ids[3] == UNK_ID  # 'movie' seen once
    assert tok.decode(tok.encode("bad, great")) == "bad , great"
    cased = WordTokenizer.train(["Bad bad"], min_freq=1, lowercase=False)
    assert cased.vocab_size == 6
    assert WordTokenizer.train(["a b c d e f"] * 3, min_freq=1, max_size=6).vocab_size == 6


@pytest.mark.parametrize("kind", ["char", "word", "bpe", "unigram"])
def test_save_load_equality(tmp_path, kind):
    kwargs = {"vocab_size": 100, "min_freq": 1} if kind in ("bpe", "unigram") else {}
    tok = train_tokenizer(kind, FRENCH, **kwargs)
    tok.save(tmp_path / "tok")
    files = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert all(f.endswith(".json") for f in files)
    if kind in ("bpe", "unigram"):
        assert "tokenizer.json" in files
    back = load_tokenizer(tmp_path / "tok")
    assert type(back) is type(tok) and back == tok and back.vocab_size == tok.vocab_size
    for text in FRENCH[:10] + ["texte inconnu Ω"]:
        assert back.encode(text) == tok.encode(text)
        assert back.tokens(text) == tok.tokens(text)
    assert type(tok).load(tmp_path / "tok") == tok


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)
    CharTokenizer.train(["ab"]).save(tmp_path)
    with pytest.raises(ValueError, match="CharTokenizer"):
        WordTokenizer.load(tmp_path)
    cfg = json.loads((tmp_path / "qkv_tokenizer.json").read_text())
    cfg["specials"] = ["<s>", "</s>", "<pad>", "<unk>"]
    (tmp_path / "qkv_tokenizer.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="special"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError):
        train_tokenizer("sentencepiece", ["a"])


# --- mixed text: CJK one character at a time, Latin words and numbers whole, full-width forms normalised --------
def words(text, **kw):
    return WordTokenizer([], mixed=True, **kw).tokens(text)


@pytest.mark.parametrize("text, expected", [
    ("When was the Eiffel Tower completed?", ["when", "was", "the", "eiffel", "tower", "completed", "?"]),
    ("It isn't 3.14 or 1,000, it’s 42.", ["it", "isn't", "3.14", "or", "1,000", ",", "it's", "42", "."]),
    ("质能方程是什么时候提出的？", list("质能方程是什么时候提出的") + ["?"]),
    ("爱因斯坦于1905年提出。", list("爱因斯坦于") + ["1905", "年", "提", "出", "。"]),
    ("１９０５年３月", ["1905", "年", "3", "月"]),
    ("E=mc²", ["e", "=", "mc2"]),
    ("Ｅ＝ｍｃ２（ＡＢＣ）！", ["e", "=", "mc2", "(", "abc", ")", "!"]),
    ("iPhone手机 ｶﾞｷﾞ 한국어", ["iphone", "手", "机", "ガ", "ギ", "한", "국", "어"]),
    ("café nai\u0308ve नमस्ते", ["café", "naïve", "नमस्ते"]),
    ("zero\u200bwidth\ufeff l'homme", ["zero", "width", "l'homme"]),
])
def test_mixed_words_on_fresh_text(text, expected):
    assert words(text) == expected


def test_spaces_between_cjk_characters_change_nothing():
    assert words("质能方程 由 爱因斯坦") == words("质能方程由爱因斯坦") == list("质能方程由爱因斯坦")
    assert words("质能方程由 Einstein 于 1905 年") == words("质能方程由Einstein于1905年")
    assert words("東京 タワー は 1958 年") == words("東京タワーは1958年")


CJK = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF) | st.sampled_from("ぁあアカ한국々〇")
LATIN = st.text(alphabet="abcXYZ019", min_size=1, max_size=6)


@given(st.lists(CJK | LATIN, min_size=1, max_size=12),
       st.lists(st.sampled_from(["", " ", "\u3000", "  \t"]), min_size=12, max_size=12))
@settings(max_examples=200, deadline=None)
def test_spaces_between_cjk_property(parts, gaps):
    """Any white space (ideographic spaces too), or none, where a CJK character meets anything: the same words."""
    def cjk(p):
        return len(p) == 1 and not p.isascii()

    tight = loose = parts[0]
    for i in range(1, len(parts)):
        latin_meets_latin = not cjk(parts[i]) and not cjk(parts[i - 1])
        tight += (" " if latin_meets_latin else "") + parts[i]
        loose += (" " + gaps[i] if latin_meets_latin else gaps[i]) + parts[i]
    assert words(loose) == words(tight) == [p.lower() for p in parts]


FULL = {chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)}  # ASCII '!'..'~' and their full-width forms


@given(st.text(alphabet="".join(FULL) + " ", max_size=40))
@settings(max_examples=300, deadline=None)
def test_full_width_text_gives_the_ascii_words(text):
    wide = "".join(FULL.get(c, "\u3000") for c in text)
    assert words(wide) == words(text)
    assert words(wide, lowercase=False) == words(text, lowercase=False)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
@settings(max_examples=300, deadline=None)
def test_mixed_spans_are_the_words_as_typed(text):
    from qkv.data.pretokenize import split_mixed

    tok = WordTokenizer([], mixed=True, lowercase=False)
    spans, pieces = tok.spans(text), tok.tokens(text)
    assert len(spans) == len(pieces) == len(tok.encode(text))
    assert [(a, b) for a, b, _ in split_mixed(text)] == spans
    assert all(0 <= a < b <= len(text) and text[a:b].strip() for a, b in spans)
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:], strict=False))
    assert not any(c.isalnum() and not any(a <= i < b for a, b in spans) for i, c in enumerate(text))


def test_mixed_tokenizer_trains_decodes_saves_and_loads(tmp_path):
    corpus = ["质能方程由爱因斯坦于1905年提出。", "The Eiffel Tower was completed in 1889.",
              "東京タワーは1958年に完成した。"]
    tok = WordTokenizer.train(corpus, min_freq=1)
    assert tok.mixed and tok.encode("质能方程 由 爱因斯坦") == tok.encode("质能方程由爱因斯坦")
    assert UNK_ID not in tok.encode("１９０５年　Ｅｉｆｆｅｌ　Ｔｏｗｅｒ")
    assert tok.decode(tok.encode("爱因斯坦于1905年提出。")) == "爱因斯坦于1905年提出。"
    assert tok.decode(tok.encode("the Eiffel Tower. 1889")) == "the eiffel tower . 1889"
    tok.save(tmp_path)
    assert json.loads((tmp_path / "qkv_tokenizer.json").read_text(encoding="utf-8"))["mixed"] is True
    back = load_tokenizer(tmp_path)
    assert back == tok and back.mixed
    for text in corpus + ["质能方程是什么时候提出的？", "When was it completed?"]:
        assert back.encode(text) == tok.encode(text) and back.tokens(text) == tok.tokens(text)
    assert train_tokenizer("word", corpus, min_freq=1) == tok


def test_a_word_tokenizer_saved_before_mixed_splits_as_before(tmp_path):
    old = {"type": "word", "format_version": 1, "specials": ["<pad>", "<bos>", "<eos>", "<unk>"],
           "lowercase": True, "words": ["1905年", "爱因斯坦于", "is", "the"]}
    (tmp_path / "qkv_tokenizer.json").write_text(json.dumps(old, ensure_ascii=False), encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    assert not tok.mixed and tok.tokens("爱因斯坦于1905年") == ["爱因斯坦于1905年"]
    assert tok.tokens("the １９０５年 is") == ["the", "１９０５年", "is"] and tok.encode("1905年 is") == [4, 6]
    assert tok.decode([5, 4]) == "爱因斯坦于 1905年" and tok.spans("a 1905年") == [(0, 1), (2, 7)]
    assert WordTokenizer(["a"]) == WordTokenizer(["a"], mixed=False) != WordTokenizer(["a"], mixed=True)


def test_the_v1_runs_word_tokenizers_encode_as_before():
    import re

    legacy = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")  # the expression 0.1.0 split with
    for run in ("sentiment-bigru", "sentiment-transformer"):
        d = FIXTURES / "v1" / run / "best" / "assets" / "tokenizer"
        tok = load_tokenizer(d)
        words = json.loads((d / "qkv_tokenizer.json").read_text(encoding="utf-8"))["words"]
        assert not tok.mixed
        for text in ["a wonderful moving story.", "Brilliant!", "它很好看 1905年", "Ｅ＝ｍｃ２, isn't it?"]:
            want = [words.index(w) + 4 if w in words else UNK_ID for w in legacy.findall(text.lower())]
            assert tok.encode(text) == want


def test_the_pretokenizer_docstring_examples():
    import doctest

    import qkv.data.pretokenize as module

    assert doctest.testmod(module).failed == 0


@given(st.text(alphabet=st.sampled_from("ab'’s S.,年 \t"), max_size=30) | st.text(max_size=30))
@settings(max_examples=300, deadline=None)
def test_clitics_refine_the_words_and_keep_the_offsets(text):
    plain = WordTokenizer([], mixed=True, lowercase=True)
    tok = WordTokenizer([], mixed=True, lowercase=True, clitics=True)
    spans, pieces = tok.spans(text), tok.tokens(text)
    assert len(spans) == len(pieces) == len(tok.encode(text))
    assert all(0 <= a < b <= len(text) for a, b in spans)
    # every word of the plain split is one word of the clitic split, or a word followed by its 's
    i = 0
    for (a, b), w in zip(plain.spans(text), plain.tokens(text), strict=True):
        if spans[i] == (a, b):
            assert pieces[i] == w
            i += 1
        else:
            (a1, b1), (a2, b2) = spans[i], spans[i + 1]
            assert a1 == a and b1 == a2 and b2 == b and pieces[i] + pieces[i + 1] == w
            assert pieces[i + 1] in ("'s", "’s") and pieces[i]
            i += 2
    assert i == len(spans)


def test_clitics_split_the_possessive_and_survive_save_and_load(tmp_path):
    tok = WordTokenizer.train(["The tower was built by Gustave Eiffel's company.", "It's Eiffel."], min_freq=1,
                              clitics=True)
    text = "Gustave Eiffel’s company, it's O'Neil's."
    assert tok.tokens(text) == ["gustave", "eiffel", "'s", "company", ",", "it", "'s", "o'neil", "'s", "."]
    assert [text[a:b] for a, b in tok.spans(text)][:3] == ["Gustave", "Eiffel", "’s"]
    assert tok.encode("Eiffel's")[0] == tok.encode("Eiffel")[0] != UNK_ID
    assert tok.decode(tok.encode("Eiffel's company, it's")) == "eiffel's company <unk> it's"
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert back.clitics and back == tok and back.encode(text) == tok.encode(text)
    # without the option (every tokeniser saved before it) a word keeps its 's
    plain = WordTokenizer.train(["Eiffel's company"], min_freq=1)
    assert plain.tokens("Eiffel's company") == ["eiffel's", "company"] and plain != WordTokenizer(
        plain.tokens_of_ids(range(4, plain.vocab_size)), mixed=True, clitics=True)
    plain.save(tmp_path / "plain")
    assert "clitics" not in json.loads((tmp_path / "plain" / "qkv_tokenizer.json").read_text(encoding="utf-8"))
    assert not load_tokenizer(tmp_path / "plain").clitics
