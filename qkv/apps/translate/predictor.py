"""A trained translation run read back: :class:`Translator` (``load`` / ``predict`` / ``evaluate`` / ``view``);
its result is :class:`~qkv.apps.translate.decode.Translation`."""

from __future__ import annotations

from typing import Any

import torch

from ...options import OptionError, ref
from ..base import PageInput, Predictor, jsonable
from ..fusion import LanguageModelFusion
from ..stopped import stopped_note
from .decode import Translation, source_ids, translate_batch
from .options import TranslateSettings
from .task import TranslateTask, evaluate_translations

__all__ = ["Translator", "Translation", "parse_buckets"]


class Translator(LanguageModelFusion, Predictor):
    """A trained translation run, ready to translate: ``Translator.load("runs/dates").predict(["7 mars 2019"])``."""

    task_class = TranslateTask
    settings = TranslateSettings

    def predict(self, texts: list[str], *, beam: int = 5, max_len: int = 100, batch_size: int = 64,
                length_penalty: float = 0.6, lm: Any = None, lm_weight: float | None = None,
                length_reward: float = 0.0) -> list[Translation]:
        """Translations of ``texts`` by beam search (greedy with ``beam=1``). An empty text is a ``ValueError``.

        ``lm``: a language model of the target language (a ``qkv train lm`` run directory, or loaded) fused into
        the beam with weight ``lm_weight`` (default 0.3) and ``length_reward`` per token; its tokens must be the
        target tokenizer's kind (:mod:`qkv.models.fusion`)."""
        self.check_settings({"beam": beam, "max_len": max_len, "length_penalty": length_penalty, "lm": lm,
                             "lm_weight": lm_weight, "length_reward": length_reward}, "predict")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to translate")
        return translate_batch(self.model, self.src_tokenizer, self.tgt_tokenizer, list(texts), beam=beam,
                               max_len=max_len, batch_size=batch_size, length_penalty=length_penalty,
                               lm=self.language_model(lm), lm_weight=lm_weight, length_reward=length_reward)

    def note(self, result: Translation, settings) -> str | None:
        return stopped_note(result.stopped, len(result.tokens), "translation", "tokens")

    def result_row(self, result: Translation) -> dict[str, Any]:
        """``output`` (the translation), the ``source``, the beam ``score``, the source tokens ``cut`` and why
        decoding ``stopped`` (``end``, or ``max_len``)."""
        return jsonable({"output": result.text, "source": result.source, "score": result.score, "cut": result.cut,
                         "stopped": result.stopped})

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None, beam: int = 5,
                 max_len: int | None = None, buckets: str | None = "0,10,20,30,40,60",
                 length_unit: str = "tokens", lm: Any = None, lm_weight: float | None = None,
                 length_reward: float = 0.0) -> dict[str, float]:
        """BLEU, chrF and exact match (sacrebleu, every reference of a source) on ``split`` of the run's data or of
        ``data`` (``dates`` or another corpus file), and the same by source length: ``bleu@0-10``,
        ``sentences@0-10``... for the buckets ``buckets`` (increasing edges; ``None`` for none). ``max_len``:
        longest translation in tokens, by default the run's ``max_decode_len`` (what its evaluations during
        training used, so that greedy decoding gives the trainer's figures). ``lm``, ``lm_weight``,
        ``length_reward``: a language model fused into the beam, as in :meth:`predict`."""
        self.check_settings({k: v for k, v in {"beam": beam, "max_len": max_len, "buckets": buckets,
                                               "length_unit": length_unit, "lm": lm, "lm_weight": lm_weight,
                                               "length_reward": length_reward}.items() if v is not None})
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        return evaluate_translations(self.model, self.src_tokenizer, self.tgt_tokenizer,
                                     self.dataset(data).references(split)[:limit], beam=beam,
                                     max_len=self.options.max_decode_len if max_len is None else max_len,
                                     buckets=parse_buckets(buckets) if buckets else (), length_unit=length_unit,
                                     lm=self.language_model(lm), lm_weight=lm_weight, length_reward=length_reward)

    def view_predict(self, text: str, *, max_len: int = 100) -> tuple[list[int], int, Any]:
        """The greedy translation of ``text``, decoded step by step (each step's attention recorded): the source
        ids read, how many were cut, and the hypothesis."""
        from ...models.decoding import greedy_decode

        src_ids, cut = source_ids(self.src_tokenizer, text)
        src = torch.tensor([src_ids], device=self.device)
        hyp = greedy_decode(self.model, src, torch.ones_like(src, dtype=torch.bool), max_len=max_len)[0]
        return src_ids, cut, hyp

    def view_page(self, records: list, text: str, result: tuple[list[int], int, Any]) -> PageInput:
        """Every attention of the model translating ``text`` greedily: the decoding's steps joined, so the target
        rows are the tokens it produced, ``<eos>`` included."""
        from ...data import EOS_ID

        src_ids, cut, hyp = result
        out = hyp.tokens
        finished = hyp.attention.shape[0] > len(out)  # the step that chose the end has a row too
        produced = out + [EOS_ID] if finished else out
        tokens = {"source": self.src_tokenizer.tokens_of_ids(src_ids),
                  "target": self.tgt_tokenizer.tokens_of_ids(produced)}
        notes = [f"{self.options.model} translation model; target rows are the tokens it produced (greedy)"]
        if cut:
            notes.append(f"the source was cut to its first {len(src_ids)} tokens: {cut} more were not read")
        notes += [n for n in [stopped_note(hyp.stopped, len(out), "translation", "tokens")] if n]
        return PageInput(records, tokens, title=f"{text} \u2192 {self.tgt_tokenizer.decode(out)}", notes=notes)


def parse_buckets(text: str) -> tuple[tuple[int, int], ...]:
    """``"0,10,20"`` -> ``((0, 10), (11, 20))``: buckets of source lengths from increasing edges."""
    try:
        edges = [int(x) for x in text.split(",")]
    except ValueError:
        edges = []
    if len(edges) < 2 or edges != sorted(set(edges)) or edges[0] < 0:
        raise OptionError(ref("buckets") + " need increasing edges like 0,10,20,30, got {text!r}", "buckets",
                          text=text)
    return tuple((lo if i == 0 else lo + 1, hi) for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)))
