"""Decoding over ONNX Runtime with numpy only (no PyTorch): greedy and beam search on an exported translator or
captioner.

The search is qkv's own (:func:`qkv.models.decoding.search`): ``K`` hypotheses per input pruned by their summed
log-probabilities, a finished hypothesis kept with a frozen score and length, the winner ranked by Wu et al.'s
length penalty ``((5 + |Y|) / 6) ** alpha``. Example::

    from qkv.export.runtime import Translator
    translator = Translator("exported/")            # what `qkv export RUN --out exported/` wrote
    ids = translator.decode([[5, 9, 7]], beam=4)    # source token ids -> target token ids

This module imports numpy and onnxruntime only, so that it can be copied beside the graphs and run where PyTorch
is not installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Translator", "Captioner", "Decoded", "log_softmax"]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@dataclass
class Decoded:
    """One decoded sequence: ``tokens`` without ``<bos>``/``<eos>``, its ``score``, its ``attention`` rows
    ``(len(tokens) + 1 if finished else len(tokens), S)``."""

    tokens: list[int]
    score: float
    attention: np.ndarray


class Translator:
    """The encoder and decoder step in ``directory`` (``export.json`` names them), in ONNX Runtime sessions."""

    def __init__(self, directory: str | Path, *, providers: list[str] | None = None):
        import onnxruntime as ort

        d = Path(directory)
        manifest = json.loads((d / "export.json").read_text(encoding="utf-8"))
        graphs = manifest["graphs"]
        providers = providers or ["CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        self.encoder = ort.InferenceSession(str(d / graphs["encoder"]["file"]), options, providers=providers)
        self.step = ort.InferenceSession(str(d / graphs["decoder_step"]["file"]), options, providers=providers)
        self.info = graphs["decoder_step"]
        self.step_outputs = list(self.info["outputs"])
        self.fed = {i.name for i in self.step.get_inputs()}

    def _empty_past(self, n: int, dtype) -> list[np.ndarray]:
        shape = (n, self.info["kv_heads"], 0, self.info["head_dim"])
        return [np.zeros(shape, dtype=dtype) for _ in range(2 * self.info["layers"])]

    def decode(self, sources: list[list[int]], *, beam: int = 1, max_len: int = 100,
               length_penalty: float = 0.6) -> list[Decoded]:
        """Translate source token id lists (right-padded into one batch) by beam search (greedy with
        ``beam=1``)."""
        if not sources or any(len(s) == 0 for s in sources):
            raise ValueError("every source needs at least one token")
        b, width = len(sources), max(len(s) for s in sources)
        src = np.full((b, width), self.info["pad_id"], dtype=np.int64)
        src_mask = np.zeros((b, width), dtype=bool)
        for i, s in enumerate(sources):
            src[i, :len(s)], src_mask[i, :len(s)] = s, True
        (memory,) = self.encoder.run(None, {"src": src, "src_mask": src_mask})
        found = self.search(memory, src_mask, beam=beam, max_len=max_len, length_penalty=length_penalty)
        return [Decoded(d.tokens, d.score, d.attention[:, :len(s)]) for d, s in zip(found, sources, strict=True)]

    def search(self, memory: np.ndarray, src_mask: np.ndarray | None, *, beam: int = 1, max_len: int = 100,
               length_penalty: float = 0.6) -> list[Decoded]:
        """Beam search from the encoder's ``memory (B, S, E)`` (and ``src_mask (B, S)``, for a graph that takes
        one); attention rows ``(n, S)``."""
        if beam < 1 or max_len < 1:
            raise ValueError(f"beam and max_len must be >= 1, got {beam} and {max_len}")
        b, k, width = memory.shape[0], beam, memory.shape[1]
        max_len = min(max_len, self.info["max_len"])
        expand = np.repeat(np.arange(b), k)
        memory = memory[expand]
        mask = None if src_mask is None else src_mask[expand]
        past = self._empty_past(b * k, memory.dtype)
        eos = self.info["eos_id"]
        scores = np.full((b, k), -np.inf, dtype=np.float32)
        scores[:, 0] = 0.0
        finished = np.zeros((b, k), dtype=bool)
        lengths = np.zeros((b, k), dtype=np.int64)
        tokens = np.zeros((b, k, 0), dtype=np.int64)
        attns = np.zeros((b, k, 0, width), dtype=np.float32)
        y = np.full(b * k, self.info["bos_id"], dtype=np.int64)
        names = [n for n in self.info["inputs"] if n.startswith("past_")]
        for _ in range(max_len):
            feed = {"tokens": y, "memory": memory, **dict(zip(names, past, strict=True))}
            if mask is not None:
                feed["src_mask"] = mask
            out = self.step.run(None, {n: v for n, v in feed.items() if n in self.fed})
            logits, attn, new_past = out[0], out[1], out[2:2 + len(past)]
            logp = log_softmax(logits).reshape(b, k, -1)
            vocab = logp.shape[-1]
            frozen = np.full_like(logp, -np.inf)
            frozen[..., eos] = 0.0
            logp = np.where(finished[..., None], frozen, logp)
            cand = (scores[..., None] + logp).reshape(b, k * vocab)
            flat = np.argsort(-cand, axis=-1, kind="stable")[:, :k]
            scores = np.take_along_axis(cand, flat, -1)
            origin, token = flat // vocab, flat % vocab
            pick = (np.arange(b)[:, None] * k + origin).reshape(-1)
            past = [p[pick] for p in new_past]
            memory, mask = memory[pick], None if mask is None else mask[pick]
            was_finished = np.take_along_axis(finished, origin, 1)
            tokens = np.concatenate([np.take_along_axis(tokens, origin[..., None], 1), token[..., None]], -1)
            row = attn.astype(np.float32).reshape(b, k, -1)
            row = np.take_along_axis(row, origin[..., None], 1)
            attns = np.concatenate([np.take_along_axis(attns, origin[..., None, None], 1), row[:, :, None]], 2)
            lengths = np.take_along_axis(lengths, origin, 1) + (~was_finished)
            finished = was_finished | (token == eos)
            y = token.reshape(-1)
            if finished.all():
                break
        lp = ((5.0 + lengths) / 6.0) ** length_penalty if length_penalty else np.ones_like(scores)
        best = (scores / lp).argmax(-1)
        results = []
        for i in range(b):
            j = int(best[i])
            n = int(lengths[i, j])
            toks = tokens[i, j, :n].tolist()
            words = toks[:-1] if finished[i, j] else toks
            results.append(Decoded(words, float(scores[i, j]), attns[i, j, :n]))
        return results


class Captioner(Translator):
    """An exported captioner: ``Captioner(directory).decode(pixels (B, C, S, S) in [0, 1], beam=3)``."""

    def decode(self, pixels: np.ndarray, *, beam: int = 1, max_len: int = 40,
               length_penalty: float = 0.0) -> list[Decoded]:
        (memory,) = self.encoder.run(None, {"pixels": np.asarray(pixels, dtype=np.float32)})
        return self.search(memory, None, beam=beam, max_len=max_len, length_penalty=length_penalty)
