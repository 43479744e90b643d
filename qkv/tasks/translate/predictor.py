"""A trained translation run read back: :class:`Translator` (``load`` / ``predict`` / ``evaluate`` / ``view``);
its result is :class:`~qkv.tasks.translate.decode.Translation`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn

from ..base import PageInput, Predictor, ViewInput, jsonable, load_run, need_text, upgrade_options
from .decode import Translation, source_ids, translate_batch
from .options import TranslateOptions
from .task import TranslateTask, load_data

__all__ = ["Translator", "Translation", "parse_buckets"]


def _upgrade_v1(config: dict[str, Any], state_dict: dict) -> tuple[dict, dict]:
    """A qkv 0.1.0 translation run (``{"model": KIND, "arch": {...}, "options": {...}}``) in the current format."""
    from ...models.legacy import upgrade_state_dict

    kind, arch = config["model"], dict(config["arch"])
    renames = {"layers": "num_layers", "heads": "num_heads"}
    if kind == "transformer":
        arch = {"src_vocab": arch["src_vocab"], "tgt_vocab": arch["tgt_vocab"], "dim": arch["d_model"],
                "num_heads": arch["heads"], "ffn_dim": arch["ffn_dim"], "num_layers": arch["encoder_layers"],
                "num_decoder_layers": arch["decoder_layers"], "dropout": arch["dropout"], "score": arch["score"]}
        renames = {**renames, "hidden_dim": "dim"}
    else:
        arch["num_layers"] = arch.pop("layers")
    options = upgrade_options(TranslateOptions, config["options"], renames)
    return ({"model": {"name": kind, "config": arch}, "options": dataclasses.asdict(options)},
            upgrade_state_dict(kind, state_dict))


class Translator(Predictor):
    """A trained translation run, ready to translate: ``Translator.load("runs/dates").predict(["7 mars 2019"])``."""

    task = TranslateTask.name

    def __init__(self, model: nn.Module, src_tok, tgt_tok, options: TranslateOptions):
        self.model, self.src_tok, self.tgt_tok, self.options = model.eval(), src_tok, tgt_tok, options

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "auto") -> Translator:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory, of any release."""
        from ...data import load_tokenizer

        run = load_run(run_dir, cls.task, _upgrade_v1, TranslateOptions, device)
        assets = run.checkpoint.assets
        return cls(run.model, load_tokenizer(assets / "src_tokenizer"), load_tokenizer(assets / "tgt_tokenizer"),
                   run.options)

    def predict(self, texts: list[str], *, beam: int = 5, max_len: int = 100, batch_size: int = 64,
                length_penalty: float = 0.6) -> list[Translation]:
        """Translations of ``texts`` by beam search (greedy with ``beam=1``). An empty text is a ``ValueError``."""
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text {i + 1} is empty: nothing to translate")
        if beam < 1 or max_len < 1:
            raise ValueError(f"beam and max_len must be >= 1, got {beam} and {max_len}")
        return translate_batch(self.model, self.src_tok, self.tgt_tok, list(texts), beam=beam, max_len=max_len,
                               batch_size=batch_size, length_penalty=length_penalty)

    def result_row(self, result: Translation) -> dict[str, Any]:
        """``output`` (the translation), the ``source``, the beam ``score`` and the source tokens ``cut``."""
        return jsonable({"output": result.text, "source": result.source, "score": result.score, "cut": result.cut})

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None, beam: int = 5,
                 max_len: int | None = None, buckets: str | None = "0,10,20,30,40,60",
                 length_unit: str = "tokens") -> dict[str, float]:
        """BLEU, chrF and exact match (sacrebleu, every reference of a source) on ``split`` of the run's data or of
        ``data`` (``dates`` or another corpus file), and the same by source length: ``bleu@0-10``,
        ``sentences@0-10``... for the buckets ``buckets`` (increasing edges; ``None`` for none). ``max_len``:
        longest translation in tokens, by default the run's ``max_decode_len`` (what its evaluations during
        training used, so that greedy decoding gives the trainer's figures)."""
        from ...metrics import bleu_by_length, translation_metrics

        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        if length_unit not in ("tokens", "words"):
            raise ValueError(f"length_unit must be tokens or words, got {length_unit!r}")
        edges = parse_buckets(buckets) if buckets else ()
        options = self.options
        if data:  # another data file: reset what only applied to the old data
            options = upgrade_options(TranslateOptions, {**dataclasses.asdict(options), "data": data})
        grouped = load_data(options).references(split)[:limit]
        results = self.predict([s for s, _ in grouped], beam=beam,
                               max_len=self.options.max_decode_len if max_len is None else max_len)
        hyps, refs = [r.text for r in results], [r for _, r in grouped]
        figures = translation_metrics(hyps, refs)
        lengths = [len(r.source_tokens) if length_unit == "tokens" else len(r.source.split()) for r in results]
        for row in bleu_by_length(hyps, refs, lengths, edges):
            figures[f"bleu@{row['bucket']}"] = row["bleu"]
            figures[f"sentences@{row['bucket']}"] = row["sentences"]
        return figures

    def view(self, given: ViewInput, *, max_len: int = 100) -> PageInput:
        """Every attention of the model translating ``given.text`` greedily: the decoding itself is recorded (its
        steps joined), so the target rows are the tokens it produced, ``<eos>`` included."""
        from ...capture import capture_attention
        from ...data import EOS_ID
        from ...models.decoding import greedy_decode

        text = need_text(given.text, "translation")
        src_ids, cut = source_ids(self.src_tok, text)
        src = torch.tensor([src_ids], device=self.device)
        with capture_attention(self.model) as records:
            hyp = greedy_decode(self.model, src, torch.ones_like(src, dtype=torch.bool), max_len=max_len)[0]
        out = hyp.tokens
        finished = hyp.attention.shape[0] > len(out)  # the step that chose the end has a row too
        produced = out + [EOS_ID] if finished else out
        tokens = {"source": self.src_tok.tokens_of_ids(src_ids), "target": self.tgt_tok.tokens_of_ids(produced)}
        notes = [f"{self.options.model} translation model; target rows are the tokens it produced (greedy)"]
        if cut:
            notes.append(f"the source was cut to its first {len(src_ids)} tokens: {cut} more were not read")
        if not finished:
            notes.append(f"the translation stopped at {max_len} tokens without ending")
        return PageInput(records, tokens, title=f"{text} \u2192 {self.tgt_tok.decode(out)}", notes=notes)


def parse_buckets(text: str) -> tuple[tuple[int, int], ...]:
    """``"0,10,20"`` -> ``((0, 10), (11, 20))``: buckets of source lengths from increasing edges."""
    try:
        edges = [int(x) for x in text.split(",")]
    except ValueError:
        edges = []
    if len(edges) < 2 or edges != sorted(set(edges)) or edges[0] < 0:
        raise ValueError(f"buckets need increasing edges like 0,10,20,30 (--buckets), got {text!r}")
    return tuple((lo if i == 0 else lo + 1, hi) for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)))
