"""The summarisation application end to end on tiny data through the CLI: a pointer-generator that learns to copy
words outside its vocabulary, `qkv summarize` (text, --file, --html, --evaluate), `qkv view`, --coverage-from, the
metrics against hand-computed cases, and bad inputs (one-line errors, exit code 2)."""

import json
import random

import pytest
import torch

from qkv.apps import ViewInput
from qkv.apps.summarize import SummarizeOptions, Summarizer, first_words, lead
from qkv.apps.summarize.decode import rouge_words
from qkv.cli import main
from qkv.metrics import repeated_ngram_rate, rouge

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # the splits' grouping cache: not the user's
        mp.setenv("QKV_CACHE", str(tmp_path_factory.mktemp("qkv-cache")))
        yield

FILLER = ["the", "a", "tool", "runs", "fast", "and", "slow", "with", "data", "over", "network", "files", "on", "disk"]
TINY = ["--min-freq", "3", "--embed-dim", "16", "--hidden-dim", "32", "--dropout", "0", "--batch-size", "32",
        "--lr", "1e-2", "--warmup-steps", "0", "--no-progress", "--eval-max", "40", "--max-decode-len", "4"]


def _name(rng):
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3))


def _copy_text(rng, name):
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
    words.insert(rng.randint(0, len(words)), f"called {name}")
    return " ".join(words)


