"""Question answering with attention: the options, data, model, the trainer's task and a :class:`Reader`.

The question is the query, the context's tokens are the keys and values: a reader points at the answer's first
and last token (seed 004: asked *when* the mass-energy equation was proposed, attention goes to "1905"). The
default data is generated fact passages (English words or Chinese characters, held-out entities and phrasings,
:mod:`qkv.data.facts`); SQuAD v1.1 JSON and ``context<TAB>question<TAB>answer`` files work too
(:mod:`qkv.data.squad`). Models: the Attentive Reader, a BiDAF-style reader and a Transformer encoder
(:mod:`qkv.models.reading`). Metrics: SQuAD's exact match and F1 (characters for Chinese).

Example::

    from qkv.tasks.qa import QAOptions, QATask, Reader, train_defaults
    from qkv.train import train
    options = QAOptions(data="facts", lang="zh", model="reader")
    train(QATask(options), train_defaults(options).replace(max_minutes=5, out="runs/qa-zh"))
    Reader.load("runs/qa-zh").predict("质能方程由爱因斯坦于1905年提出。", "质能方程是什么时候提出的?").answer  # '1905'
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..options import check_options, option
from ..train.task import Task
from .base import load_run
from .qa_encode import Encoded, collate_qa, encode_example

logger = logging.getLogger(__name__)

__all__ = ["QAOptions", "load_data", "model_spec", "build_model", "train_defaults", "QATask", "Answer", "Reader",
           "predict_examples", "MODELS"]

MODELS = ("reader", "bidaf", "transformer")
_NAMES = {"reader": "attentive-reader", "bidaf": "bidaf-reader", "transformer": "transformer-reader"}
_RNN = {"model": ("reader", "bidaf")}
_TRANSFORMER = {"model": ("transformer",)}
_FACTS = {"data": ("facts",)}


@dataclass
class QAOptions:
    """What to train on and which reader; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("facts", help="'facts' (generated) or a SQuAD v1.1 .json / context<TAB>question<TAB>answer "
                                     "file, .gz allowed")
    lang: str = option("en", choices=("en", "zh"), applies=_FACTS, help="facts: English words or Chinese characters")
    n_train: int = option(20_000, low=1, applies=_FACTS, help="facts: training questions")
    n_eval: int = option(1_000, low=1, applies=_FACTS, help="facts: questions in valid, test and test_phrasings each")
    entities: int = option(600, low=30, applies=_FACTS, help="facts: training names of each kind")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_FACTS,
                           help="answers that are not spans of their context: stop, or skip and count them")
    valid: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_FACTS, help="file: fraction of contexts "
                          "for validation")
    test: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_FACTS, help="file: fraction of contexts "
                         "for the test")
    data_seed: int = option(0, low=0, help="seed of the facts' generation and of a file's split")
    # tokens
    tokenizer: str = option("auto", choices=("auto", "word", "char"),
                            help="auto = characters for Chinese text, words otherwise")
    min_freq: int = option(1, low=1, help="words seen fewer times in training become <unk>")
    max_context: int = option(400, low=1, help="context tokens kept")
    max_question: int = option(64, low=1, help="question tokens kept")
    word_dropout: float = option(0.1, low=0, high=0.9, help="training: each distinct token of an example becomes "
                                 "<unk> with this probability (as unseen names will be)")
    match_feature: bool = option(True, help="flag the context tokens that occur in the question")
    # model
    model: str = option("reader", choices=MODELS, help="reader (Attentive Reader), bidaf or transformer")
    score: str | None = option(None, help="attention score, any qkv score name (default: general for the RNN "
                                          "readers, scaled_dot for the transformer)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="RNN readers: token embedding size")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNN readers: BiGRU output, both directions together")
    dim: int = option(128, low=2, applies=_TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=_TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=_TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")
    num_layers: int | None = option(None, low=1, help="BiGRU layers (default 1) or transformer layers (default 3)")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # evaluation
    max_answer_len: int = option(20, low=1, help="longest answer decoded, in tokens")
    eval_max: int = option(1000, low=1, help="questions answered per evaluation")

    def __post_init__(self):
        check_options(self)
        if self.model == "transformer" and self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")
        if self.model != "transformer" and self.hidden_dim % 2:
            raise ValueError(f"hidden_dim ({self.hidden_dim}) must be even: it is split between two directions")

    @property
    def score_name(self) -> str:
        return self.score or ("scaled_dot" if self.model == "transformer" else "general")

    @property
    def layers(self) -> int:
        return self.num_layers or (3 if self.model == "transformer" else 1)


def train_defaults(options: QAOptions):
    """The trainer's settings for question answering (the ``qkv train qa`` defaults)."""
    from ..train import TrainConfig

    splits = ("valid", "test", "test_phrasings") if options.data == "facts" else ("valid", "test")
    epochs = 10 if options.model == "transformer" else 3  # the Transformer learns to point more slowly
    return TrainConfig(epochs=epochs, batch_size=32, lr=2e-3, warmup_steps=100, schedule="cosine", weight_decay=0.01,
                       monitor="exact_match", final_splits=splits)


def _split_file(examples, options: QAOptions) -> dict[str, list]:
    """Train/valid/test by context (a context's questions stay together), shuffled with ``data_seed``."""
    contexts = sorted({e.context for e in examples})
    random.Random(options.data_seed).shuffle(contexts)
    n = len(contexts)
    n_valid, n_test = max(1, round(n * options.valid)), max(1, round(n * options.test))
    side = {c: "valid" for c in contexts[:n_valid]}
    side.update({c: "test" for c in contexts[n_valid:n_valid + n_test]})
    splits: dict[str, list] = {"train": [], "valid": [], "test": []}
    for e in examples:
        splits[side.get(e.context, "train")].append(e)
    if not all(splits.values()):
        counts = ", ".join(f"{len(v)} {k}" for k, v in splits.items())
        raise ValueError(f"{options.data}: {n} distinct contexts give {counts} questions; every split needs at "
                         "least one (at least 3 contexts)")
    return splits


def load_data(options: QAOptions):
    """The :class:`qkv.data.facts.QACorpus` that ``options`` describe (generated facts, or a file split by context)."""
    from ..data.facts import QACorpus, fact_corpus
    from ..data.squad import read_qa_file

    if options.data == "facts":
        return fact_corpus(options.lang, options.n_train, options.n_eval, seed=options.data_seed,
                           entities=options.entities)
    if not Path(options.data).is_file():
        raise FileNotFoundError(f"no such data file: {options.data} (data)")
    read = read_qa_file(options.data, on_error=options.on_error)
    if read.skipped:
        logger.warning("%s: %d question(s) skipped", options.data, read.skipped)
    return QACorpus(_split_file(read.examples, options), "zh" if _chinese(read.examples) else "en")


def _chinese(examples) -> bool:
    text = "".join(e.context for e in examples[:200])
    return sum("\u3400" <= c <= "\u9fff" for c in text) > 0.3 * max(1, sum(not c.isspace() for c in text))


def model_spec(options: QAOptions, *, vocab_size: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`: the reader ``options`` describe."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "score": o.score_name, "dropout": o.dropout,
                              "match_feature": o.match_feature, "num_layers": o.layers}
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim,
                      max_len=max(o.max_context, o.max_question))
    else:
        config.update(embed_dim=o.embed_dim, hidden_dim=o.hidden_dim)
    return {"name": _NAMES[o.model], "config": config}


def build_model(options: QAOptions, *, vocab_size: int) -> nn.Module:
    """A new reader (see :func:`model_spec`)."""
    from ..models import create

    spec = model_spec(options, vocab_size=vocab_size)
    return create(spec["name"], **spec["config"])


def train_tokenizer(options: QAOptions, corpus):
    """Words (lower-cased) or characters of the training contexts and questions."""
    from ..data.tokenize import CharTokenizer, WordTokenizer

    kind = options.tokenizer if options.tokenizer != "auto" else ("char" if corpus.language == "zh" else "word")
    texts = [t for e in corpus.train for t in (e.context, e.question)]
    if kind == "char":
        return CharTokenizer.train(texts, min_freq=options.min_freq)
    return WordTokenizer.train(texts, min_freq=options.min_freq)


class QATask(Task):
    """Span extraction: cross-entropy of the answer's start token plus that of its end token."""

    name = "qa"
    unit = "items"

    def __init__(self, options: QAOptions, corpus=None):
        self.options = options
        self.corpus = corpus
        self.tokenizer = None
        self.encoded: dict[str, list[Encoded]] = {}

    def setup(self) -> None:
        o = self.options
        if self.corpus is None:
            self.corpus = load_data(o)
        if self.tokenizer is None:
            self.tokenizer = train_tokenizer(o, self.corpus)
        for split, examples in self.corpus.splits.items():
            self.encoded[split] = [encode_example(e.context, e.question, self.tokenizer, max_context=o.max_context,
                                                  max_question=o.max_question,
                                                  answer=(e.answer_start, e.answer_end)) for e in examples]
        train = [e for e in self.encoded["train"] if e.start >= 0]
        if len(train) < len(self.encoded["train"]):
            logger.warning("%d training questions have their answer beyond max_context (%d tokens): left out",
                           len(self.encoded["train"]) - len(train), o.max_context)
        if not train:
            raise ValueError(f"{o.data}: no training question has its answer within max_context={o.max_context}")
        self._train = train
        logger.info("%s: %s questions; vocabulary %d", o.data,
                    ", ".join(f"{len(v)} {k}" for k, v in self.corpus.splits.items()), self.tokenizer.vocab_size)

    def save_assets(self, directory: Path) -> None:
        self.tokenizer.save(directory / "tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ..data.tokenize import load_tokenizer

        self.tokenizer = load_tokenizer(directory / "tokenizer")

    def train_examples(self):
        return self._train

    def lengths(self):
        return [len(e.context) for e in self._train]

    def collate(self, examples):
        return collate_qa(examples, word_dropout=self.options.word_dropout)

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, vocab_size=self.tokenizer.vocab_size),
                "options": dataclasses.asdict(self.options)}

    def build_model(self) -> nn.Module:
        return build_model(self.options, vocab_size=self.tokenizer.vocab_size)

    def loss(self, model, batch):
        out = model(batch["context"], batch["context_mask"], batch["question"], batch["question_mask"], batch["match"])
        start, end = batch["start"], batch["end"]
        loss = F.cross_entropy(out.start_logits, start, reduction="sum") + \
            F.cross_entropy(out.end_logits, end, reduction="sum")
        hit = (out.start_logits.argmax(-1) == start) & (out.end_logits.argmax(-1) == end)
        return loss, len(start), {"span_acc": hit.sum()}

    def evaluate(self, model, split: str) -> dict[str, float]:
        from ..metrics import squad_metrics

        if split not in self.encoded:
            raise ValueError(f"no split {split!r}; one of {', '.join(self.encoded)}")
        n = self.options.eval_max
        examples, encoded = self.corpus.split(split)[:n], self.encoded[split][:n]
        answers = predict_examples(model, encoded, [e.context for e in examples], self.options.max_answer_len)
        metrics = squad_metrics([a.answer for a in answers], [e.answers for e in examples],
                                chars=self.corpus.language == "zh")
        mass = [sum(a.attention[enc.start:enc.end + 1]) for a, enc in zip(answers, encoded, strict=True)
                if enc.start >= 0]
        metrics["attention_mass"] = sum(mass) / len(mass) if mass else float("nan")
        return metrics


# ------------------------------------------------------------------------------------------- inference

@dataclass
class Answer:
    """A reader's answer: the ``answer`` text (``context[start:end]``, character offsets), its token span
    ``start_token..end_token`` (inclusive), ``probability`` ``p_start * p_end``, the context's ``tokens`` and the
    question's ``attention`` over them (one weight per token, summing to 1)."""

    context: str
    question: str
    answer: str
    start: int
    end: int
    start_token: int
    end_token: int
    probability: float
    tokens: list[str]
    attention: list[float]


@torch.no_grad()
def predict_examples(model: nn.Module, encoded: list[Encoded], contexts: list[str], max_answer_len: int = 20,
                     questions: list[str] | None = None, batch_size: int = 128) -> list[Answer]:
    """The best span of every encoded example (batched by length, in eval mode, the mode restored after)."""
    from ..models.reading import decode_spans

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].context))
    out: dict[int, Answer] = {}
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        batch = collate_qa([encoded[i] for i in idx])
        b = {k: v.to(device) for k, v in batch.items()}
        res = model(b["context"], b["context_mask"], b["question"], b["question_mask"], b["match"])
        start, end, prob = decode_spans(res.start_logits, res.end_logits, b["context_mask"], max_answer_len)
        attention = res.attention.float().cpu()
        for k, i in enumerate(idx):
            e, c = encoded[i], contexts[i]
            st, en = int(start[k]), int(end[k])
            a, z = e.offsets[st][0], e.offsets[en][1]
            out[i] = Answer(c, questions[i] if questions else "", c[a:z], a, z, st, en, float(prob[k]),
                            [c[x:y] for x, y in e.offsets], attention[k, :len(e.context)].tolist())
    model.train(was_training)
    return [out[i] for i in range(len(encoded))]


def _no_upgrade(config, state_dict):
    raise ValueError("question-answering runs have no format-version-1 form")


class Reader:
    """A trained reader: ``Reader.load("runs/qa").predict(context, question)`` -> :class:`Answer`."""

    task = QATask.name

    def __init__(self, model: nn.Module, tokenizer, options: QAOptions):
        self.model, self.tokenizer, self.options = model.eval(), tokenizer, options

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> Reader:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory."""
        from ..data.tokenize import load_tokenizer

        run = load_run(run_dir, cls.task, _no_upgrade, QAOptions, device)
        return cls(run.model, load_tokenizer(run.checkpoint.assets / "tokenizer"), run.options)

    def predict_batch(self, pairs: list[tuple[str, str]], *, batch_size: int = 128) -> list[Answer]:
        """An :class:`Answer` for every ``(context, question)``; an empty or token-less text is a ``ValueError``."""
        o, encoded = self.options, []
        for n, (context, question) in enumerate(pairs, 1):
            for what, text in (("context", context), ("question", question)):
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"{what} {n} is empty")
            try:
                encoded.append(encode_example(context, question, self.tokenizer, max_context=o.max_context,
                                              max_question=o.max_question))
            except ValueError as e:
                raise ValueError(f"pair {n}: {e}") from None
        return predict_examples(self.model, encoded, [c for c, _ in pairs], o.max_answer_len,
                                [q for _, q in pairs], batch_size)

    def predict(self, context: str, question: str) -> Answer:
        """The answer to ``question`` in ``context``."""
        for what, text in (("context", context), ("question", question)):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"the {what} is empty")
        return self.predict_batch([(context, question)])[0]

    def evaluate(self, examples, *, chars: bool | None = None) -> dict[str, float]:
        """SQuAD exact match and F1 of this reader on ``examples`` (:class:`qkv.data.facts.QAExample`)."""
        from ..metrics import squad_metrics

        answers = self.predict_batch([(e.context, e.question) for e in examples])
        return squad_metrics([a.answer for a in answers], [e.answers for e in examples], chars=chars)
