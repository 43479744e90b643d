"""The language model's data, model, metric and the trainer's task: :func:`load_data`, :func:`model_spec`,
:func:`evaluate_lm` and :class:`LMTask`.

The documents of a split are one stream of tokens, each document followed by ``<eos>`` (and the stream starting
with one, so that the first token is predicted too), cut into windows of ``context`` predicted tokens. Every token
but the first is predicted once; bits per character divide the summed negative log-likelihood (in bits) by the
characters of the documents, one more per document for its end.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...train.threads import follow_threads
from ..base import ApplicationTask
from .options import ARCHITECTURE, LMOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "LMTask", "evaluate_lm", "token_stream", "windows"]


def load_data(options: LMOptions):
    """The :class:`qkv.apps.lm.documents.DocumentCorpus` that ``options`` describes."""
    from .documents import load_documents

    return load_documents(options.data, options.column, seed=options.data_seed, max_documents=options.max_documents)


def model_spec(options: LMOptions, *, vocab_size: int) -> dict[str, Any]:
    """``{"name": "lm", "config"}`` for :func:`qkv.models.create`."""
    o = options
    return {"name": "lm", "config": {"vocab_size": vocab_size, "dim": o.dim, "num_heads": o.num_heads,
                                     "num_layers": o.num_layers, "ffn_dim": o.ffn_dim, "kv_heads": o.kv_heads,
                                     "max_len": o.context, "positions": o.positions, "dropout": o.dropout,
                                     "score": o.score, **({"reverse": True} if o.reverse else {})}}


def token_stream(tokenizer, documents: list[str], max_tokens: int | None = None, *,
                 reverse: bool = False) -> tuple[list[int], int]:
    """``[<eos>] + doc 1 + [<eos>] + doc 2 + [<eos>] ...`` and the characters it covers (each document's, plus one
    for its end), stopping after the document that reaches ``max_tokens``; with ``reverse`` each document's tokens
    from its last to its first (a backward model's stream)."""
    ids, chars = [tokenizer.eos_id], 0
    for doc in documents:
        tokens = tokenizer.encode(doc)
        ids += (tokens[::-1] if reverse else tokens) + [tokenizer.eos_id]
        chars += len(doc) + 1
        if max_tokens is not None and len(ids) > max_tokens:
            break
    return ids, chars


def windows(ids: list[int], context: int) -> list[Tensor]:
    """``ids`` as windows of ``context + 1`` tokens overlapping by one (the last one shorter), so that every token
    but the first is a target exactly once."""
    t = torch.tensor(ids, dtype=torch.long)
    return [t[i:i + context + 1] for i in range(0, max(len(ids) - 1, 1), context) if len(t[i:i + context + 1]) > 1]


def _pad(batch: list[Tensor]) -> Tensor:
    return nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=0)


@torch.no_grad()
def evaluate_lm(model: nn.Module, tokenizer, documents: list[str], *, context: int, max_tokens: int | None = None,
                batch_size: int = 32) -> dict[str, float]:
    """The language model's metric, for the trainer and the predictor alike: ``loss`` (nats per token),
    ``perplexity``, ``bpc`` (bits per character of the documents) and ``tokens`` scored, over ``documents`` (up to
    ``max_tokens``)."""
    if not documents:
        raise ValueError("no documents to evaluate")
    ids, chars = token_stream(tokenizer, documents, max_tokens, reverse=getattr(model.cfg, "reverse", False))
    device = next(model.parameters()).device
    total, count = 0.0, 0
    chunks = windows(ids, context)
    for i in follow_threads(range(0, len(chunks), batch_size), lambda i: sum(map(len, chunks[i:i + batch_size])),
                            device=device):
        batch = _pad(chunks[i:i + batch_size]).to(device)
        lengths = torch.tensor([len(c) for c in chunks[i:i + batch_size]], device=device)
        logits = model(batch[:, :-1]).float()
        nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        real = torch.arange(batch.shape[1] - 1, device=device)[None] < (lengths[:, None] - 1)
        total += float(nll[real].sum())
        count += int(real.sum())
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "bpc": total / math.log(2) / chars,
            "tokens": float(count)}


