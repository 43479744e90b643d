"""Long contexts read in overlapping windows, questions cut with a warning, and text as people type it (mixed
English and Chinese, with or without spaces between CJK characters, full-width digits), on a stub reader whose
logits peak at known tokens: the window mapping is checked exactly."""

import logging

import pytest
import torch
from torch import nn

from qkv.apps import ViewInput
from qkv.apps.qa import QAOptions, QATask, Reader
from qkv.apps.qa.decode import predict_examples
from qkv.apps.qa.encode import crop, encode_example, training_window, windows
from qkv.capture import capture_attention
from qkv.data.facts import QACorpus, QAExample
from qkv.data.tokenize import WordTokenizer
from qkv.functional import weighted_sum
from qkv.models.reading import ReaderOutput

FILLER = ["the", "cat", "sat", "on", "a", "mat", "near", "the", "old", "wall", "while", "rain", "fell"]


class PeakReader(nn.Module):
    """Start and end logits ``peaks[id]`` at the context tokens of those ids, 0 elsewhere; the attention is their
    softmax (through :func:`qkv.weighted_sum`, so a capture records it)."""

    def __init__(self, peaks: dict[int, float]):
        super().__init__()
        self.peaks = peaks
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, context, context_mask, question, question_mask, match=None):
        logits = torch.zeros(context.shape)
        for i, v in self.peaks.items():
            logits = logits.masked_fill(context == i, v)
        logits = logits.masked_fill(~context_mask, float("-inf"))
        weights = logits.softmax(-1)[:, None, :]  # (B, 1, Tc)
        weighted_sum(weights, torch.zeros(*context.shape, 2))
        return ReaderOutput(logits, logits.clone(), weights[:, 0])


def tokenizer(*texts):
    return WordTokenizer.train([" ".join(FILLER), "1905 1800 when", *texts], min_freq=1)


def long_context(n_words: int, planted: dict[int, str]) -> str:
    return " ".join(planted.get(i, FILLER[i % len(FILLER)]) for i in range(n_words))


def reader(tok, peaks, **options):
    return Reader(PeakReader({tok.encode(w)[0]: v for w, v in peaks.items()}), QAOptions(**options), tokenizer=tok)


def test_windows_cover_the_context_and_end_at_its_end():
    assert windows(3, 4, 2) == [(0, 3)]
    assert windows(4, 4, 2) == [(0, 4)]
    assert windows(10, 4, 2) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    assert windows(11, 4, 2) == [(0, 4), (2, 6), (4, 8), (6, 10), (7, 11)]
    assert windows(9, 4, 4) == [(0, 4), (4, 8), (5, 9)]
    for n in range(1, 40):
        for m, s in ((5, 1), (5, 2), (5, 5), (7, 3)):
            spans = windows(n, m, s)
            assert {t for a, b in spans for t in range(a, b)} == set(range(n))
            assert all(b - a == min(n, m) for a, b in spans) and spans[-1][1] == n
    for bad in ((10, 4, 5), (10, 4, 0), (10, 0, 1)):
        with pytest.raises(ValueError, match="stride <= max_context"):
            windows(*bad)
    with pytest.raises(ValueError, match="doc_stride \\(9\\) must be at most max_context \\(8\\)"):
        QAOptions(max_context=8, doc_stride=9)
    assert QAOptions(max_context=9).stride == 4 and QAOptions(max_context=9, doc_stride=9).stride == 9


