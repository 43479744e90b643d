"""A trained sentiment run read back: :class:`SentimentClassifier` (``load`` / ``predict`` / ``evaluate`` /
``view``) and its result, :class:`SentimentPrediction` (a label, its probability and one attention weight per
word)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...data.text_classification import collate_texts
from ...train.threads import follow_threads
from ..base import PageInput, Predictor, jsonable
from .options import SentimentOptions, SentimentSettings
from .task import SentimentTask, encode_texts, evaluate_classifier, make_splits

logger = logging.getLogger(__name__)

__all__ = ["SentimentPrediction", "SentimentClassifier"]

@dataclass
class SentimentPrediction:
    """One classified text: ``label`` and its ``probability`` (or the predicted ``value`` for regression), the
    display ``tokens`` and one attention weight per token (averaged over hops); a model with an NBSVM path
    (``--nbsvm``) also gives ``ngram_scores``: what each token (its word, and the bigram it starts) adds to the
    predicted class's logit through that path, less its mean over the classes."""

    text: str
    label: str
    probability: float
    probabilities: dict[str, float]
    tokens: list[str]
    weights: list[float]
    value: float | None = None
    cut: int = 0  #: tokens past the model's ``max_len``, not read (a warning is logged)
    ngram_scores: list[float] | None = None

    @property
    def caption(self) -> str:
        if self.value is not None:
            return f"{self.label} {self.value:+.3f}"
        return f"{self.label} {self.probability:.3f}"


class SentimentClassifier(Predictor):
    """A trained sentiment run: ``SentimentClassifier.load(run_dir).predict(["text", ...])``."""

    task_class = SentimentTask
    settings = SentimentSettings

    def __init__(self, model: nn.Module, options: SentimentOptions, config: dict[str, Any] | None = None, *,
                 tokenizer):
        from ...data.tokenize import WordTokenizer

        super().__init__(model, options, config, tokenizer=tokenizer)
        self.label_names = self.config.get("label_names") or []
        self.regression = bool(self.config.get("regression"))
        self.max_len = options.max_len
        if getattr(model, "max_tokens", None) is not None:  # a language model's body reads at most its context
            self.max_len = min(self.max_len, model.max_tokens)
        self._spans = tokenizer.spans if isinstance(tokenizer, WordTokenizer) else None

    def display_tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` as typed (its own characters: case and full-width forms kept), truncated."""
        tokens = self.tokenizer.tokens(text)
        if self._spans is not None:
            shown = [text[a:b] for a, b in self._spans(text)]
            if len(shown) == len(tokens):
                tokens = shown
        return tokens[: self.max_len]

    @torch.no_grad()
    def predict(self, texts: list[str], *, batch_size: int = 128) -> list[SentimentPrediction]:
        """Label (or value), probabilities, tokens and attention weights of every text; empty texts are errors."""
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to classify")
        out: list[SentimentPrediction] = []
        for s in follow_threads(range(0, len(texts), batch_size), lambda s: sum(map(len, texts[s:s + batch_size])),
                                device=self.device):
            chunk = texts[s:s + batch_size]
            full = self.tokenizer.encode_batch(chunk)
            for k, x in enumerate(full):
                if len(x) > self.max_len:
                    logger.warning("text %d has %d tokens: the model reads the first %d (max_len) and leaves out the "
                                   "last %d", s + k + 1, len(x), self.max_len, len(x) - self.max_len)
            ids = [x[: self.max_len] for x in full]
            batch = collate_texts([(x, 0) for x in ids])
            res = self.model(batch["ids"].to(self.device), batch["mask"].to(self.device))
            logits, weights = res.logits.float().cpu(), res.weights.float().cpu()
            path = getattr(self.model, "nbsvm", None)
            scores = None
            if path is not None:  # per token, relative to the mean over the classes (softmax ignores a shift)
                scores = path.contributions(batch["ids"].to(self.device), batch["mask"].to(self.device)).float().cpu()
                scores = scores - scores.mean(-1, keepdim=True)
            if weights.dim() == 3:
                weights = weights.mean(1)
            for i, text in enumerate(chunk):
                n = len(ids[i])
                w = weights[i, :n].tolist()
                tokens = self.display_tokens(text)
                if len(tokens) != n:  # should not happen; fall back to the tokeniser's own tokens
                    tokens = self.tokenizer.tokens_of_ids(ids[i])
                if self.regression:
                    v = float(logits[i, 0])
                    label = "positive" if v > 0 else "negative" if v < 0 else "neutral"
                    out.append(SentimentPrediction(text, label, math.nan, {}, tokens, w, value=v,
                                                   cut=len(full[i]) - n))
                    continue
                probs = logits[i].softmax(-1)
                k = int(probs.argmax())
                out.append(SentimentPrediction(text, self.label_names[k], float(probs[k]),
                                      {name: float(p) for name, p in zip(self.label_names, probs, strict=True)},
                                      tokens, w, cut=len(full[i]) - n,
                                      ngram_scores=None if scores is None else scores[i, :n, k].tolist()))
        return out

    def result_row(self, result: SentimentPrediction) -> dict[str, Any]:
        """``output`` (the label and its probability, or the value), the ``label``, ``probability`` and every
        class's ``probabilities`` (or the regression's ``value``), the ``tokens`` with their attention ``weights``
        and the tokens ``cut`` (and the ``ngram_scores`` of a model with an NBSVM path)."""
        row: dict[str, Any] = {"output": result.caption, "label": result.label}
        if result.value is None:
            row.update(probability=result.probability, probabilities=result.probabilities)
        else:
            row["value"] = result.value
        if result.ngram_scores is not None:
            row["ngram_scores"] = result.ngram_scores
        return jsonable({**row, "tokens": result.tokens, "weights": result.weights, "cut": result.cut})

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 **settings: Any) -> dict[str, float]:
        """Accuracy and loss (or MSE and sign accuracy for a regression run) on ``split`` of the run's data, or of
        ``data`` (another file of the same format, split as the run's was)."""
        self.check_settings(settings)
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        options, texts = self.options_for(data), self.dataset(data)
        indices = make_splits(texts.labels, options)[split][:limit]  # the run's own split, drawn as in training
        examples = encode_texts(texts, indices, self.tokenizer, self.max_len)
        if not examples:
            raise ValueError(f"the {split} split of {options.data} is empty")
        return {**evaluate_classifier(self.model, examples, self.regression), "examples": float(len(examples))}

    def view_page(self, records: list, text: str, pred: SentimentPrediction) -> PageInput:
        """The attention of the model classifying ``text`` (the prediction's own forward pass, recorded)."""
        label = f"{pred.value:+.2f}" if self.regression else f"{pred.label} ({pred.probability:.2f})"
        tokens: dict[str, list[str]] | list[str] = pred.tokens
        if getattr(self.model, "pooling", None) == "cls":  # a [CLS] query in front of the tokens, attending over them
            tokens = {"source": ["[CLS]", *pred.tokens], "target": ["[CLS]"]}
        notes = [f"{self.options.model} sentiment model"]
        if getattr(self.model, "nbsvm", None) is not None:
            notes.append("a bag of words and bigrams weighted by naive Bayes (NBSVM) adds to the logits beside the "
                         "attention: the attention shows the rest of the decision (ngram_scores: what each word "
                         "adds)")
        if pred.cut:
            notes.append(f"the text was cut to its first {self.max_len} tokens (max_len): {pred.cut} more were not "
                         "read")
        return PageInput(records, tokens, title=f"{text} \u2192 {label}", notes=notes)

