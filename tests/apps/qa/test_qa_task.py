"""Question answering end to end on tiny data: `qkv train qa` into tmp_path, `qkv answer` (terminal, HTML,
--evaluate), resume, the library (options, model spec, `Reader` against the model run by hand; its `predict`,
`evaluate` and `view` against `predict` by hand), `qkv evaluate`, a SQuAD file, the
"when" -> "who" test on a trained tiny model, and the errors a user meets first."""

import contextlib
import io
import json
import re
from html.parser import HTMLParser

import pytest
import torch

from qkv.apps import ViewInput, application, application_of
from qkv.apps.qa import QAOptions, QATask, Reader, load_data, model_spec, train_defaults
from qkv.apps.qa.encode import collate_qa, encode_example
from qkv.capture import AttentionRecord
from qkv.cli import main
from qkv.metrics import squad_metrics
from qkv.models.reading import decode_spans

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--n-train", "1500", "--n-eval", "100", "--embed-dim", "16", "--hidden-dim", "32", "--dropout", "0",
        "--lr", "1e-2", "--warmup-steps", "0", "--epochs", "3", "--no-progress"]
CONTEXT = "The Kavo engine was invented by Mira Tel in 1905."


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Attentive Reader on English facts: 3 epochs of 47 steps (about five seconds on one core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("qa") / "run"
    code, stdout, err = run("train", "qa", "--data", "facts", "--lang", "en", *TINY, "--out", out)
    torch.set_num_threads(before)
    assert code == 0, err
    return out, stdout


@pytest.mark.slow
def test_train_prints_every_split(trained):
    out, stdout = trained
    for split in ("valid", "test", "test_phrasings"):
        assert f"{split}: exact_match" in stdout
    assert "stopped: epochs after 141 steps" in stdout
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["config"]["model"]["name"] == "attentive-reader"


@pytest.mark.slow
def test_when_and_who_move_the_attention_peak(trained):
    """Asked *when*, the question attends to the year; asked *who*, to the person: only the question
    changed. The held-out names are unknown words to this model: it points by reading."""
    reader = Reader.load(trained[0])
    when, who = reader.predict([(CONTEXT, "When was the Kavo engine invented?"),
                                (CONTEXT, "Who invented the Kavo engine?")])

    def peak(a):
        return a.tokens[max(range(len(a.tokens)), key=lambda i: a.attention[i])]

    assert (when.answer, peak(when)) == ("1905", "1905")
    assert who.answer == "Mira Tel" and peak(who) in ("Mira", "Tel")
    assert when.start_token <= when.end_token and CONTEXT[when.start:when.end] == when.answer
    assert sum(when.attention) == pytest.approx(1.0, abs=1e-5) and len(when.attention) == len(when.tokens)


@pytest.mark.slow
def test_reader_equals_the_model_run_by_hand(trained):
    reader = Reader.load(trained[0])
    q = "Who invented the Kavo engine?"
    (a,) = reader.predict([(CONTEXT, q)])
    e = encode_example(CONTEXT, q, reader.tokenizer, max_question=64)
    assert e.question_cut == 0 and e.first == 0
    b = collate_qa([e])
    with torch.no_grad():
        out = reader.model(b["context"], b["context_mask"], b["question"], b["question_mask"], b["match"])
    start, end, prob = decode_spans(out.start_logits, out.end_logits, b["context_mask"], 20)
    assert (a.start_token, a.end_token) == (int(start), int(end))
    assert a.probability == pytest.approx(float(prob))
    assert a.attention == pytest.approx(out.attention[0].tolist())
    # the question-word flag (bit 1) marks 'kavo' and 'engine' (lower-cased) but not 'mira'; the capital-letter
    # flag (bit 2) marks the words that start with a capital, in the question or not
    assert [t for t, m in zip(a.tokens, e.match, strict=True) if m & 1] == ["The", "Kavo", "engine", "invented"]
    assert [t for t, m in zip(a.tokens, e.match, strict=True) if m & 2] == [t for t in a.tokens if t[0].isupper()]
    assert {"Mira", "Tel", "Kavo"} <= {t for t, m in zip(a.tokens, e.match, strict=True) if m & 2}


@pytest.mark.slow
def test_answer_command_terminal_and_html(trained, tmp_path):
    page = tmp_path / "a.html"
    ctx = CONTEXT + " <script>alert(1)</script>"
    code, out, err = run("answer", trained[0], "--context", ctx, "--question", "When was the Kavo engine invented?",
                         "--color", "never", "--html", page)
    assert code == 0, err
    assert out.startswith("answer: 1905\tprobability ")
    assert "attention: The Kavo engine" in out and "[1905 " in out
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html and ">&lt;</span>" in html
    assert max(float(w) for w in re.findall(r'title="([0-9.]+)"', html)) > 0.9  # the answer's weight, shown
    HTMLParser().feed(html)
    code, out, _ = run("answer", trained[0], "--context", CONTEXT, "--question", "Who invented the Kavo engine?",
                       "--color", "always")
    assert code == 0 and "\x1b[" in out and "answer: Mira Tel" in out


def test_evaluate_on_facts_and_a_file(trained, tmp_path):
    code, out, err = run("answer", trained[0], "--evaluate", "--data", "facts")
    assert code == 0, err
    assert "| test | " in out and "| test_phrasings | " in out
    tsv = tmp_path / "qa.tsv"
    tsv.write_text(f"{CONTEXT}\tWhen was the Kavo engine invented?\t1905\n"
                   f"{CONTEXT}\tWho invented the Kavo engine?\tMira Tel\n"
                   f"{CONTEXT}\tWho?\tNobody\n", encoding="utf-8")
    code, out, err = run("answer", trained[0], "--evaluate", "--data", tsv)
    assert code == 2 and "qa.tsv:3: the answer 'Nobody' is not a span" in err and len(err.strip().splitlines()) == 1
    js = tmp_path / "m.json"
    code, out, err = run("answer", trained[0], "--evaluate", "--data", tsv, "--on-error", "skip", "--json", js)
    assert code == 0, err
    assert "skipped 1 question(s)" in out and "| qa.tsv | 1.0000 | 1.0000 | 2 |" in out
    assert json.loads(js.read_text())["qa.tsv"]["exact_match"] == 1.0


def test_resume_continues(trained, tmp_path):
    out = tmp_path / "r"
    args = ["train", "qa", "--data", "facts", "--lang", "en", *TINY, "--n-train", "300", "--out", out]
    assert run(*args, "--max-steps", "3")[0] == 0
    code, stdout, err = run(*args, "--max-steps", "6", "--resume")
    assert code == 0, err
    assert "after 6 steps" in stdout


def test_squad_file_and_chinese_characters(tmp_path):
    contexts = [f"{name}于{year}年在{city}提出了{thing}。" for name, year, city, thing in
                [("王明", 1901, "北港", "光能定律"), ("李华", 1932, "南城", "电磁方程"),
                 ("陈静", 1957, "西镇", "声波理论"), ("周涛", 1988, "东堡", "热力模型")]]
    paragraphs = [{"context": c, "qas": [{"id": str(i), "question": "谁提出的?",
                                          "answers": [{"text": c[:2], "answer_start": 0}]}]}
                  for i, c in enumerate(contexts)]
    path = tmp_path / "zh.json"
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}, ensure_ascii=False),
                    encoding="utf-8")
    out = tmp_path / "run"
    code, stdout, err = run("train", "qa", "--data", path, "--model", "bidaf", "--embed-dim", "8", "--hidden-dim",
                            "8", "--max-steps", "2", "--no-progress", "--out", out)
    assert code == 0, err
    assert "test: exact_match" in stdout and "test_phrasings" not in stdout
    tok = json.loads((out / "best" / "assets" / "tokenizer" / "qkv_tokenizer.json").read_text())
    assert tok["type"] == "word" and tok["mixed"]  # the mixed word tokeniser: one CJK character per token
    reader = Reader.load(out)
    (a,) = reader.predict([("王明于1901年提出。", "谁提出的?")])
    assert a.answer and a.answer in "王明于1901年提出。"
    assert reader.evaluate()["questions"] == len(reader.dataset().split("test"))  # its own file, split as trained
    with pytest.raises(ValueError, match="trained on .*zh.json, not on facts"):
        reader.evaluate("facts")


