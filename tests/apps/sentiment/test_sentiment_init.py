"""Sentiment from a pretrained language model (`qkv train sentiment --init LMRUN`): the body starts as the language
model's weights, discriminative rates reach the right parameter groups, gradual unfreezing keeps the lower layers
fixed until their step, the run is read back (predict, evaluate, view, resume) without the language model, and bad
language-model runs are one-line errors."""

import json
import shutil

import pytest
import torch

from qkv.apps.lm import LanguageModel
from qkv.apps.sentiment import SentimentClassifier, SentimentOptions, SentimentTask
from qkv.cli import main
from qkv.data import train_tokenizer
from qkv.models.lm_classifier import LMClassifier
from qkv.train import TrainConfig
from qkv.train.checkpoint import load_checkpoint
from qkv.train.precision import group_lr, layered_groups

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm_run(tiny_run):
    """A tiny character language model trained on the review texts, and the reviews file."""
    return tiny_run("lm"), tiny_run.root / "reviews.tsv"


def train_args(reviews, init, out, *extra):
    return ["train", "sentiment", "--data", str(reviews), "--init", str(init), "--batch-size", "16", "--no-progress",
            "--eval-every", "0", "--out", str(out), *extra]


def lm_weights(run):
    return LanguageModel.load(run, "cpu").model.state_dict()


def test_the_body_starts_as_the_language_model(lm_run):
    run, reviews = lm_run
    task = SentimentTask(SentimentOptions(data=str(reviews), init=str(run)))
    task.setup()
    model = task.build_model()
    assert isinstance(model, LMClassifier)
    lm = lm_weights(run)
    body = model.body.state_dict()
    assert body.keys() == lm.keys()
    for name, tensor in lm.items():
        assert torch.equal(body[name], tensor), name
    assert task.tokenizer == LanguageModel.load(run, "cpu").tokenizer  # the language model's own tokenizer
    # the texts are cut to the language model's context, less its document start
    assert task.max_len == min(100, model.body.cfg.max_len - 1)
    assert max(len(x) for x, _ in task.encoded["train"]) <= task.max_len


