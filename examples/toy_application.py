"""A whole application in one file: does a sentence mention a seven? Registered, it gets `qkv train toy`,
`qkv predict`, `qkv evaluate`, `qkv view` and `qkv export` with nothing else to write."""

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkv.apps import register_application
from qkv.apps.base import Application, ApplicationTask, PageInput, Predictor, jsonable, text_inputs
from qkv.apps.export import text_classifier_graphs
from qkv.data import train_tokenizer
from qkv.data.text_classification import collate_texts
from qkv.options import check_options, option
from qkv.train import TrainConfig

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@dataclass
class ToyOptions:  # the options of `qkv train toy`: each field a flag (--n, --dim)
    data: str = option("numbers", help="generated sentences of number words")
    n: int = option(200, low=3, help="sentences per split")
    dim: int = option(16, low=1, help="embedding and hidden size")

    def __post_init__(self):
        check_options(self)


@dataclass
class ToySettings:  # the one setting of predict and evaluate
    threshold: float = option(0.5, low=0, high=1, help="say 'seven' above this probability")


def load_data(options):  # (text, label) pairs; label 1 when "seven" is in the text
    rng = random.Random(0)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(3 * options.n)]
    pairs = [(t, int("seven" in t.split())) for t in texts]
    return {"train": pairs[:options.n], "valid": pairs[options.n:2 * options.n], "test": pairs[2 * options.n:]}


def model_spec(options, *, vocab_size):  # JSON for qkv.models.create
    return {"name": "bigru-classifier", "config": {"vocab_size": vocab_size, "num_classes": 2,
                                                   "embed_dim": options.dim, "hidden_dim": options.dim}}


@torch.no_grad()
def accuracy(model, tokenizer, pairs, threshold=0.5):  # the one metric, for the trainer and the predictor
    batch = collate_texts([(tokenizer.encode(t), y) for t, y in pairs])
    p = model(batch["ids"], batch["mask"]).logits.softmax(-1)[:, 1]
    return {"accuracy": float(((p > threshold).long() == batch["labels"]).float().mean())}


class ToyTask(ApplicationTask, name="toy", options=ToyOptions, load_data=load_data, model_spec=model_spec,
              assets=("tokenizer",)):
    def setup(self):
        data = self.read_data()
        if self.tokenizer is None:  # fitted on the training texts; saved and reloaded by the base
            self.tokenizer = train_tokenizer("word", [t for t, _ in data["train"]])

    def train_examples(self):
        return self.data["train"]

    def collate(self, pairs):
        return collate_texts([(self.tokenizer.encode(t), y) for t, y in pairs])

    def sizes(self):
        return {"vocab_size": self.tokenizer.vocab_size}

    def loss(self, model, batch):
        logits = model(batch["ids"], batch["mask"]).logits
        return F.cross_entropy(logits, batch["labels"], reduction="sum"), len(logits), {}

    def evaluate(self, model, split):
        return accuracy(model, self.tokenizer, self.data[split])


class ToyPredictor(Predictor):
    task_class = ToyTask
    settings = ToySettings

    def predict(self, texts, *, threshold=0.5):
        self.check_settings({"threshold": threshold}, "predict")
        batch = collate_texts([(self.tokenizer.encode(t), 0) for t in text_inputs(texts)])
        with torch.no_grad():
            p = self.model(batch["ids"].to(self.device), batch["mask"].to(self.device)).logits.softmax(-1)[:, 1]
        return [{"seven": bool(x > threshold), "p": float(x)} for x in p]

    def evaluate(self, data=None, *, split="test", limit=None, threshold=0.5):
        self.check_settings({"threshold": threshold})
        return accuracy(self.model, self.tokenizer, self.dataset(data)[split][:limit], threshold)

    def view_page(self, records, text, result):
        return PageInput(records, self.tokenizer.tokens(text), title=f"seven: {result['p']:.2f}")

    def result_row(self, result):
        return jsonable({"output": "seven" if result["seven"] else "no seven", "p": result["p"]})


APPLICATION = register_application(Application(
    name="toy", help="a toy: does a sentence mention a seven?", task=ToyTask, predictor=ToyPredictor,
    train_defaults=lambda options: TrainConfig(epochs=3, batch_size=16, lr=1e-2, monitor="accuracy"),
    export=text_classifier_graphs))