@pytest.mark.parametrize("model", ["bidaf", "transformer"])
def test_other_models_train_and_answer(model, tmp_path):
    sizes = ["--embed-dim", "8", "--hidden-dim", "8"] if model == "bidaf" else \
        ["--dim", "16", "--num-heads", "2", "--num-layers", "1"]
    out = tmp_path / model
    code, _, err = run("train", "qa", "--data", "facts", "--n-train", "200", "--n-eval", "20", "--model", model,
                       *sizes, "--max-steps", "3", "--no-progress", "--out", out)
    assert code == 0, err
    code, stdout, err = run("answer", out, "--context", CONTEXT, "--question", "Who?", "--color", "never")
    assert code == 0 and stdout.startswith("answer: "), err


def test_options_and_spec():
    o = QAOptions(model="transformer", dim=32, num_heads=4)
    assert model_spec(o, vocab_size=50) == {"name": "transformer-reader", "config": {
        "vocab_size": 50, "score": "scaled_dot", "dropout": 0.1, "match_feature": True, "num_layers": 3, "dim": 32,
        "num_heads": 4, "ffn_dim": None, "max_len": 400, "case_feature": True}}
    # without the capital-letter flag the spec has no key for it: the spec of a run saved before the flag existed
    assert "case_feature" not in model_spec(QAOptions(case_feature=False), vocab_size=50)["config"]
    assert train_defaults(QAOptions(data="x.json")).final_splits == ("valid", "test")
    with pytest.raises(ValueError, match="num_heads .* must divide dim"):
        QAOptions(model="transformer", dim=30, num_heads=4)
    with pytest.raises(ValueError, match="lang does not apply"):
        QAOptions(data="x.json", lang="zh")


