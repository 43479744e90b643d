"""The translation task end to end through the CLI, on tiny data: train, translate, evaluate, resume."""

import json
from types import SimpleNamespace

import pytest
import torch

from qkv.apps.translate import TranslateOptions, TranslateTask, Translator, load_data, model_spec
from qkv.apps.translate import parse_buckets as _buckets
from qkv.cli import main
from qkv.metrics import translation_metrics
from qkv.models import create
from qkv.train import resolve_checkpoint

TINY = ["--n-train", "300", "--eval-max", "20", "--hidden-dim", "32", "--embed-dim", "16", "--batch-size", "32",
        "--no-progress", "--log-every", "2"]


@pytest.fixture(scope="module")
def dates_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for model in ("bahdanau", "fixed"):
        out = root / model
        assert main(["train", "translate", "--data", "dates", "--model", model, "--max-steps", "6", "--out",
                     str(out), *TINY]) == 0
        runs[model] = out
    return runs


def test_train_writes_a_loadable_checkpoint(dates_runs, capsys):
    out = dates_runs["bahdanau"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    finals = {x["split"]: x["metrics"] for x in lines if x["event"] == "final"}
    assert {"exact_match", "bleu", "chrf"} <= set(finals["test"])
    translator = Translator.load(out)
    ckpt = resolve_checkpoint(out)
    model, config = translator.model, json.loads((ckpt / "config.json").read_text())["config"]
    assert config["model"]["name"] == "bahdanau" and (ckpt / "assets" / "src_tokenizer").is_dir()
    assert translator.options.model == "bahdanau" and translator.options.n_train == 300
    # the checkpoint's model entry alone rebuilds the model: identical outputs
    again = create(config["model"]["name"], **config["model"]["config"])
    again.load_state_dict(model.state_dict())
    again.eval()
    src = torch.randint(4, 20, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    tgt = torch.randint(4, 12, (3, 5))
    assert torch.equal(model(src, mask, tgt), again(src, mask, tgt))


def test_a_stored_option_that_does_not_apply_is_reset(dates_runs, tmp_path):
    """A run stores every option; one that does not apply to its model (here a Transformer width in a Bahdanau
    run, as a release with another default would have stored it) is reset on load, not refused."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(dates_runs["bahdanau"], run)
    for config_path in run.glob("*/config.json"):
        config = json.loads(config_path.read_text())
        config["config"]["options"]["dim"] = 999
        config_path.write_text(json.dumps(config))
    translator = Translator.load(run)
    assert translator.options.dim == TranslateOptions().dim and translator.options.model == "bahdanau"


@pytest.mark.slow
def test_translate_command_with_plot_and_files(dates_runs, tmp_path, capsys):
    out = dates_runs["bahdanau"]
    png = tmp_path / "align.png"
    assert main(["translate", str(out), "7 mars 2019", "--beam", "2", "--max-len", "12", "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("7 mars 2019\t") and png.read_bytes()[:4] == b"\x89PNG"
    src = tmp_path / "in.txt"
    src.write_text("2019年3月7日\nMarch 7, 2019\n", encoding="utf-8")
    dst = tmp_path / "out.txt"
    assert main(["translate", str(out), "--file", str(src), "--output", str(dst), "--beam", "1", "--max-len", "12",
                 "--plot", str(tmp_path / "a.svg")]) == 0
    assert len(dst.read_text(encoding="utf-8").splitlines()) == 2
    assert (tmp_path / "a-0.svg").exists() and (tmp_path / "a-1.svg").exists()
    assert main(["translate", str(out)]) == 2  # nothing to translate: a clear error
    assert "give sentences" in capsys.readouterr().err
    assert main(["translate", str(out), "  "]) == 2  # an empty sentence is an error, not a translation
    assert capsys.readouterr().err.strip() == "qkv: error: text 1 is empty: nothing to translate"


def test_translator_api_matches_the_model(dates_runs):
    translator = Translator.load(dates_runs["bahdanau"])
    [r] = translator.predict(["7 mars 2019"], beam=1, max_len=12)
    ids = translator.src_tokenizer.encode("7 mars 2019")
    assert r.source_tokens == translator.src_tokenizer.tokens_of_ids(ids)
    assert r.attention.shape == (len(r.tokens) + 1, len(ids)) or r.attention.shape == (len(r.tokens), len(ids))
    torch.testing.assert_close(r.attention.sum(-1), torch.ones(r.attention.shape[0]))
    # greedy decoding by hand with the model gives the same tokens
    src = torch.tensor([ids])
    state = translator.model.encode(src, torch.ones_like(src, dtype=torch.bool))
    y, out = torch.tensor([1]), []
    with torch.no_grad():
        for _ in range(12):
            logits, _, state = translator.model.decode_step(y, state)
            y = logits.argmax(-1)
            if int(y) == 2:
                break
            out.append(int(y))
    assert translator.tgt_tokenizer.decode(out) == r.text


def test_build_model_is_the_spec():
    options = TranslateOptions(model="transformer", dim=32, num_heads=2, num_layers=2)
    task = TranslateTask(options)
    task.src_tokenizer, task.tgt_tokenizer = SimpleNamespace(vocab_size=30), SimpleNamespace(vocab_size=40)
    model = task.build_model()
    spec = model_spec(options, src_vocab=30, tgt_vocab=40)
    assert spec["name"] == "transformer" and spec["config"]["ffn_dim"] == 128
    again = create(spec["name"], **spec["config"])
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in again.state_dict().items()}


def test_too_small_corpus_is_an_error(tmp_path, capsys):
    path = tmp_path / "one.tsv"
    path.write_text("hello\tbonjour\n", encoding="utf-8")
    with pytest.raises(ValueError, match="too few sentence pairs.*1 train, 0 valid, 0 test"):
        load_data(TranslateOptions(data=str(path)))
    assert main(["train", "translate", "--data", str(path), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and "too few sentence pairs" in err and "\n" not in err
    assert not (tmp_path / "r" / "best").exists()


def test_evaluate_compares_checkpoints_by_length(dates_runs, tmp_path, capsys):
    js = tmp_path / "eval.json"
    png = tmp_path / "buckets.png"
    assert main(["evaluate", str(dates_runs["fixed"]), str(dates_runs["bahdanau"]), "--beam", "1", "--max-len", "12",
                 "--max-examples", "30", "--buckets", "0,12,20,40", "--plot", str(png), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "| metric | fixed | bahdanau |" in text and "| bleu |" in text and "| bleu@0-12 |" in text
    data = json.loads(js.read_text())
    assert set(data) == {"fixed", "bahdanau"}
    fixed = data["fixed"]
    assert [k for k in fixed if k.startswith("bleu@")] == ["bleu@0-12", "bleu@13-20", "bleu@21-40"]
    assert sum(fixed[f"sentences@{b}"] for b in ("0-12", "13-20", "21-40")) == fixed["sentences"] == 30
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_resume_continues_the_run(dates_runs, tmp_path):
    out = tmp_path / "r"
    args = ["train", "translate", "--data", "dates", "--model", "luong", "--out", str(out), *TINY]
    assert main([*args, "--max-steps", "2"]) == 0
    assert main([*args, "--max-steps", "4"]) == 2  # an existing run is not overwritten without --resume
    assert main([*args, "--max-steps", "4", "--resume"]) == 0
    steps = [json.loads(x)["global_step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 4


def test_corpus_file_with_subwords(tmp_path, capsys):
    pairs = [("the cat sleeps", "le chat dort"), ("the dog eats", "le chien mange"), ("a cat eats", "un chat mange"),
             ("the cat eats", "le chat mange"), ("a dog sleeps", "un chien dort")] * 8
    path = tmp_path / "tiny-eng-fra.tsv"
    lines = [f"{e} {i}\t{f} {i}\tCC-BY" for i, (e, f) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tf"
    assert main(["train", "translate", "--data", str(path), "--src-lang", "en", "--model", "transformer",
                 "--vocab-size", "60", "--max-steps", "3", "--out", str(out), "--dim", "32", "--num-heads", "2",
                 "--batch-size", "8", "--no-progress"]) == 0
    assert main(["translate", str(out), "the cat sleeps", "--beam", "3", "--max-len", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("the cat sleeps\t")


def test_bad_options(tmp_path, capsys):
    assert main(["train", "translate", "--data", str(tmp_path / "missing.tsv"), "--out", str(tmp_path / "x")]) == 2
    assert "no such corpus file" in capsys.readouterr().err
    for bad in ("10,5", "0,x", "5"):
        with pytest.raises(ValueError, match="increasing edges"):
            _buckets(bad)
    assert _buckets("0,10,20") == ((0, 10), (11, 20))


def test_evaluate_on_a_moved_or_new_data_file(tmp_path, capsys):
    pairs = [(f"the cat {i}", f"le chat {i}") for i in range(80)]
    data = tmp_path / "c.tsv"
    data.write_text("".join(f"{e}\t{f}\n" for e, f in pairs), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", "translate", "--data", str(data), "--model", "bahdanau", "--tokenizer", "char",
                 "--max-steps", "2", "--hidden-dim", "16", "--embed-dim", "8", "--batch-size", "16", "--out", str(out),
                 "--no-progress"]) == 0
    moved = tmp_path / "moved.tsv"
    data.rename(moved)
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data", str(moved), "--beam", "1", "--max-len", "8"]) == 0
    assert "| metric | run |" in capsys.readouterr().out
    assert main(["evaluate", str(out)]) == 2  # the training file is gone and no --data: a clear error
    assert "no such corpus file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_trainers_evaluation_is_qkv_evaluates_with_every_reference(tmp_path):
    """A corpus whose sources have two translations each: the trainer's final figures are those of
    ``Translator.evaluate`` at the same beam (every distinct source once, against all of its translations), not of
    the pairs one by one."""
    import json

    pairs = [(f"the cat {i}", f"{article} chat {i}") for article in ("le", "un") for i in range(60)]
    data = tmp_path / "c.tsv"
    data.write_text("".join(f"{e}\t{f}\n" for e, f in pairs), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", "translate", "--data", str(data), "--model", "bahdanau", "--tokenizer", "char",
                 "--max-steps", "30", "--hidden-dim", "16", "--embed-dim", "8", "--batch-size", "16", "--out", str(out),
                 "--max-decode-len", "12", "--no-progress"]) == 0
    final = {e["split"]: e["metrics"] for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if e.get("event") == "final"}
    tr = Translator.load(out, "cpu")
    grouped = load_data(tr.options).references("test")
    assert grouped and all(len(refs) == 2 for _, refs in grouped)  # a source's translations stay in one split
    again = tr.evaluate(split="test", beam=1, buckets=None)  # max_len: the run's max_decode_len
    assert final["test"]["sentences"] == again["sentences"] == len(grouped)
    assert final["test"]["bleu"] == pytest.approx(again["bleu"], abs=1e-9)
    assert final["test"]["exact_match"] == pytest.approx(again["exact_match"], abs=1e-12)


def test_scores_with_several_references():
    hyps = ["le petit chat dort sur le lit", "bonjour à tous"]
    refs = [["le chat dort sur le lit", "le petit chat dort sur le lit"], ["salut tout le monde"]]
    m = translation_metrics(hyps, refs)
    assert m["exact_match"] == 0.5 and m["sentences"] == 2
    one = translation_metrics(hyps, [r[:1] for r in refs])  # a second reference can only help
    assert 0 < one["bleu"] < m["bleu"] <= 100 and one["exact_match"] == 0


def test_a_source_past_the_limit_is_cut_with_a_word(dates_runs, caplog):
    """A text longer than MAX_SOURCE_TOKENS is read up to the limit, and says so: a warning, `cut` on the result, a
    note on the `qkv view` page; a text within the limit is not touched."""
    from qkv.apps.base import ViewInput
    from qkv.apps.translate import Translator
    from qkv.apps.translate.decode import MAX_SOURCE_TOKENS

    tr = Translator.load(dates_runs["bahdanau"], "cpu")
    long = "7 mars 2019 " * 40  # characters are the tokens of the dates task
    n = len(tr.src_tokenizer.encode(long))
    assert n > MAX_SOURCE_TOKENS
    with caplog.at_level("WARNING"):
        short_result, long_result = tr.predict(["7 mars 2019", long], beam=1, max_len=5)
    assert long_result.cut == n - MAX_SOURCE_TOKENS and len(long_result.source_tokens) == MAX_SOURCE_TOKENS
    assert short_result.cut == 0
    assert [r.getMessage() for r in caplog.records if "leaves out" in r.getMessage()] == \
        [f"text 2 has {n} tokens: the translator reads the first {MAX_SOURCE_TOKENS} and leaves out the last "
         f"{n - MAX_SOURCE_TOKENS}"]
    page = tr.view(ViewInput(text=long), max_len=5)
    assert any(f"{n - MAX_SOURCE_TOKENS} more were not read" in note for note in page.notes)
    assert len(page.tokens["source"]) == MAX_SOURCE_TOKENS
    assert not any("not read" in note for note in tr.view(ViewInput(text="7 mars 2019")).notes)
