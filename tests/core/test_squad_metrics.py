"""SQuAD's exact match and F1 against hand-computed cases (English words, Chinese characters), and the readers of
SQuAD v1.1 JSON and context<TAB>question<TAB>answer files with their errors."""

import gzip
import json
import math

import pytest

from qkv.apps.qa.squad import read_qa_file, read_qa_tsv, read_squad
from qkv.metrics import answer_exact_match, answer_f1, normalize_answer, squad_metrics


def test_normalize_as_the_official_script():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theory") == "theory"  # 'the' only as a word
    assert normalize_answer("1,905") == "1905"
    assert normalize_answer("爱因斯坦。", chars=True) == "爱因斯坦"
    assert normalize_answer("“1905” 年", chars=True) == "1905年"


def test_english_exact_match_and_f1_by_hand():
    assert answer_exact_match("the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    assert answer_exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    # prediction 'eiffel tower in paris' (4 tokens) vs gold 'eiffel tower' (2): common 2, P = 1/2, R = 1, F1 = 2/3
    assert answer_f1("The Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    # the best of several answers: 'paris' vs ['eiffel tower', 'paris france'] -> P = 1, R = 1/2 -> 2/3
    assert answer_f1("Paris", ["Eiffel Tower", "Paris, France"]) == pytest.approx(2 / 3)
    assert answer_f1("London", ["Paris"]) == 0.0
    # repeated tokens count as a multiset: 'x y y' vs 'y y z': common 2, P = R = 2/3
    assert answer_f1("x y y", "y y z") == pytest.approx(2 / 3)


def test_chinese_character_f1_by_hand():
    # '爱因斯坦于' (5 characters) vs '爱因斯坦' (4): common 4, P = 4/5, R = 1, F1 = 8/9
    assert answer_f1("爱因斯坦于", "爱因斯坦") == pytest.approx(8 / 9)
    assert answer_f1("1905年", "1905") == pytest.approx(2 * (4 / 5) / (4 / 5 + 1))
    assert answer_exact_match("爱因斯坦。", "爱因斯坦") == 1.0
    # as words, the two Chinese strings share nothing; forced characters give the same as auto
    assert answer_f1("爱因斯坦于", "爱因斯坦", chars=False) == 0.0
    assert answer_f1("爱因斯坦于", "爱因斯坦", chars=True) == pytest.approx(8 / 9)


def test_squad_metrics_means():
    m = squad_metrics(["Eiffel Tower", "Paris", "London"], [["the Eiffel Tower"], ["Paris, France"], ["Rome"]])
    assert m["exact_match"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert m["questions"] == 3
    assert math.isnan(squad_metrics([], [])["f1"])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        squad_metrics(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="no ground-truth"):
        answer_f1("a", [])


def _squad(paragraphs):
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_read_squad(tmp_path):
    ctx = "The mass-energy equation was proposed by Einstein in 1905."
    doc = _squad([{"context": ctx, "qas": [
        {"id": "1", "question": "When?", "answers": [{"text": "1905", "answer_start": ctx.index("1905")},
                                                     {"text": "in 1905", "answer_start": ctx.index("in 1905")}]},
        {"id": "2", "question": "Who?", "answers": [{"text": "Einstein", "answer_start": ctx.index("Einstein")}]}]}])
    path = tmp_path / "train.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    r = read_qa_file(path)
    assert [e.answers for e in r.examples] == [["1905", "in 1905"], ["Einstein"]]
    e = r.examples[0]
    assert e.context[e.answer_start:e.answer_end] == "1905" and r.skipped == 0


def test_read_squad_errors(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"data": [\n  {"paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json:2: not valid JSON"):
        read_squad(path)
    path.write_text(json.dumps({"articles": []}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"not a SQuAD file"):
        read_squad(path)
    path.write_text(json.dumps(_squad([{"context": "abc", "questions": []}])), encoding="utf-8")
    with pytest.raises(ValueError, match=r"data\[0\]\.paragraphs\[0\] needs a 'context' string and a 'qas' list"):
        read_squad(path)
    path.write_text(json.dumps(_squad([{"context": "abc", "qas": [
        {"question": "q", "answers": [{"text": "b", "answer_start": "1"}]}]}])), encoding="utf-8")
    with pytest.raises(ValueError, match=r"qas\[0\]: every answer needs 'text' .* 'answer_start' \(an integer\)"):
        read_squad(path)
    # an answer that is not at its offset: an error naming the place, or skipped and counted
    good = {"question": "q", "answers": [{"text": "c", "answer_start": 2}]}
    bad = {"question": "q", "answers": [{"text": "z", "answer_start": 0}]}
    path.write_text(json.dumps(_squad([{"context": "abc", "qas": [good, bad]}])), encoding="utf-8")
    with pytest.raises(ValueError, match=r"qas\[1\]: the answer 'z' is not at character 0 .*on_error skip"):
        read_squad(path)
    r = read_squad(path, on_error="skip")
    assert len(r.examples) == 1 and r.skipped == 1 and "qas[1]" in r.problems[0]
    path.write_text(json.dumps(_squad([{"context": "abc", "qas": [bad]}])), encoding="utf-8")
    with pytest.raises(ValueError, match=r"no usable questions \(1 skipped"):
        read_squad(path, on_error="skip")


def test_read_tsv_and_its_errors(tmp_path):
    path = tmp_path / "qa.tsv"
    path.write_text("context\tquestion\tanswer\n"
                    "质能方程由爱因斯坦于1905年提出。\t质能方程是什么时候提出的?\t1905\n"
                    "Paris is in France.\tWhere is Paris?\tFrance\tin France\n", encoding="utf-8")
    r = read_qa_tsv(path)
    assert [(e.answers, e.answer_start) for e in r.examples] == [(["1905"], 10), (["France", "in France"], 12)]
    path.write_text("a b c\tq\tb\nonly two\tcolumns\nx y\tq\tz\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"qa.tsv:2: expected context<TAB>question<TAB>answer, found 2"):
        read_qa_tsv(path)
    r = read_qa_tsv(path, on_error="skip")
    assert r.skipped == 2 and len(r.examples) == 1
    assert "qa.tsv:3: the answer 'z' is not a span of the context" in r.problems[1]
    with pytest.raises(ValueError, match="on_error must be"):
        read_qa_tsv(path, on_error="ignore")
    path.write_bytes(b"a\tb\tc\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"qa.tsv:2: not UTF-8"):
        read_qa_tsv(path, on_error="skip")
