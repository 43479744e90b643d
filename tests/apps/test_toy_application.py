"""An application defined here, in well under 100 lines (the recipe of CONTRIBUTING.md), registered and run through
the command line: `qkv train`, `qkv evaluate`, `qkv view` (and `qkv predict` where the command exists)."""

import json
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from qkv.apps import register_application, unregister_application
from qkv.apps.base import Application, ApplicationTask, PageInput, Predictor, jsonable, need_text
from qkv.capture import capture_attention
from qkv.cli import main
from qkv.data.text_classification import collate_texts
from qkv.metrics import classification_metrics
from qkv.options import check_options, option
from qkv.train import TrainConfig

# ---- the application: does a sequence of digits hold a 7? ----------------------------------------------------


@dataclass
class ToyOptions:
    data: str = option("digits", help="generated digit sequences")
    n: int = option(200, low=3, help="sequences per split")
    dim: int = option(8, low=1, help="embedding and hidden size")

    def __post_init__(self):
        check_options(self)


def train_defaults(options):
    return TrainConfig(epochs=1, batch_size=16, lr=1e-2, warmup_steps=0, monitor="accuracy")


def load_data(options):
    rng = random.Random(0)
    seqs = [[rng.randrange(10) for _ in range(rng.randint(2, 6))] for _ in range(3 * options.n)]
    pairs = [([d + 4 for d in s], int(7 in s)) for s in seqs]  # ids 4..13: after the special tokens
    return {"train": pairs[:options.n], "valid": pairs[options.n:2 * options.n], "test": pairs[2 * options.n:]}


def model_spec(options, *, vocab_size):
    return {"name": "bigru-classifier", "config": {"vocab_size": vocab_size, "num_classes": 2,
                                                   "embed_dim": options.dim, "hidden_dim": options.dim}}


@torch.no_grad()
def accuracy(model, examples):  # the one metric, for the trainer and the predictor
    batch = collate_texts(examples)
    return classification_metrics(model(batch["ids"], batch["mask"]).logits, batch["labels"])


class ToyTask(ApplicationTask, name="toy-digits", options=ToyOptions, load_data=load_data, model_spec=model_spec):

    def setup(self):
        self.read_data()

    def train_examples(self):
        return self.data["train"]

    def collate(self, examples):
        return collate_texts(examples)

    def sizes(self):
        return {"vocab_size": 14}

    def loss(self, model, batch):
        logits = model(batch["ids"], batch["mask"]).logits
        return F.cross_entropy(logits, batch["labels"], reduction="sum"), len(logits), {}

    def evaluate(self, model, split):
        return accuracy(model, self.data[split])


class ToyPredictor(Predictor):
    task_class = ToyTask

    def predict(self, texts):
        batch = collate_texts([([int(c) + 4 for c in need_text(t, "toy").split()], 0) for t in texts])
        with torch.no_grad():
            return list(self.model(batch["ids"].to(self.device), batch["mask"].to(self.device)).logits)

    def evaluate(self, data=None, *, split="test", limit=None, **settings):
        return accuracy(self.model, self.data(data)[split][:limit])

    def view(self, given):
        with capture_attention(self.model) as records:
            (logits,) = self.predict([given.text])
        return PageInput(records, given.text.split(), title=f"7 inside: {float(logits.softmax(-1)[1]):.2f}")

    def result_row(self, result):
        return jsonable({"output": "7" if int(result.argmax()) else "no 7", "p": result.softmax(-1)[1]})


APP = Application(name="toy-digits", help="a toy: is there a 7?", task=ToyTask, predictor=ToyPredictor,
                  train_defaults=train_defaults)

# ---- the tests --------------------------------------------------------------------------------------------------


@pytest.fixture
def toy():
    register_application(APP)
    yield APP
    unregister_application(APP.name)


def test_a_toy_application_trains_evaluates_views_and_predicts_through_the_cli(toy, tmp_path, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", "toy-digits", "--n", "60", "--epochs", "3", "--no-progress", "--out", str(run)]) == 0
    assert json.loads((run / "best" / "config.json").read_text())["task"] == "toy-digits"
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json", str(tmp_path / "f.json")]) == 0
    figures = json.loads((tmp_path / "f.json").read_text())["run"]
    direct = ToyPredictor.load(run, "cpu").evaluate()
    assert figures["accuracy"] == pytest.approx(direct["accuracy"]) and 0 <= direct["accuracy"] <= 1
    assert main(["view", str(run), "1 7 3", "--out", str(tmp_path / "p.html")]) == 0
    assert "attention" in (tmp_path / "p.html").read_text(encoding="utf-8").lower()
    predictor = ToyPredictor.load(run, "cpu")
    rows = [predictor.result_row(r) for r in predictor.predict(predictor.inputs_from_strings(["1 7", "2 3"]))]
    assert [r["output"] in ("7", "no 7") for r in rows] == [True, True] and json.dumps(rows, allow_nan=False)
    from qkv.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    if "predict" not in commands:
        pytest.skip("qkv predict is not a command of this qkv yet")
    capsys.readouterr()
    assert main(["predict", str(run), "1 7 3", "4 4"]) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    want = [predictor.result_row(r)["output"] for r in predictor.predict(["1 7 3", "4 4"])]
    assert printed == [["1 7 3", want[0]], ["4 4", want[1]]]


def test_a_name_is_registered_once(toy):
    with pytest.raises(ValueError, match="already called 'toy-digits'"):
        register_application(APP)
    with pytest.raises(ValueError, match="not a registered application"):
        unregister_application("translate")