def test_the_classifier_reads_each_text_as_its_own_document(gen):
    """Padding changes no logit (causal body, right padding), and the states are the language model's."""
    lm = {"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 2, "max_len": 12, "dropout": 0.0}
    model = LMClassifier(lm, 3, bos_id=2, hops=2, dropout=0.0).eval()
    ids = torch.randint(4, 30, (1, 6), generator=gen)
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = padded != 0
    a, b = model(ids), model(padded, mask)
    torch.testing.assert_close(a.logits, b.logits)
    assert b.weights.shape == (1, 2, 10) and torch.all(b.weights[..., 6:] == 0)
    torch.testing.assert_close(b.weights.sum(-1), torch.ones(1, 2))
    with pytest.raises(ValueError, match="context"):
        model(torch.randint(4, 30, (1, 12), generator=gen))  # 12 tokens and the start are more than 12 positions


@pytest.mark.parametrize("hops", [1, 2])
def test_a_backward_body_reads_each_text_from_its_end_and_gives_weights_in_its_order(gen, hops):
    """A classifier from a backward language model equals the same weights reading each text reversed by hand
    (each row its own length, padding left on the right), and its weights come back in the text's order."""
    lm = {"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 2, "max_len": 12, "dropout": 0.0}
    backward = LMClassifier({**lm, "reverse": True}, 3, bos_id=2, hops=hops, dropout=0.0).eval()
    forward = LMClassifier(lm, 3, bos_id=2, hops=hops, dropout=0.0).eval()
    forward.load_state_dict(backward.state_dict())
    lengths = [7, 3, 5]
    rows = [torch.randint(4, 30, (n,), generator=gen) for n in lengths]
    pad = torch.nn.utils.rnn.pad_sequence
    ids, flipped = pad(rows, batch_first=True), pad([r.flip(0) for r in rows], batch_first=True)
    mask = ids != 0
    got, want = backward(ids, mask), forward(flipped, mask)
    torch.testing.assert_close(got.logits, want.logits)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got.weights[b, ..., :n], want.weights[b, ..., :n].flip(-1))
        assert torch.all(got.weights[b, ..., n:] == 0)
    with pytest.raises(ValueError, match="right-padded"):
        backward(ids, mask.flip(1))


def test_discriminative_rates_reach_the_right_groups(lm_run):
    run, reviews = lm_run
    task = SentimentTask(SentimentOptions(data=str(reviews), init=str(run), lr_decay=3.0, unfreeze=1.0))
    task.setup()
    model = task.build_model()
    config = TrainConfig(batch_size=16, weight_decay=0.1)
    groups = task.param_groups(model, config)
    scale = {id(p): (g["lr_scale"], g["unfreeze_step"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert len(scale) == sum(1 for _ in model.parameters())  # every parameter once (tied output = embedding)
    layers = len(model.body.layers)
    steps = -(-len(task.encoded["train"]) // 16)  # one epoch
    expected = {"embed": layers + 1, **{f"layers.{i}.": layers - i for i in range(layers)}}
    for name, p in model.named_parameters():
        depth = next((d for key, d in expected.items() if name.startswith(f"body.{key}")), 0)
        if name.startswith("body.pos"):
            depth = layers + 1
        lr_scale, unfreeze_step, decay = scale[id(p)]
        assert lr_scale == pytest.approx(3.0 ** -depth), name
        assert unfreeze_step == depth * steps, name
        assert decay == (0.1 if p.ndim >= 2 else 0.0), name


def test_group_lr_freezes_until_the_unfreeze_step():
    layers = [[torch.nn.Parameter(torch.ones(2, 2))], [torch.nn.Parameter(torch.ones(2))]]
    groups = layered_groups(layers, 0.0, lr_decay=2.0, unfreeze_steps=5)
    bottom = next(g for g in groups if g["params"][0] is layers[0][0])
    top = next(g for g in groups if g["params"][0] is layers[1][0])
    assert group_lr(top, 0.1, 0) == pytest.approx(0.1) and layers[1][0].requires_grad
    assert group_lr(bottom, 0.1, 4) == 0.0 and not layers[0][0].requires_grad
    assert group_lr(bottom, 0.1, 5) == pytest.approx(0.05) and layers[0][0].requires_grad
    with pytest.raises(ValueError, match="lr_decay"):
        layered_groups(layers, 0.0, lr_decay=0.5)


@pytest.mark.slow
def test_gradual_unfreezing_keeps_the_body_until_its_turn(lm_run, tmp_path):
    run, reviews = lm_run
    lm = lm_weights(run)
    # the head alone for the first 50 epochs: 4 steps change the head, never the body
    assert main(train_args(reviews, run, tmp_path / "frozen", "--unfreeze", "50", "--max-steps", "4")) == 0
    frozen = load_checkpoint(tmp_path / "frozen" / "checkpoint").state_dict
    for name, tensor in lm.items():  # the final norm belongs to the head (it trains from the start)
        assert torch.equal(frozen[f"body.{name}"], tensor) != name.startswith("norm."), name
    start = SentimentTask(SentimentOptions(data=str(reviews), init=str(run)))
    start.setup()
    head0 = start.build_model().head.weight
    assert not torch.equal(frozen["head.weight"], head0)
    # all at once: the lowest layer moves in the first steps too
    assert main(train_args(reviews, run, tmp_path / "all", "--unfreeze", "0", "--max-steps", "1")) == 0
    moved = load_checkpoint(tmp_path / "all" / "checkpoint").state_dict
    assert not torch.equal(moved["body.embed.weight"], lm["embed.weight"])
    assert all(not torch.equal(moved[f"body.{n}"], t) for n, t in lm.items() if n.startswith("layers.0.") and
               n.endswith("weight"))


@pytest.mark.slow
def test_the_run_is_read_back_and_resumed_without_the_language_model(lm_run, tmp_path, capsys):
    run, reviews = lm_run
    copy = tmp_path / "lm"
    shutil.copytree(run, copy)
    out = tmp_path / "clf"
    assert main(train_args(reviews, copy, out, "--max-steps", "2")) == 0
    shutil.rmtree(copy)
    assert main(train_args(reviews, copy, out, "--max-steps", "4", "--resume")) == 0
    clf = SentimentClassifier.load(out, "cpu")
    assert clf.config["init"] == str(copy) and clf.options.model == "lm"
    (pred,) = clf.predict(["a wonderful film about nothing"])
    assert len(pred.weights) == len(pred.tokens) and abs(sum(pred.weights) - 1) < 1e-5
    assert clf.evaluate()["examples"] > 0
    capsys.readouterr()
    assert main(["predict", str(out), "an awful film"]) == 0
    assert main(["view", str(out), "an awful film", "--out", str(tmp_path / "page.html")]) == 0
    assert (tmp_path / "page.html").is_file()


def test_bad_language_model_runs_are_one_line_errors(lm_run, tmp_path, capsys):
    run, reviews = lm_run

    def error(init, *extra):
        capsys.readouterr()
        assert main(train_args(reviews, init, tmp_path / "out", "--max-steps", "1", *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error: ") and "\n" not in err and "Traceback" not in err
        return err

    assert "no checkpoint" in error(tmp_path / "nowhere")
    clf = tmp_path / "clf"
    assert main(train_args(reviews, run, clf, "--max-steps", "1")) == 0
    assert "not a 'lm' one" in error(clf)  # a sentiment run is not a language model
    weightless = tmp_path / "weightless"
    shutil.copytree(run, weightless)
    for f in weightless.rglob("model.safetensors"):
        f.unlink()
    assert str(weightless) in error(weightless)
    other = tmp_path / "other-tokenizer"
    shutil.copytree(run, other)
    tok = train_tokenizer("char", ["xyz only"])
    for d in other.rglob("assets"):
        shutil.rmtree(d / "tokenizer")
        tok.save(d / "tokenizer")
    assert "tokenizer" in error(other)
    assert "--init goes with model lm" in error(run, "--model", "bigru")
    assert "--min-freq does not apply to --model lm" in error(run, "--min-freq", "2")
    capsys.readouterr()
    assert main(["train", "sentiment", "--data", str(reviews), "--model", "lm", "--max-steps", "1"]) == 2
    assert "--init" in capsys.readouterr().err
    assert json.loads((clf / "checkpoint" / "config.json").read_text())["config"]["options"]["init"] == str(run)