def test_an_answer_past_max_context_is_found_in_its_window():
    tok = tokenizer()
    context = long_context(1000, {900: "1905", 40: "1800"})  # a weaker distractor in the first window
    r = reader(tok, {"1905": 10.0, "1800": 8.0}, max_context=100)
    (a,) = r.predict([(context, "when")])
    assert (a.answer, a.start_token, a.end_token) == ("1905", 900, 900)
    assert context[a.start:a.end] == "1905" and a.start == context.index("1905")
    spans = windows(1000, 100, 50)
    assert a.windows == len(spans) == 19 and a.window in spans and a.window[0] <= 900 < a.window[1]
    assert a.window == next(w for w in spans if w[0] <= 900 < w[1])  # the first window holding it (a tie)
    # the probability is the window's own p_start * p_end: 1905 among 99 tokens at 0
    p = torch.tensor([10.0] + [0.0] * 99).softmax(0)[0].item()
    assert a.probability == pytest.approx(p * p, rel=1e-5)
    # the attention spans the whole context: the window's weights at its tokens, 0 elsewhere
    assert len(a.tokens) == len(a.attention) == 1000 and a.tokens[900] == "1905"
    assert sum(a.attention) == pytest.approx(1.0) and max(range(1000), key=a.attention.__getitem__) == 900
    lo, hi = a.window
    assert not any(a.attention[:lo]) and not any(a.attention[hi:])
    assert any("read in 19 overlapping windows 50 tokens apart; the answer is from window" in n for n in a.notes)
    # a short context: one window, no note, the same answer as the model run on all of it
    short = long_context(60, {30: "1905"})
    (b,) = r.predict([(short, "when")])
    assert (b.answer, b.start_token, b.window, b.windows, b.notes) == ("1905", 30, (0, 60), 1, [])
    e = encode_example(short, "when", tok, max_question=64)
    (c,) = predict_examples(r.model, [e], [short], max_context=1000, stride=500)
    assert (c.start_token, c.probability, c.attention) == (b.start_token, b.probability, b.attention)


def test_windows_batched_with_other_inputs_and_a_doc_stride():
    tok = tokenizer()
    far, near = long_context(500, {470: "1905"}), long_context(30, {3: "1905"})
    r = reader(tok, {"1905": 10.0}, max_context=64, doc_stride=60)
    answers = r.predict([(near, "when"), (far, "when"), (near, "when")], batch_size=3)
    assert [(a.answer, a.start_token, a.windows) for a in answers] == [("1905", 3, 1), ("1905", 470, 9),
                                                                       ("1905", 3, 1)]
    assert answers[1].window == (420, 484)


def test_training_reads_the_window_that_holds_the_answer(caplog):
    tok = tokenizer()
    context = long_context(300, {250: "1905"})
    e = encode_example(context, "when", tok, max_question=64, answer=(context.index("1905"), context.index("1905") + 4))
    assert (e.start, e.end) == (250, 250)
    w = training_window(e, 100, 50)
    assert (w.first, w.start, w.end, len(w.context)) == (200, 50, 50, 100)
    assert w.offsets[w.start] == e.offsets[250] and w.context[w.start] == tok.encode("1905")[0]
    assert crop(e, 0, 100).start == -1 and training_window(crop(e, 0, 100), 100, 50) is None
    examples = [QAExample(context, "when", ["1905"], context.index("1905"), context.index("1905") + 4)] * 4
    corpus = QACorpus({"train": examples, "valid": examples[:1], "test": examples[:1]})
    task = QATask(QAOptions(data="x.tsv", max_context=100), corpus)
    with caplog.at_level(logging.INFO):
        task.setup()
    assert len(task.train_examples()) == 4 and {x.first for x in task.train_examples()} == {200}
    assert "left out" not in caplog.text and "4 training questions read the window" in caplog.text


def test_a_long_question_is_cut_with_a_warning_and_a_note(caplog):
    tok = tokenizer()
    context = long_context(30, {3: "1905"})
    question = " ".join(["when"] * 80)
    r = reader(tok, {"1905": 10.0}, max_question=64)
    with caplog.at_level(logging.WARNING):
        (a,) = r.predict([(context, question)])
    note = "the question has 80 tokens: only the first 64 were read (max_question 64; 16 left out)"
    assert note in caplog.text and a.notes == [note] and a.cut == 16 and a.answer == "1905"
    page = r.view(ViewInput(text=context, question=question))
    assert note in page.notes and len(page.tokens["target"]) == 64
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        r.predict([(context, "when"), (context, question)])
    assert f"question 2: {note}" in caplog.text


