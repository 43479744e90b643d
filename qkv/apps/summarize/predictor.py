"""A trained summarisation run read back: :class:`Summarizer` (``load`` / ``predict`` / ``evaluate`` / ``view``);
its result is :class:`~qkv.apps.summarize.decode.Summary`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..base import PageInput, Predictor, ViewInput, jsonable, need_text
from ..fusion import LanguageModelFusion
from ..stopped import stopped_note
from .decode import Summary, first_words, lead, summarize_batch, summary_metrics
from .options import SummarizeSettings
from .task import SummarizeTask, evaluate_summaries

__all__ = ["Summarizer", "Summary"]

logger = logging.getLogger(__name__)


class Summarizer(LanguageModelFusion, Predictor):
    """A trained summarisation run: ``Summarizer.load("runs/debian").predict([text])[0].text``."""

    task_class = SummarizeTask
    settings = SummarizeSettings

    def predict(self, texts: list[str], *, beam: int = 4, max_len: int | None = None, min_len: int = 0,
                length_penalty: float = 0.0, coverage_penalty: float = 0.0, no_repeat_ngram_size: int = 3,
                batch_size: int = 32, lm: Any = None, lm_weight: float | None = None,
                length_reward: float = 0.0) -> list[Summary]:
        """Summaries of ``texts`` by beam search over the extended vocabulary (greedy with ``beam=1``): Wu et al.'s
        ``length_penalty`` and ``coverage_penalty`` rank the final beam, ``no_repeat_ngram_size`` forbids
        repeating an n-gram (trigrams by default: on the Debian test split it took pointer + coverage's repeated
        trigrams from 4.7% to 0 at the same ROUGE; 0 switches it off). An empty text is a ``ValueError``."""
        self.check_settings({"beam": beam, "max_len": max_len, "min_len": min_len, "length_penalty": length_penalty,
                             "coverage_penalty": coverage_penalty, "no_repeat_ngram_size": no_repeat_ngram_size,
                             "lm": lm, "lm_weight": lm_weight, "length_reward": length_reward}, "predict")
        if isinstance(texts, str):
            raise ValueError("predict takes a list of texts: predict([text])")
        if not texts:
            raise ValueError("no text to summarise")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to summarise")
        max_len = self._max_len(max_len, min_len)
        return summarize_batch(self.model, self.tokenizer, list(texts), beam=beam, max_len=max_len, min_len=min_len,
                               batch_size=batch_size, length_penalty=length_penalty,
                               coverage_penalty=coverage_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                               max_source=self.options.max_source, lm=self.language_model(lm), lm_weight=lm_weight,
                               length_reward=length_reward)

    def _max_len(self, max_len: int | None, min_len: int) -> int:
        """``max_len`` (the run's ``max_decode_len`` for ``None``), at least ``min_len`` (the settings' own bounds are
        checked by :meth:`check_settings`)."""
        max_len = max_len or self.options.max_decode_len
        if min_len > max_len:
            raise ValueError(f"min_len must be <= max_len, got {min_len} and {max_len}")
        return max_len

    def note(self, result: Summary, settings) -> str | None:
        notes = [stopped_note(result.stopped, len(result.decoded), "summary", "tokens")]
        if result.cut:
            notes.insert(0, f"the source was cut to its first {len(result.source_tokens)} words (the run's "
                            f"max_source): {result.cut} more were not read")
        return "; ".join(n for n in notes if n) or None

    def result_row(self, result: Summary) -> dict[str, Any]:
        """``output`` (the summary), the beam ``score``, the words ``copied`` from outside the vocabulary, the
        source words read (``source_words``), ``cut`` and why decoding ``stopped``."""
        return jsonable({"output": result.text, "score": result.score, "copied": sum(result.copied),
                         "source_words": len(result.source_tokens), "cut": result.cut, "stopped": result.stopped})

    def examples(self, data: str | None = None, split: str = "test", on_error: str | None = None) -> list:
        """The examples evaluated: ``split`` of the run's own data (``data`` None or the run's), else the whole
        of another file of the same format (read with the run's columns, and ``on_error``)."""
        o = self.options
        own = data is None or data == o.data
        if own:
            if on_error is not None:
                raise ValueError("on_error is for another data file: the run's own data is read as in training")
            corpus = self.dataset()
            if split == "train" or split not in corpus.splits:
                raise ValueError(f"no split {split!r}; one of {', '.join(s for s in corpus.splits if s != 'train')}")
            return corpus.split(split)
        if data in ("debian", "facts"):
            raise ValueError(f"data {data}: this run was trained on {o.data}; give a file of the same format")
        if split != "test":
            raise ValueError(f"a data file is evaluated whole: split {split!r} is for the run's own data")
        from .data import debian_corpus, read_summaries

        if o.data == "debian" and Path(data).name.startswith("debian"):
            corpus = debian_corpus(data, on_error=on_error or "raise", fractions=(0, 0, 1))
        else:
            fmt = o.format if not o.generated else "auto"
            cols = {} if o.generated else {"source": o.source_column, "target": o.target_column}
            corpus = read_summaries(data, fmt=fmt, on_error=on_error or "raise", fractions=(0, 0, 1), **cols)
        if corpus.skipped:
            logger.warning("%s: skipped %d bad rows", data, corpus.skipped)
        return corpus.split("test")

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None, beam: int = 4,
                 max_len: int | None = None, length_penalty: float = 0.0, coverage_penalty: float = 0.0,
                 no_repeat_ngram_size: int = 3, baselines: bool = True, on_error: str | None = None,
                 lm: Any = None, lm_weight: float | None = None, length_reward: float = 0.0) -> dict[str, float]:
        """ROUGE-1/2/L, ``repeated_trigrams``, ``copied``, ``copied_oov``, ``p_gen`` and ``length``
        (:func:`~qkv.apps.summarize.decode.summary_metrics`; ``exact_match`` and ``f1`` for facts) of the first
        ``limit`` examples of ``split`` (or of the file ``data``), and with ``baselines`` the ROUGE of the lead
        sentence (``lead_rouge1``...) and of the first 8 words (``first8_rouge1``...) of the same sources. ``lm``,
        ``lm_weight``, ``length_reward``: a language model fused into the beam, as in :meth:`predict`."""
        self.check_settings({"beam": beam, "max_len": max_len, "length_penalty": length_penalty,
                             "coverage_penalty": coverage_penalty, "no_repeat_ngram_size": no_repeat_ngram_size,
                             "baselines": baselines, "on_error": on_error, "lm": lm, "lm_weight": lm_weight,
                             "length_reward": length_reward})
        examples = self.examples(data, split, on_error)[:limit]
        if not examples:
            raise ValueError(f"{data or self.options.data}: no example to evaluate")
        sources, refs = [e.source for e in examples], [e.target for e in examples]
        max_len = self._max_len(max_len, 0)
        figures, _ = evaluate_summaries(self.model, self.tokenizer, examples, self.options, beam=beam,
                                        max_len=max_len, length_penalty=length_penalty,
                                        coverage_penalty=coverage_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                                        lm=self.language_model(lm), lm_weight=lm_weight, length_reward=length_reward)
        if baselines:
            for name, make in (("lead", lead), ("first8", first_words)):
                base = summary_metrics([make(s) for s in sources], refs)
                figures.update({f"{name}_{k}": v for k, v in base.items()})
        figures["examples"] = float(len(examples))
        return figures

    def view(self, given: ViewInput, *, max_len: int | None = None) -> PageInput:
        """Every attention of the model summarising ``given.text`` greedily (the decoding itself, recorded: a row
        per output word, the end included); the notes give each word's ``p_gen`` and whether it was copied."""
        text = need_text(given.text, self.application)
        records: list = []
        (s,) = summarize_batch(self.model, self.tokenizer, [text], beam=1,
                               max_len=max_len or self.options.max_decode_len, max_source=self.options.max_source,
                               records=records)
        finished = s.stopped == "end"
        target = (s.decoded or s.tokens) + (["<eos>"] if finished else [])  # a row per step of the recorded decoding
        words = ", ".join(f"{w} {float(p):.2f}{' (copied)' if c else ''}"
                          for w, p, c in zip(s.tokens, s.p_gen, s.copied, strict=False))
        notes = [f"{self.options.model} model; target rows are the words it produced (greedy)",
                 f"p_gen (1 = generated from the vocabulary, 0 = copied from the source): {words}"]
        if s.cut:
            notes.append(f"the source was cut to its first {len(s.source_tokens)} words: {s.cut} more were not read")
        notes += [n for n in [stopped_note(s.stopped, len(s.decoded), "summary", "tokens")] if n]
        return PageInput(records, {"source": s.source_tokens, "target": target}, title=f"summary: {s.text}",
                         notes=notes)