class LMTask(ApplicationTask, name="lm", unit="tokens", options=LMOptions, load_data=load_data, model_spec=model_spec,
             assets=("tokenizer",)):
    """Next-token cross-entropy over windows of the training stream; with ``init``, from another run's tokenizer,
    architecture and weights."""

    #: with ``init``: the run it goes on from and its architecture options, kept with every checkpoint (a resumed run
    #: rebuilds its model without that run)
    json_assets = ("init",)

    def __init__(self, options: LMOptions, data=None):
        super().__init__(options, data)
        self.init: dict[str, Any] | None = None
        self._init_weights: dict[str, Tensor] | None = None

    def setup(self) -> None:
        from ...data import train_tokenizer

        if self.options.init is not None:
            self._read_init()
        corpus = self.read_data()
        logger.info("data %s: %d train, %d valid, %d test documents", self.options.data, len(corpus.train),
                    len(corpus.valid), len(corpus.test))
        if self.tokenizer is None:
            kind = self.options.tokenizer
            kw = {"vocab_size": self.options.vocab_size} if kind in ("bpe", "unigram") else {}
            self.tokenizer = train_tokenizer(kind, corpus.train, **kw)
        ids, _ = token_stream(self.tokenizer, corpus.train, reverse=self.options.reverse)
        if self.init is not None:
            from .coverage import warn_uncovered

            warn_uncovered(self.tokenizer, [ids], corpus.train, self.init["run"])
        self._train = windows(ids, self.options.context)

    def _read_init(self) -> None:
        """The run of ``init``: its tokenizer, weights and architecture, which replace the options' (one given with
        another value than the run's and the default is a ``ValueError``, as is a run of another task)."""
        from ...data import load_tokenizer
        from ..run import load_run

        o, path = self.options, self.options.init
        if self.init is None:  # a resumed run has it from its checkpoint, and the checkpoint's weights
            try:
                run = load_run(path, "lm", LMOptions, "cpu")
                tokenizer = load_tokenizer(run.checkpoint.assets / "tokenizer")
            except (ValueError, OSError) as e:
                raise ValueError(f"init {path}: {e}") from None
            self.init = {"run": str(path), "architecture": {k: getattr(run.options, k) for k in ARCHITECTURE}}
            self._init_weights = run.model.state_dict()
            if self.tokenizer is None:
                self.tokenizer = tokenizer
        shape = self.init["architecture"]
        default = {f.name: f.default for f in dataclasses.fields(LMOptions)}
        clash = [f"{k}={getattr(o, k)!r} (the run's: {v!r})" for k, v in shape.items()
                 if getattr(o, k) != v and getattr(o, k) != default[k]]
        if clash:
            raise ValueError(f"init {path}: the tokenizer and architecture are the language model's it goes on from; "
                             f"drop {', '.join(clash)}")
        self.options = dataclasses.replace(o, **shape)
        logger.info("init: the %d-layer language model of %s", shape["num_layers"], path)

    def build_model(self) -> nn.Module:
        model = super().build_model()
        if self._init_weights is not None:  # on a resume the checkpoint's weights replace them
            model.load_state_dict(self._init_weights)
        return model

    def train_examples(self):
        return self._train

    def collate(self, examples):
        return _pad(examples)

    def sizes(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size}

    def loss(self, model, batch):
        logits = model(batch[:, :-1])
        target = batch[:, 1:]
        real = target != 0  # padding of the last, shorter window (no real token has id 0)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=0,
                               reduction="sum")
        correct = ((logits.argmax(-1) == target) & real).sum()
        return loss, real.sum(), {"token_acc": correct}

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        return evaluate_lm(model, self.tokenizer, self.data.split(split), context=self.options.context,
                           max_tokens=self.options.eval_tokens)