def test_the_page_of_a_long_context_shows_the_answers_window():
    tok = tokenizer()
    context = long_context(400, {330: "1905"})
    r = reader(tok, {"1905": 10.0}, max_context=100)
    page = r.view(ViewInput(text=context, question="when"))
    (a,) = r.predict([(context, "when")])
    lo, hi = a.window
    assert page.tokens["source"] == a.tokens[lo:hi] and len(page.tokens["source"]) == 100
    (rec,) = page.records
    assert rec.weights.shape[0] == 1 and rec.weights.shape[-1] == 100
    assert rec.weights.flatten().tolist() == pytest.approx(a.attention[lo:hi])
    assert f"the answer is from window {windows(400, 100, 50).index(a.window) + 1} (tokens {lo}-{hi - 1})" in \
        page.notes[-1]
    with capture_attention(r.model) as records:
        r.predict([(context, "when")])
    assert records[0].weights.shape[0] == a.windows  # the prediction's own pass: a row per window


ZH = "质能方程由爱因斯坦于1905年提出。"


@pytest.mark.parametrize("context", [ZH, "质 能 方 程 由 爱 因 斯 坦 于 1905 年 提 出 。",
                                     "质能方程由爱因斯坦于１９０５年提出。",
                                     "Einstein: 质能方程 由爱因斯坦于 1905年提出。"])
def test_chinese_with_or_without_spaces_and_full_width_digits(context):
    tok = WordTokenizer.train([ZH, "质能方程是什么时候提出的？", "Einstein"], min_freq=1)
    r = reader(tok, {"1905": 10.0})
    (a,) = r.predict([(context, "质能方程是什么时候提出的？")])
    assert a.answer == context[a.start:a.end] and a.answer in ("1905", "１９０５")
    assert a.start == context.index(a.answer) and "".join(a.tokens) == "".join(context.split())
    assert r.predict([(context, "质能方程是什么时候提出的?")])[0].answer == a.answer  # half-width '?'
    e = encode_example(context, "何时？１９０５年吗", tok, max_question=64)
    flagged = [context[x:y] for (x, y), m in zip(e.offsets, e.match, strict=True) if m & 1]
    assert flagged[0] in ("1905", "１９０５") and "年" in flagged  # full-width digits match the context's
    zh = encode_example(ZH, "何时？１９０５年吗", tok, max_question=64).context
    assert e.context[-len(zh):] == zh  # the same ids, spaces or not, full-width or not


def test_old_word_tokenizer_keeps_its_offsets():
    old = WordTokenizer(["the", "kavo", "engine", "1905"], mixed=False)
    text = "The Kavo engine, 1905."
    e = encode_example(text, "Kavo?", old, max_question=64)
    assert [text[a:b] for a, b in e.offsets] == ["The", "Kavo", "engine", ",", "1905", "."]
    assert e.context == [4, 5, 6, 3, 7, 3] and e.match == [2, 3, 0, 0, 0, 0]  # + 2: capitalised


def test_char_runs_keep_their_tokeniser(tmp_path):
    """Chinese runs of the previous release read characters: a character tokeniser stays one (and --tokenizer char
    still makes one); auto is the mixed word tokeniser for every language."""
    from qkv.apps.qa import train_tokenizer
    from qkv.data.facts import fact_corpus
    from qkv.data.tokenize import CharTokenizer, load_tokenizer

    corpus = fact_corpus("zh", 50, 5)
    assert isinstance(train_tokenizer(QAOptions(lang="zh", tokenizer="char"), corpus), CharTokenizer)
    word = train_tokenizer(QAOptions(lang="zh"), corpus)
    assert isinstance(word, WordTokenizer) and word.mixed
    chars = train_tokenizer(QAOptions(lang="zh", tokenizer="char"), corpus)
    chars.save(tmp_path / "tok")
    old = load_tokenizer(tmp_path / "tok")
    r = Reader(PeakReader({old.encode("9")[0]: 10.0}), QAOptions(lang="zh", tokenizer="char"), tokenizer=old)
    (a,) = r.predict([(ZH, "质能方程是什么时候提出的?")])
    assert a.tokens == list(ZH) and a.answer == "9" and a.start == ZH.index("9")
