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
