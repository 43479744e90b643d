"""A trained language model read back: :class:`LanguageModel` (``predict`` continues prompts, ``evaluate`` gives
bits per character, ``view`` shows every attention over a text); its result is :class:`Generation`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from ...options import OptionError, ref
from ...train.threads import follow_threads
from ..base import PageInput, Predictor, ViewInput, jsonable
from .options import LMSettings
from .task import LMTask, evaluate_lm

logger = logging.getLogger(__name__)

__all__ = ["LanguageModel", "Generation"]


@dataclasses.dataclass
class Generation:
    """A prompt and what the model wrote after it.

    Attributes:
        prompt: the text given.  text: the continuation (without the prompt); a backward model's (``--reverse``) is
            what comes before the prompt.
        tokens: the continuation's token strings, in the text's order.
        log_prob: the sum of its tokens' log-probabilities (nats).
        stopped: ``"end"`` (the model ended the document), ``"max_new_tokens"`` or ``"context"`` (no room left
            in the model's context).
    """

    prompt: str
    text: str
    tokens: list[str]
    log_prob: float
    stopped: str


class LanguageModel(Predictor):
    """A trained language model: ``LanguageModel.load("runs/lm").predict(["The cat"], seed=0)[0].text``."""

    task_class = LMTask
    settings = LMSettings

    @property
    def context(self) -> int | None:
        return self.model.context

    @property
    def backward(self) -> bool:
        """Whether the model reads text from its last token to its first (trained with ``--reverse``)."""
        return bool(getattr(self.model.cfg, "reverse", False))

    def _read(self, text: str) -> list[int]:
        """``text``'s tokens in the order the model reads them."""
        ids = self.tokenizer.encode(text)
        return ids[::-1] if self.backward else ids

    def _prompt_ids(self, text: str, n: int) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"prompt {n} is not a text")
        ids = [self.tokenizer.eos_id] + self._read(text)  # a prompt starts a document (a backward model: ends it)
        if self.context is not None and len(ids) >= self.context:
            raise ValueError(f"prompt {n} is {len(ids) - 1} tokens; the model reads at most {self.context - 2} "
                             "before the first new one (its context): shorten it")
        return ids

    @torch.no_grad()
    def predict(self, prompts: list[str], *, max_new_tokens: int = 200, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
                seed: int | None = 0) -> list[Generation]:
        """A continuation of each prompt (an empty prompt starts a document), sampled from the model with
        ``temperature``, ``top_k`` and ``top_p``, or the most likely token at each step (``greedy``). The same
        ``seed`` gives the same text (``None``: a fresh draw each call). It stops at the end of a document, after
        ``max_new_tokens``, or where the model's context is full (said in ``stopped`` and logged). A prompt as
        long as the context is a ``ValueError``."""
        from ...models.lm import sample_next

        self.check_settings({"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k,
                             "top_p": top_p, "greedy": greedy, "seed": seed}, "predict")
        generator = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        results = []
        # a prompt's units: the model's steps, known once it is written (units are counted after the consumer's work)
        for n, text in follow_threads(list(enumerate(prompts, 1)), lambda _: len(results[-1].tokens) + 1,
                                      device=self.device):
            ids = self._prompt_ids(text, n)
            room = max_new_tokens if self.context is None else min(max_new_tokens, self.context - len(ids))
            caches = self.model.new_caches()
            logits = self.model.step(torch.tensor([ids], device=self.device), caches)[:, -1]
            new, log_prob, stopped = [], 0.0, "max_new_tokens" if room == max_new_tokens else "context"
            for step in range(room):
                nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                                  generator=generator)
                log_prob += float(logits.float().log_softmax(-1)[0, nxt])
                if int(nxt) == self.tokenizer.eos_id:
                    stopped = "end"
                    break
                new.append(int(nxt))
                if step + 1 < room:
                    logits = self.model.step(nxt[:, None], caches)[:, -1]
            if stopped == "context":
                logger.warning("prompt %d: stopped after %d new tokens, where the model's context (%d) is full", n,
                               len(new), self.context)
            if self.backward:  # written from the prompt's first token leftwards
                new = new[::-1]
            results.append(Generation(text, self.tokenizer.decode(new), self.tokenizer.tokens_of_ids(new),
                                      log_prob, stopped))
        return results

    def result_row(self, result: Generation) -> dict[str, Any]:
        """``output`` (the prompt and its continuation), the ``continuation``, ``log_prob`` and ``stopped``."""
        output = result.text + result.prompt if self.backward else result.prompt + result.text
        return jsonable({"output": output, "continuation": result.text,
                         "log_prob": result.log_prob, "stopped": result.stopped})

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 max_tokens: int | None = None) -> dict[str, float]:
        """``loss``, ``perplexity`` and ``bpc`` (bits per character) on ``split`` of the run's documents or of
        ``data`` (another text file), its first ``limit`` documents, at most ``max_tokens`` tokens (default: the
        run's ``eval_tokens``)."""
        self.check_settings({"max_tokens": max_tokens})
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        return evaluate_lm(self.model, self.tokenizer, self.dataset(data).split(split)[:limit],
                           context=self.context or self.options.context,
                           max_tokens=self.options.eval_tokens if max_tokens is None else max_tokens)

    #: the settings of ``qkv view`` a language-model run takes: it generates from the text, step by step
    view_takes = ("generate", "strategy", "seed")

    def viewing(self, *, generate: int | None = None, strategy: str = "greedy", seed: int = 0) -> LanguageModel:
        """This run with what :meth:`view` shows set: with ``generate``, up to that many tokens generated from the
        text (``strategy`` ``greedy`` or ``sample`` with ``seed``), every step's attention recorded."""
        if strategy not in ("greedy", "sample"):
            raise OptionError(ref("strategy") + " {given}: a language-model run generates greedy or sample (no "
                              "beams)", "strategy", given=strategy)
        self._viewing = {"generate": generate, "strategy": strategy, "seed": seed}
        return self

    def induction_table(self, length: int = 50, seed: int = 0):
        """Induction-head scores of every layer and head on ``length`` repeated random tokens
        (:func:`qkv.models.induction.induction_table`)."""
        from ...models.induction import induction_table

        return induction_table(self.model, start_id=self.tokenizer.eos_id, length=length, seed=seed)

    def _induction_notes(self) -> list[str]:
        try:
            table = self.induction_table()
        except ValueError as e:  # a vocabulary too small for a repeated sequence
            return [f"induction heads: not measured ({e})"]
        notes = [f"induction heads: {table.length} random tokens repeated; loss {table.loss_first:.2f} nats on the "
                 f"first copy, {table.loss_second:.2f} on the second (in-context learning). Per head (layer.head): "
                 "induction = attention to the token after the earlier occurrence, previous = to the previous token "
                 f"(a uniform head gives {_uniform(table.length):.3f}), copying = its OV circuit raises the token it "
                 f"reads (chance {1 / table.length:.3f})"]
        for row in sorted(table.rows(), key=lambda r: -r["induction"]):
            notes.append(f"head {row['layer']}.{row['head']}: induction {row['induction']:.3f}, previous "
                         f"{row['previous']:.3f}, copying {row['copying']:.2f}")
        return notes

    def view(self, given: ViewInput, **options: Any) -> PageInput:
        """Every attention of the model reading ``given.text`` (each layer's causal self-attention, per head), and
        its induction-head table; after :meth:`viewing` with ``generate``, its generation step by step."""
        viewing = getattr(self, "_viewing", None)
        if viewing and viewing["generate"]:
            return self._view_generation(self.view_input(given), **viewing)
        return super().view(given, **options)

    def view_predict(self, text: str) -> tuple[list[int], bool]:
        """The model reading ``text`` as the start of a document (``<eos>`` first), cut to its context: the ids
        read and whether the text was cut."""
        ids = [self.tokenizer.eos_id] + self._read(text)
        cut = self.context is not None and len(ids) > self.context
        if cut:  # its first context tokens, said on the page
            ids = ids[: self.context]
            logger.warning("the text was cut to its first %d tokens (the model's context)", self.context - 1)
        self.model(torch.tensor([ids], device=self.device))
        return ids, cut

    def view_page(self, records: list, text: str, result: tuple[list[int], bool]) -> PageInput:
        ids, cut = result
        notes = [f"{self.options.num_layers}-layer causal language model; row t attends over tokens 0..t "
                 "(the first, <eos>, marks the start of a document)"] + self._backward_note()
        if cut:
            notes.append(f"the text was cut to its first {self.context - 1} tokens (the model's context)")
        return PageInput(records, self.tokenizer.tokens_of_ids(ids), title=text[:80],
                         notes=notes + self._induction_notes())

    @torch.no_grad()
    def _view_generation(self, text: str, generate: int, strategy: str, seed: int) -> PageInput:
        """The page of ``generate`` tokens generated from ``text``: the shared step view of
        :func:`qkv.integrations.generation.generation_page` (row ``t`` the attention of the token fed at step
        ``t``: with the KV cache, the rows of one pass over the whole sequence)."""
        from ...capture import capture_attention
        from ...integrations.generation import generation_page, steps_of
        from ...models.lm import generate as lm_generate

        prompt = self._prompt_ids(text, 1)
        n = generate if self.context is None else min(generate, self.context - len(prompt))
        notes = [f"{self.options.num_layers}-layer causal language model generating from the text "
                 f"({'greedy decoding' if strategy == 'greedy' else f'sampling (seed {seed})'}), with the KV cache"]
        notes += self._backward_note()
        if n < generate:
            notes.append(f"{n} tokens generated at most: the model's context ({self.context}) is then full")
        seq = lm_generate(self.model, torch.tensor([prompt], device=self.device), n, greedy=strategy == "greedy",
                          eos_id=self.tokenizer.eos_id, seed=seed)[0].tolist()
        new = seq[len(prompt):]
        if self.tokenizer.eos_id in new:  # the end of the document is the last step
            new = new[:new.index(self.tokenizer.eos_id) + 1]
        seq = prompt + new
        with capture_attention(self.model) as records:
            logits = self.model(torch.tensor([seq[:-1]], device=self.device))[0]
        steps = steps_of(logits[len(prompt) - 1:], new)
        notes.append(f"{len(new)} token(s) generated" + (", the last ending the document" if new and
                                                          new[-1] == self.tokenizer.eos_id else ""))
        names = self.tokenizer.tokens_of_ids
        title = (self.tokenizer.decode([t for t in new if t != self.tokenizer.eos_id][::-1]) + text if self.backward
                 else text + self.tokenizer.decode(new))
        return generation_page(records, {"tokens": names(seq[:-1])}, steps, names, first_row=len(prompt) - 1,
                               strategy=strategy, title=title, notes=notes)

    def _backward_note(self) -> list[str]:
        return ["a backward model: it reads the text from its last token to its first, as the rows and columns "
                "show (what it generates comes before the text)"] if self.backward else []


def _uniform(length: int) -> float:
    """The induction score of a head attending uniformly over the keys it may see."""
    return float((1 / torch.arange(length + 2, 2 * length + 2, dtype=torch.float64)).mean())