def write_copy_data(path, n=500, seed=0):
    """Texts naming a made-up word once ("... called vemefu ..."); the summary is that word. Every name occurs
    in one example only, so with --min-freq 3 no name is in the vocabulary: only copying can write it."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name = _name(rng)
        rows.append({"text": _copy_text(rng, name), "summary": name})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("summarize")
    data = write_copy_data(root / "copy.jsonl")
    out = root / "pointer"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", "summarize", "--data", str(data), "--model", "pointer", "--max-steps", "120",
                     "--out", str(out), *TINY]) == 0
    finally:
        torch.set_num_threads(before)
    return out, data


@pytest.mark.slow
def test_a_tiny_pointer_learns_to_copy_words_outside_its_vocabulary(copy_run):
    out, _ = copy_run
    finals = {x["split"]: x["metrics"] for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if x["event"] == "final"}
    assert finals["test"]["rouge1"] >= 90 and finals["test"]["copied_oov"] >= 0.9
    summarizer = Summarizer.load(out)
    rng = random.Random(99)
    names = [_name(rng) for _ in range(8)]
    assert not any(summarizer.tokenizer.encode(n) != [3] for n in names)  # all outside the vocabulary
    results = summarizer.predict([_copy_text(rng, n) for n in names], beam=2, max_len=3)
    assert sum(r.text == n for r, n in zip(results, names, strict=True)) >= 7
    r = results[0]
    assert r.copied[0] and float(r.p_gen[0]) < 0.5
    # the attention of the copied word points at the name
    assert r.source_tokens[int(r.attention[0].argmax())] == names[0]
    torch.testing.assert_close(r.coverage, r.attention.sum(0))


def test_the_summary_is_the_models_own_decoding(copy_run):
    """The predictor's attention and p_gen are the model's, run by hand teacher-forced on its output."""
    from qkv.apps.summarize.decode import collate, encode_example

    out, _ = copy_run
    summarizer = Summarizer.load(out)
    text = "fast tool called zuqoxa on disk"
    (r,) = summarizer.predict([text], beam=1, max_len=3)
    b = collate([encode_example(summarizer.tokenizer, text)])
    vocab = summarizer.tokenizer.vocab_size
    ids = [vocab + b.src_ext[0].tolist().index(vocab)] if r.copied[0] else []
    tgt_in = torch.tensor([[1, *ids]])
    with torch.no_grad():
        ref = summarizer.model(b.src, b.src_mask, tgt_in, b.src_ext, b.n_ext)
    n = len(ids) + 1
    torch.testing.assert_close(r.attention[:n], ref.attention[0, :n], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.p_gen[:n], ref.p_gen[0, :n], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_summarize_command_html_file_and_output(copy_run, tmp_path, capsys):
    out, _ = copy_run
    page = tmp_path / "copy"
    assert main(["summarize", str(out), "the tool called <b>kemiru</b> runs", "--beam", "2", "--max-len", "3",
                 "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {page}.html" in printed
    html = (tmp_path / "copy.html").read_text(encoding="utf-8")
    assert "<b>kemiru" not in html and "&lt;" in html and "p_gen" in html and "data-attn" in html
    texts = tmp_path / "in.txt"
    texts.write_text("data called tipoxe here\nslow disk called mabeko\n", encoding="utf-8")
    summaries = tmp_path / "out.txt"
    assert main(["summarize", str(out), "--file", str(texts), "--output", str(summaries), "--max-len", "3"]) == 0
    assert summaries.read_text(encoding="utf-8").split() == ["tipoxe", "mabeko"]


def test_evaluate_prints_rouge_beside_the_baselines(copy_run, tmp_path, capsys):
    out, data = copy_run
    figures = tmp_path / "f.json"
    assert main(["summarize", str(out), "--evaluate", str(data), "--limit", "10", "--beam", "1", "--json",
                 str(figures)]) == 0
    printed = capsys.readouterr().out
    assert "| lead sentence |" in printed and "| first 8 words |" in printed and "ROUGE-L" in printed
    m = json.loads(figures.read_text())
    assert m["examples"] == 10 and m["rougeL"] > m["lead_rougeL"] and m["rougeL"] > m["first8_rougeL"]
    assert m["repeated_trigrams"] is None  # one-word summaries have no trigram: NaN, written null
    # another file of the same format is evaluated whole, bad rows skipped and counted
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"text": "called ropafi here", "summary": "ropafi"}) + "\n{broken\n",
                     encoding="utf-8")
    assert main(["summarize", str(out), "--evaluate", str(other)]) == 2
    assert f"{other}:2" in capsys.readouterr().err
    assert main(["summarize", str(out), "--evaluate", str(other), "--on-error", "skip", "--max-len", "3"]) == 0
    assert "1 examples" in capsys.readouterr().out
    assert main(["evaluate", str(out)]) == 0  # the registry's command


def test_view_shows_the_decoding_and_p_gen(copy_run, tmp_path):
    out, _ = copy_run
    page = Summarizer.load(out).view(ViewInput(text="a tool called dokute"))
    assert page.tokens["source"] == ["a", "tool", "called", "dokute"] and page.tokens["target"][0] == "dokute"
    assert page.records and all(r.weights.shape[-1] == 4 for r in page.records)
    assert any("p_gen" in n and "dokute" in n and "(copied)" in n for n in page.notes)
    assert main(["view", str(out), "a tool called dokute", "--out", str(tmp_path / "v.html")]) == 0


def test_coverage_from_switches_coverage_on_at_that_step(tmp_path):
    data = write_copy_data(tmp_path / "c.jsonl", n=120)
    runs = {}
    for start in ("2", "500"):
        out = tmp_path / start
        assert main(["train", "summarize", "--data", str(data), "--coverage-from", start, "--max-steps", "6",
                     "--log-every", "1", "--out", str(out), *TINY]) == 0
        runs[start] = Summarizer.load(out / "checkpoint").model  # the last step (best/ may be earlier)
    assert int(runs["2"].trained_steps) == 6 and runs["2"].score.coverage_proj.weight.detach().any()
    assert not runs["500"].score.coverage_proj.weight.detach().any()  # never switched on: exactly zero
    logged = (tmp_path / "2" / "metrics.jsonl").read_text()
    assert "coverage_loss" in logged and "coverage_loss" not in (tmp_path / "500" / "metrics.jsonl").read_text()


def test_coverage_from_a_fraction_switches_coverage_on_for_the_last_part(tmp_path):
    import json

    from qkv.apps.summarize import SummarizeTask, train_defaults
    from qkv.train import train

    data = write_copy_data(tmp_path / "c.jsonl", n=120)
    out = tmp_path / "frac"
    assert main(["train", "summarize", "--data", str(data), "--coverage-from", "0.5", "--max-steps", "8",
                 "--log-every", "1", "--out", str(out), *TINY]) == 0
    logs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    with_cov = sorted(x["global_step"] for x in logs if "coverage_loss" in x)
    assert with_cov == [5, 6, 7, 8]  # switched on after step 4 of 8: the steps after it have the coverage loss
    model = Summarizer.load(out / "checkpoint").model
    assert model.score.coverage_proj.weight.detach().any()
    # a time budget: the fraction is of the time when that comes first (a budget so short it is all past 0.5)
    options = SummarizeOptions(data=str(data), coverage_from=0.5, vocab_size=60, embed_dim=8, hidden_dim=8)
    config = train_defaults(options).replace(max_steps=3, max_minutes=1e-6, progress=False, eval_split=None,
                                             final_splits=(), monitor=None)
    task = SummarizeTask(options)
    train(task, config)  # the trainer registers the task's own callbacks
    assert task.coverage_step == 1
    result = train(SummarizeTask(options), config.replace(max_minutes=None))
    assert int(result.model.trained_steps) == 3
    with pytest.raises(ValueError, match="fraction of the training"):  # outside the trainer nothing would start it
        SummarizeTask(options).loss(result.model, None)
    with pytest.raises(ValueError, match="a whole number"):
        SummarizeOptions(coverage_from=2.5)
    with pytest.raises(ValueError, match="needs score additive"):
        SummarizeOptions(coverage_from=0.5, score="general")


def test_bad_inputs_are_one_line_errors(copy_run, tmp_path, capsys):
    out, data = copy_run
    assert main(["summarize", str(out)]) == 2
    assert main(["summarize", str(out), "   "]) == 2
    assert main(["summarize", str(out), "text", "--evaluate", str(data)]) == 2
    assert main(["summarize", str(out), "text", "--split", "valid"]) == 2  # --split goes with --evaluate
    assert main(["summarize", str(out), "text", "--html", str(tmp_path)]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a b", "summary": "a"}\n{"text": "a b"}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["train", "summarize", "--data", str(bad), "--out", str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and f"{bad}:2" in err and "\n" not in err
    assert not (tmp_path / "r").exists()
    assert main(["train", "summarize", "--data", "facts", "--format", "csv"]) == 2  # a file's option
    assert main(["train", "summarize", "--model", "transformer", "--coverage-from", "10"]) == 2
    with pytest.raises(ValueError, match="coverage_weight needs coverage_from"):
        SummarizeOptions(coverage_weight=2.0)
    with pytest.raises(ValueError, match="empty"):
        Summarizer.load(out).predict([""])


def test_metrics_against_hand_computed_cases():
    # ROUGE-1: 5 of 6 words shared, both length 6 -> F1 5/6; ROUGE-2: "the cat", "on the", "the mat" of 5 -> 3/5
    m = rouge(["the cat sat on the mat"], ["the cat was on the mat"], tokenize=rouge_words)
    assert abs(m["rouge1"] - 500 / 6) < 1e-9 and abs(m["rouge2"] - 60) < 1e-9 and abs(m["rougeL"] - 500 / 6) < 1e-9
    assert rouge(["猫坐在垫子上"], ["猫在垫子上"], tokenize=rouge_words)["rouge1"] == pytest.approx(100 * 10 / 11)
    assert repeated_ngram_rate([["a", "b", "c", "a", "b", "c"], ["x", "y"]]) == pytest.approx(1 / 4)
    assert repeated_ngram_rate([["the"] * 5]) == pytest.approx(2 / 3)
    assert repeated_ngram_rate([["a", "b"]]) != repeated_ngram_rate([["a", "b"]])  # NaN: no trigram
    assert lead("First one. Second one.") == "First one." and lead("No stop") == "No stop"
    assert lead("第一句。第二句。") == "第一句。" and lead("v1.2 is out. Next.") == "v1.2 is out."
    assert first_words("a b c d e f g h i j") == "a b c d e f g h"


@pytest.mark.parametrize("model", ["transformer", "seq2seq"])
def test_the_other_models_train_and_summarise(model, tmp_path):
    data = write_copy_data(tmp_path / "c.jsonl", n=80)
    sizes = ["--dim", "16", "--num-heads", "2", "--num-layers", "1"] if model == "transformer" else \
        ["--embed-dim", "16", "--hidden-dim", "32"]
    common = TINY[:2] + TINY[6:]  # without the RNN sizes
    assert main(["train", "summarize", "--data", str(data), "--model", model, "--max-steps", "3", *sizes,
                 "--out", str(tmp_path / "r"), *common]) == 0
    s = Summarizer.load(tmp_path / "r")
    (r,) = s.predict(["a tool called xoqeba"], beam=2, max_len=3, no_repeat_ngram_size=2, coverage_penalty=0.2)
    assert r.attention.shape[1] == 4 and len(r.p_gen) >= len(r.tokens)
    if model == "seq2seq":  # no copying: never a word outside the vocabulary, p_gen 1
        assert not any(r.copied) and bool((r.p_gen == 1).all())


def test_copied_runs_are_written_as_the_source_wrote_them():
    from qkv.apps.summarize.decode import output_text, written_out
    from qkv.data import WordTokenizer

    rng = random.Random(7)
    tok = WordTokenizer.train(["x"], min_freq=1)
    names = ["Kavik-Valgil", "GNU", "libFOO2", "O'Neil", "x86_64", "1905年", "論文", "Zanjunael", "(beta)", "3.14"]
    for _ in range(200):
        source = " ".join(rng.choice(names + FILLER) for _ in range(rng.randrange(3, 15)))
        words, spans = tok.split(source), tok.spans(source)
        a = rng.randrange(len(words))
        b = rng.randrange(a, len(words)) + 1
        run = words[a:b]
        text = written_out(run, words, source, spans)
        assert text.lower() == source[spans[a][0]:spans[b - 1][1]].lower()  # that run, as typed
        assert rouge_words(text) == rouge_words(output_text(run))  # ROUGE reads the same words
        other = [*run, "zzzq", *run]  # a word the source lacks: the source's runs around it, as typed
        assert rouge_words(written_out(other, words, source, spans)) == rouge_words(output_text(other))
    words = tok.split("Who isolated it? Belventel Garlum Kavik-Valgil did.")
    src = "Who isolated it? Belventel Garlum Kavik-Valgil did."
    assert written_out(["belventel", "garlum", "kavik", "-", "valgil"], words, src, tok.spans(src)) == \
        "Belventel Garlum Kavik-Valgil"
    assert written_out(["it", "did", "?"], words, src, None) == "it did ?"  # no spans: the words joined


def test_ngram_blocking_leaves_no_repeated_trigram_even_for_a_model_that_repeats():
    from qkv.apps.summarize import summarize_batch
    from qkv.data import WordTokenizer
    from qkv.models import create

    rng = random.Random(3)
    texts = [" ".join(rng.choice(FILLER + ["zork", "quux"]) for _ in range(12)) for _ in range(6)]
    tok = WordTokenizer.train(texts, min_freq=2)
    torch.manual_seed(0)
    model = create("pointer", vocab=tok.vocab_size, embed_dim=8, hidden_dim=8, attn_dim=8, coverage=True)
    with torch.no_grad():  # a model that says one word forever: "word word word ..."
        model.out.bias[5] = 50.0
        model.switch.bias.fill_(50.0)
    for beam in (1, 3):
        free = summarize_batch(model, tok, texts, beam=beam, max_len=12)
        assert repeated_ngram_rate([s.tokens for s in free], 3) > 0.5
        for n in (2, 3):
            blocked = summarize_batch(model, tok, texts, beam=beam, max_len=12, no_repeat_ngram_size=n,
                                      coverage_penalty=0.2)
            for s in blocked:
                grams = [tuple(s.tokens[i:i + n]) for i in range(len(s.tokens) - n + 1)]
                assert len(grams) == len(set(grams)) and len(s.tokens) > n


@pytest.mark.parametrize("special", ["<bos>", "<unk>", "<pad>"])
@pytest.mark.parametrize("beam", [1, 3])
def test_special_tokens_are_never_written_and_an_unknown_word_is_the_source_word_attended(special, beam):
    """A model that says only ``special``: no summary shows it; its ``<unk>`` is the source word it attends to most
    at that step, the word a copy gives."""
    from qkv.apps.summarize import summarize_batch
    from qkv.data import WordTokenizer
    from qkv.data.tokenize import SPECIALS
    from qkv.models import create

    rng = random.Random(5)
    texts = [" ".join(rng.choice(FILLER + [_name(rng)]) for _ in range(rng.randrange(4, 12))) for _ in range(6)]
    tok = WordTokenizer.train(texts, min_freq=2)
    torch.manual_seed(1)
    model = create("pointer", vocab=tok.vocab_size, embed_dim=8, hidden_dim=8, attn_dim=8)
    with torch.no_grad():
        model.out.bias[SPECIALS.index(special)] = 50.0
        model.switch.bias.fill_(50.0)  # generate, never copy
    for s in summarize_batch(model, tok, texts, beam=beam, max_len=5):
        assert not any(w in s.text for w in SPECIALS) and not set(s.tokens) & set(SPECIALS), s.text
        assert len(s.attention) >= len(s.tokens) and len(s.p_gen) >= len(s.tokens) and len(s.copied) == len(s.tokens)
        if special == "<unk>":
            assert len(s.tokens) == 5 and all(s.copied)
            assert s.tokens == [s.source_tokens[int(row.argmax())] for row in s.attention[:5]]
            assert s.text.split() == s.tokens or rouge_words(s.text) == rouge_words(" ".join(s.tokens))
        else:  # what the decoder gave stays known, for a page of its attention rows
            assert s.tokens == [] and s.text == "" and s.decoded == [special] * 5
