"""The language-model application: `qkv train lm` learns a pattern, bits per character are the summed negative
log-likelihood over the characters, generation is reproducible, and bad data or prompts are one-line errors."""

import math

import pytest
import torch

from qkv.apps import load_predictor
from qkv.apps.lm import LanguageModel, evaluate_lm
from qkv.apps.lm.task import token_stream, windows
from qkv.cli import main
from qkv.data import train_tokenizer
from qkv.models.lm import CausalLM, LMConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_windows_predict_every_token_but_the_first_once():
    for n, context in [(1, 4), (2, 4), (9, 4), (10, 3), (7, 20)]:
        ids = list(range(1, n + 1))
        targets = [t for w in windows(ids, context) for t in w[1:].tolist()]
        assert targets == ids[1:]
        assert all(len(w) <= context + 1 for w in windows(ids, context))


def test_bits_per_character_is_the_summed_nll_over_the_characters(gen):
    docs = ["the cat sat", "a dog ran far", "il pleut"]
    tok = train_tokenizer("char", docs)
    model = CausalLM(LMConfig(vocab_size=tok.vocab_size, dim=16, num_heads=2, num_layers=1, max_len=64,
                              dropout=0.0)).eval()
    ids, chars = token_stream(tok, docs)
    assert chars == sum(len(d) + 1 for d in docs) and len(ids) == chars + 1  # characters: one token each
    x = torch.tensor([ids])
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(model(x[:, :-1])[0].double(), x[0, 1:], reduction="sum")
    got = evaluate_lm(model, tok, docs, context=64)
    assert got["tokens"] == len(ids) - 1
    assert got["bpc"] == pytest.approx(float(nll) / math.log(2) / chars, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(float(nll) / (len(ids) - 1)), rel=1e-5)
    # shorter windows score every token too (with less context each)
    assert evaluate_lm(model, tok, docs, context=7)["tokens"] == len(ids) - 1


@pytest.fixture(scope="module")
def pattern_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    lines = [("abcde" * 8)[k:k + 30] for k in range(5)] * 40
    (root / "pattern.txt").write_text("\n".join(f"{line} {i}" for i, line in enumerate(lines)) + "\n")
    out = root / "run"
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        assert main(["train", "lm", "--data", str(root / "pattern.txt"), "--context", "32", "--dim", "32",
                     "--num-heads", "2", "--num-layers", "2", "--dropout", "0", "--max-steps", "150",
                     "--batch-size", "16", "--lr", "3e-3", "--eval-every", "0", "--no-progress", "--out",
                     str(out)]) == 0
    return out


@pytest.mark.slow
def test_a_tiny_model_learns_a_repeated_pattern(pattern_run, capsys):
    lm = load_predictor(pattern_run, "cpu")
    assert isinstance(lm, LanguageModel)
    text = lm.predict(["abcdeab"], greedy=True, max_new_tokens=8)[0].text
    assert text.startswith("cdeabcde")
    figures = lm.evaluate(split="test")
    assert figures["bpc"] < 1.5, figures
    assert main(["evaluate", str(pattern_run)]) == 0
    assert "bpc" in capsys.readouterr().out


def test_generation_with_a_seed_is_reproducible_and_stops_at_the_context(pattern_run, caplog):
    lm = load_predictor(pattern_run, "cpu")
    a = lm.predict(["ab", "cd"], seed=3, temperature=1.5, top_k=5)
    assert [r.text for r in a] == [r.text for r in lm.predict(["ab", "cd"], seed=3, temperature=1.5, top_k=5)]
    long = lm.predict(["abcde" * 5], max_new_tokens=100, temperature=3.0, seed=0)[0]
    assert long.stopped in ("context", "end")
    if long.stopped == "context":
        assert len(long.tokens) == 32 - 26 and "context" in caplog.text


@pytest.mark.parametrize("bad, match", [
    (dict(prompts=["x" * 40]), "prompt 1 is 40 tokens; the model reads at most 30"),
    (dict(prompts=["ab"], temperature=0), "temperature must be (a positive number|> 0)"),
    (dict(prompts=["ab"], top_p=1.5), "top_p"),
    (dict(prompts=["ab"], max_new_tokens=0), "max_new_tokens"),
])
@pytest.mark.slow
def test_bad_prompts_and_settings_are_errors(pattern_run, bad, match):
    lm = load_predictor(pattern_run, "cpu")
    with pytest.raises(ValueError, match=match):
        lm.predict(**bad)