def test_bad_input_is_one_line_exit_2(trained, tmp_path):
    cases = [
        (["train", "qa", "--data", tmp_path / "missing.json", "--out", tmp_path / "o"], "no such data file"),
        (["train", "qa", "--model", "transformer", "--hidden-dim", "8"], "--hidden-dim"),
        (["train", "qa", "--data", "x.tsv", "--lang", "zh"], "--lang"),
        (["answer", trained[0], "--context", "  ", "--question", "Who?"], "the context is empty"),
        (["answer", trained[0], "--context", CONTEXT], "give --context and --question"),
        (["answer", trained[0], "--evaluate"], "--evaluate needs --data"),
        (["answer", trained[0], "--context", CONTEXT, "--question", "Who?", "--data", "facts"], "goes with --evaluate"),
        (["answer", tmp_path, "--context", CONTEXT, "--question", "Who?"], None),
    ]
    for argv, message in cases:
        code, out, err = run(*argv)
        assert code == 2, (argv, out, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("qkv: error:"), (argv, err)
        if message:
            assert message in err, (argv, err)
    assert not (tmp_path / "o").exists()


def test_encoding_offsets_spans_and_word_dropout():
    import random

    from qkv.data.tokenize import CharTokenizer, WordTokenizer

    words = WordTokenizer.train(["The engine was built by Mira Tel in 1905."], min_freq=1)
    ctx = "The Kavo engine, built by Mira Tel in 1905."
    e = encode_example(ctx, "Who built the Kavo engine?", words, max_question=64,
                       answer=(ctx.index("Mira"), ctx.index(" in")))
    assert [ctx[a:b] for a, b in e.offsets] == ["The", "Kavo", "engine", ",", "built", "by", "Mira", "Tel", "in",
                                                "1905", "."]
    assert (e.start, e.end) == (6, 7) and e.context[1] == words.unk_id  # 'Kavo' is unknown, still flagged
    # the flags: 1 in the question, + 2 capitalised ('The' and 'Kavo' both; 'Mira Tel' capitalised only)
    assert e.match == [3, 3, 1, 0, 1, 0, 2, 2, 0, 0, 0]
    # characters: white space is no token, offsets stay those of the text
    chars = CharTokenizer.train(["于 1905 年"])
    e = encode_example("于 1905 年", "何时", chars, max_question=8, answer=(2, 6))
    assert e.offsets == [(0, 1), (2, 3), (3, 4), (4, 5), (5, 6), (7, 8)] and (e.start, e.end) == (1, 4)
    # word dropout drops a word everywhere in its example (question and context alike), never the padding
    e = encode_example(ctx, "Who built the Kavo engine?", words, max_question=64)
    b = collate_qa([e, e], word_dropout=0.5, rng=random.Random(1))
    for i in range(2):
        dropped = {t for t, u in zip(e.context, b["context"][i].tolist(), strict=True) if u == words.unk_id}
        kept_q = {t for t, u in zip(e.question, b["question"][i].tolist(), strict=True) if u != words.unk_id}
        assert not dropped & kept_q
    assert b["context_mask"].all() and (b["start"] == -1).all()


def test_rare_dropout_makes_rare_tokens_unknown_more_often():
    import random

    from qkv.apps.qa.encode import rare_dropout
    from qkv.data.tokenize import WordTokenizer

    texts = ["The tower was built by Mira Tel in 1905."] + ["The bridge was built in 1890."] * 9
    words = WordTokenizer.train(texts, min_freq=1)
    encoded = [encode_example(t, "Who built it?", words, max_question=64) for t in texts]
    p = rare_dropout(encoded, words.vocab_size, alpha=2.0)
    count = {t: sum(e.context.count(t) + e.question.count(t) for e in encoded) for t in range(words.vocab_size)}
    for t in range(words.vocab_size):  # a / (a + n), against the counts made here; never padding or <unk>
        assert p[t] == (0.0 if t <= words.unk_id else pytest.approx(2.0 / (2.0 + count[t])))
    mira, the = words.encode("Mira The")
    assert p[mira] == pytest.approx(2 / 3) and p[the] == pytest.approx(2 / 12)
    assert rare_dropout(encoded, words.vocab_size, alpha=0.0) == [0.0] * words.vocab_size
    # in a batch, a rare token becomes <unk> far more often than a common one; without word dropout none but these
    rng, hits = random.Random(0), {mira: 0, the: 0}
    for _ in range(300):
        b = collate_qa([encoded[0]], rng=rng, rare=p)
        row = b["context"][0].tolist()
        for t in hits:
            hits[t] += row[encoded[0].context.index(t)] == words.unk_id
    assert 150 < hits[mira] < 250 and hits[the] < 90
    assert collate_qa([encoded[0]])["context"][0].tolist() == encoded[0].context


# --------------------------------------------------------------------------------------------- the contract

QUESTIONS = [(CONTEXT, "When was the Kavo engine invented?"), (CONTEXT, "Who invented the Kavo engine?"),
             ("Lina Vor founded the Tor Society in Belmar.", "Where was the Tor Society founded?")]


def test_qa_is_an_application_of_the_registry(trained):
    import qkv.apps.qa.command as command

    app = application("qa")
    assert (app.options, app.task, app.predictor) == (QAOptions, QATask, Reader)
    assert not hasattr(command, "train")  # `qkv train qa` is the registry's (qkv.cli.train)
    assert application_of(trained[0]) is app


def test_predict_is_batched_and_equals_one_by_one(trained):
    reader = Reader.load(trained[0])
    together = reader.predict(QUESTIONS, batch_size=2)  # two batches, padded
    for pair, a in zip(QUESTIONS, together, strict=True):
        (b,) = reader.predict([pair])
        assert (a.context, a.question) == pair and (a.answer, a.start_token, a.end_token) == \
            (b.answer, b.start_token, b.end_token)
        assert a.probability == pytest.approx(b.probability, abs=1e-5)
        assert a.attention == pytest.approx(b.attention, abs=1e-5)
    assert reader.predict([]) == []
    with pytest.raises(ValueError, match="a list of \\(context, question\\) pairs"):
        reader.predict(QUESTIONS[0])
    with pytest.raises(ValueError, match="question 2 is empty"):
        reader.predict([QUESTIONS[0], (CONTEXT, " ")])
    with pytest.raises(ValueError, match="input 2 must be a \\(context, question\\) pair"):
        reader.predict([QUESTIONS[0], CONTEXT])


@pytest.mark.parametrize("split", ["test", "test_phrasings"])
def test_evaluate_is_the_squad_metrics_of_predict(trained, split):
    reader = Reader.load(trained[0])
    examples = load_data(reader.options).split(split)[:40]
    answers = reader.predict([(e.context, e.question) for e in examples])
    want = squad_metrics([a.answer for a in answers], [e.answers for e in examples], chars=False)
    spans = [encode_example(e.context, e.question, reader.tokenizer, max_question=64,
                            answer=(e.answer_start, e.answer_end)) for e in examples]
    mass = [sum(a.attention[s.start:s.end + 1]) for a, s in zip(answers, spans, strict=True)]
    got = reader.evaluate(split=split, limit=40)
    assert got == pytest.approx({**want, "attention_mass": sum(mass) / len(mass)}) and got["questions"] == 40
    with pytest.raises(ValueError, match="no split 'train'; one of valid, test, test_phrasings"):
        reader.evaluate(split="train")
    with pytest.raises(ValueError, match="beam does not apply to qa runs"):
        reader.evaluate(beam=3)
    with pytest.raises(ValueError, match="on_error is for a data file"):
        reader.evaluate(on_error="skip")


def test_evaluate_a_file_whole(trained, tmp_path):
    reader = Reader.load(trained[0])
    tsv = tmp_path / "qa.tsv"
    tsv.write_text("".join(f"{c}\t{q}\t{a}\n" for (c, q), a in zip(QUESTIONS, ("1905", "Mira Tel", "Belmar"),
                                                                      strict=True)) + f"{CONTEXT}\tWho?\tNobody\n",
                   encoding="utf-8")
    with pytest.raises(ValueError, match="qa.tsv:4: the answer 'Nobody' is not a span"):
        reader.evaluate(str(tsv))
    got = reader.evaluate(str(tsv), on_error="skip")
    answers = reader.predict(QUESTIONS)
    want = squad_metrics([a.answer for a in answers], [["1905"], ["Mira Tel"], ["Belmar"]])
    assert got["skipped"] == 1 and got["questions"] == 3
    assert (got["exact_match"], got["f1"]) == pytest.approx((want["exact_match"], want["f1"]))
    assert reader.evaluate(str(tsv), on_error="skip", limit=1)["questions"] == 1
    with pytest.raises(ValueError, match="evaluated whole"):
        reader.evaluate(str(tsv), split="valid")


def test_view_records_the_answer(trained):
    reader = Reader.load(trained[0])
    q = "When was the Kavo engine invented?"
    page = reader.view(ViewInput(text=CONTEXT, question=q))
    (a,) = reader.predict([(CONTEXT, q)])
    assert page.records and all(isinstance(r, AttentionRecord) for r in page.records)
    assert page.tokens["source"] == a.tokens and page.tokens["target"][0].lower() == "when"
    assert page.title == f"{q} \u2192 {a.answer}"
    cross = [r for r in page.records if r.kind == "cross"]
    assert cross and cross[-1].weights.shape[-1] == len(a.tokens)
    with pytest.raises(ValueError, match="needs question"):
        reader.view(ViewInput(text=CONTEXT))
    with pytest.raises(ValueError, match="needs a text"):
        reader.view(ViewInput(question=q))


def test_qkv_evaluate_qa_runs(trained, tmp_path):
    code, out, err = run("evaluate", trained[0], "--split", "test_phrasings", "--max-examples", "30")
    assert code == 0, err
    want = Reader.load(trained[0]).evaluate(split="test_phrasings", limit=30)
    assert "split test_phrasings" in out and "| questions | 30 |" in out
    assert f"| exact_match | {want['exact_match']:.4f} |" in out and f"| f1 | {want['f1']:.4f} |" in out
    tsv = tmp_path / "qa.tsv"
    tsv.write_text(f"{CONTEXT}\tWhen was the Kavo engine invented?\t1905\n{CONTEXT}\tWho?\tNobody\n",
                   encoding="utf-8")
    code, out, err = run("evaluate", trained[0], "--data", tsv, "--on-error", "skip")
    assert code == 0, err
    assert "| questions | 1 |" in out and "| skipped | 1 |" in out


def test_an_answer_past_max_context_on_the_trained_reader(trained, caplog):
    """A context of some 900 tokens whose answer lies past the first 400 is read in windows: the trained
    reader answers it as it answers the sentence alone, and says so."""
    reader = Reader.load(trained[0])
    filler = " ".join(["The weather was calm and the river was slow ."] * 80)
    context = f"{filler} {CONTEXT}"
    q = "When was the Kavo engine invented?"
    (alone,) = reader.predict([(CONTEXT, q)])
    (a,) = reader.predict([(context, q)])
    assert a.windows == 4 and a.answer == alone.answer == "1905"
    assert a.start == context.index("1905") and a.start_token == len(a.tokens) - 2 > 400
    code, out, err = run("answer", trained[0], "--context", context, "--question", q, "--color", "never")
    assert code == 0 and out.startswith("answer: 1905\t"), err
    assert f"read: {len(a.tokens)} context tokens in 4 overlapping windows; the answer's is tokens " in out
    long_q = "When was the Kavo engine invented " + "really " * 70 + "?"
    with caplog.at_level("WARNING"):  # the command line's logging shows it on stderr
        code, out, err = run("answer", trained[0], "--context", CONTEXT, "--question", long_q, "--color", "never")
    assert code == 0 and "the question has 77 tokens: only the first 64 were read" in caplog.text


SOURCE = "质能方程由爱因斯坦于1905年提出。"


@pytest.mark.slow  # trains a reader on 3,000 mixed questions: about 45 s on one core
def test_one_model_reads_english_and_chinese_as_typed(tmp_path):
    """The source documents' question, asked of one tiny model trained with the default data (facts in
    English and Chinese, some fifteen seconds on one thread), with or without spaces between the characters and with
    full-width digits; the answer is the context's own characters."""
    assert QAOptions().lang == "both" and QAOptions().tokenizer == "auto"
    out = tmp_path / "both"
    code, _, err = run("train", "qa", *TINY, "--n-train", "3000", "--out", out)
    assert code == 0, err
    code, stdout, err = run("answer", out, "--context", SOURCE, "--question", "质能方程是什么时候提出的？",
                            "--color", "never")
    assert code == 0 and stdout.startswith("answer: 1905\t"), (stdout, err)
    reader = Reader.load(out)
    assert reader.tokenizer.mixed  # auto: the mixed word tokeniser
    spaced, wide = "质能方程 由 爱因斯坦 于 1905 年提出。", "质能方程由爱因斯坦于１９０５年提出。"
    answers = reader.predict([(SOURCE, "质能方程是什么时候提出的?"), (spaced, "质能方程是什么时候提出的？"),
                              (wide, "质能方程是什么时候提出的？"), (SOURCE, "质能方程是谁提出的？"),
                              (CONTEXT, "When was the Kavo engine invented?")])
    assert [a.answer for a in answers] == ["1905", "1905", "１９０５", "爱因斯坦", "1905"]
    assert answers[2].start == wide.index("１９０５") and answers[1].start == spaced.index("1905")


def test_a_name_before_a_possessive_is_a_span_of_its_own():
    from qkv.apps.qa import train_tokenizer
    from qkv.data.facts import fact_corpus

    corpus = fact_corpus("en", 60, 5)
    tok = train_tokenizer(QAOptions(), corpus)
    assert tok.clitics  # a new run's word tokeniser splits "'s" off
    ctx = "The Rofro canal was built in 1801 by Zanubi Vorpertor's company."
    e = encode_example(ctx, "Who built the Rofro canal?", tok, max_question=64,
                       answer=(ctx.index("Zanubi"), ctx.index("'s")))
    assert ctx[e.offsets[e.start][0]:e.offsets[e.end][1]] == "Zanubi Vorpertor"  # the gold answer, exactly
    assert ctx[slice(*e.offsets[e.end + 1])] == "'s"