@pytest.mark.parametrize("content, match", [(b"", "no text in the file"), (b"\x00\x01\x02\x03\n", "binary file"),
                                            (b"only\ntwo\n", "2 distinct document")])
def test_bad_text_files_are_one_line_errors(tmp_path, capsys, content, match):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    assert main(["train", "lm", "--data", str(path), "--max-steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and match in err and len(err.splitlines()) == 1


def test_view_writes_every_layers_attention(pattern_run, tmp_path):
    page = tmp_path / "lm.html"
    assert main(["view", str(pattern_run), "abcdeabc", "--out", str(page)]) == 0
    html = page.read_text()
    assert "layers.0.self_attn" in html and "layers.1.self_attn" in html


def test_qkv_generate_is_reproducible_and_refuses_what_it_would_ignore(pattern_run, tmp_path, capsys):
    import json

    argv = ["generate", str(pattern_run), "abc", "cde", "--max-new-tokens", "6", "--top-k", "4", "--seed", "5"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv + ["--json", str(tmp_path / "g.json")]) == 0
    assert capsys.readouterr().out.startswith(first)
    rows = json.loads((tmp_path / "g.json").read_text())
    assert [r["input"] for r in rows] == ["abc", "cde"]
    assert [f"{r['input']}\t{r['continuation']}" for r in rows] == first.splitlines()
    for bad, flag in [(["--strategy", "greedy", "--temperature", "0.5"], "--temperature"),
                      (["--temperature", "0"], "--temperature"), (["--device", "tpu"], "--device")]:
        assert main(["generate", str(pattern_run), "abc", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error:") and flag in err and len(err.splitlines()) == 1


def test_a_short_budget_gets_the_smaller_model_and_flags_win(tmp_path, capsys):
    from qkv.apps import application
    from qkv.cli import build_parser
    from qkv.cli.train import read_train_options

    app = application("lm")
    base = ["train", "lm", "--data", "x.txt", "--out", str(tmp_path / "r")]
    short, _ = read_train_options(build_parser().parse_args(base + ["--max-minutes", "5"]), app.options,
                                  app.train_defaults, app.budget_defaults)
    assert (short.dim, short.num_layers, short.context, short.dropout) == (96, 3, 64, 0.0)
    mine, _ = read_train_options(build_parser().parse_args(base + ["--max-minutes", "5", "--dim", "64",
                                                                   "--dropout", "0.2"]),
                                 app.options, app.train_defaults, app.budget_defaults)
    assert (mine.dim, mine.num_layers, mine.dropout) == (64, 3, 0.2)
    long, _ = read_train_options(build_parser().parse_args(base + ["--max-minutes", "30"]), app.options,
                                 app.train_defaults, app.budget_defaults)
    assert (long.dim, long.num_layers, long.context, long.dropout) == (128, 4, 128, 0.1)


def test_view_reads_up_to_the_context_and_says_where_it_cut(pattern_run, caplog):
    from qkv.apps.base import ViewInput

    lm = load_predictor(pattern_run, "cpu")
    full = lm.view(ViewInput(text="a" * 31))  # with the start token: the whole context of 32
    assert len(full.tokens) == 32 and not any("cut" in n for n in full.notes)
    cut = lm.view(ViewInput(text="a" * 50))
    assert len(cut.tokens) == 32 and any("cut to its first 31 tokens" in n for n in cut.notes)
    assert "cut" in caplog.text


def test_a_run_goes_on_from_another_runs_tokenizer_shape_and_weights(pattern_run, tmp_path, capsys):
    """``--init RUN``: the new run starts as that run (the same tokenizer, architecture and weights) on another
    text, keeps what it needs to resume without it, and a different architecture or a run of another kind is a
    one-line error."""
    import dataclasses
    import json
    import shutil

    from qkv.apps.lm import LMOptions, LMTask

    start = tmp_path / "start"
    shutil.copytree(pattern_run, start)
    other = tmp_path / "other.txt"
    other.write_text("\n".join(f"edcba {i} " * 3 for i in range(60)) + "\n")
    before = LanguageModel.load(start, "cpu")
    task = LMTask(LMOptions(data=str(other), init=str(start)))  # the defaults' shape (128 wide, 4 layers) is not it
    task.setup()
    model = task.build_model()
    assert (task.options.dim, task.options.num_layers, task.options.context) == (32, 2, 32)
    assert task.tokenizer == before.tokenizer
    state = before.model.state_dict()
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)

    out = tmp_path / "next"
    argv = ["train", "lm", "--data", str(other), "--init", str(start), "--max-steps", "2", "--batch-size", "8",
            "--eval-every", "0", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    after = LanguageModel.load(out, "cpu")
    assert after.tokenizer == before.tokenizer  # and the shape; the dropout is the new run's own
    assert dataclasses.replace(after.model.cfg, dropout=0.0) == before.model.cfg
    assert json.loads((out / "checkpoint" / "assets" / "init.json").read_text())["run"] == str(start)
    shutil.rmtree(start)  # a resumed run needs its checkpoint only
    assert main([*argv[:argv.index("--max-steps") + 1], "4", *argv[argv.index("--max-steps") + 2:], "--resume"]) == 0
    capsys.readouterr()

    for bad, match in [(["--init", str(out), "--dim", "64"], "dim=64 (the run's: 32)"),
                       (["--init", str(tmp_path / "none")], "no checkpoint")]:
        assert main(["train", "lm", "--data", str(other), *bad, "--max-steps", "1", "--no-progress", "--out",
                     str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error:") and "init" in err and match in err and len(err.splitlines()) == 1, err


def test_a_backward_stream_is_each_document_reversed():
    docs = ["the cat", "ab", "il pleut"]
    tok = train_tokenizer("char", docs)
    forward, chars = token_stream(tok, docs)
    backward, chars_back = token_stream(tok, docs, reverse=True)
    assert chars_back == chars
    assert backward == token_stream(tok, [d[::-1] for d in docs])[0]
    assert sorted(backward) == sorted(forward) and backward != forward


@pytest.mark.slow
def test_a_backward_model_learns_the_pattern_leftwards_and_writes_what_comes_before(pattern_run, tmp_path):
    """``--reverse``: trained on every document from its end, scored the same way, and its generation is the
    text before the prompt, in the text's order."""
    text = (pattern_run.parent / "pattern.txt")
    out = tmp_path / "backward"
    with torch.random.fork_rng():
        assert main(["train", "lm", "--data", str(text), "--reverse", "--context", "32", "--dim", "32",
                     "--num-heads", "2", "--num-layers", "2", "--dropout", "0", "--max-steps", "150",
                     "--batch-size", "16", "--lr", "3e-3", "--eval-every", "0", "--no-progress", "--out",
                     str(out)]) == 0
    lm = load_predictor(out, "cpu")
    assert lm.backward and lm.model.cfg.reverse and not load_predictor(pattern_run, "cpu").backward
    figures = lm.evaluate(split="test")
    assert figures["bpc"] < 1.5, figures
    # its own score equals the summed NLL of the reversed documents, read forwards by the same weights
    docs = lm.dataset(None).split("test")[:5]
    forward_view = evaluate_lm(_forward(lm.model), lm.tokenizer, [d[::-1] for d in docs], context=32)
    assert evaluate_lm(lm.model, lm.tokenizer, docs, context=32)["bpc"] == pytest.approx(forward_view["bpc"])
    got = lm.predict(["cdeab 17"], greedy=True, max_new_tokens=8)[0]
    assert got.text == "eabcdeab" and "".join(got.tokens) == got.text
    assert lm.result_row(got)["output"] == "eabcdeab" + "cdeab 17"


def _forward(model):
    """The same weights in a model that says it reads forwards."""
    import copy
    import dataclasses

    twin = copy.deepcopy(model)
    twin.cfg = dataclasses.replace(model.cfg, reverse=False)
    return twin
