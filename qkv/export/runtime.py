"""Decoding over ONNX Runtime with numpy only (no PyTorch): greedy and beam search on exported translators,
captioners, summarisers and speech recognisers.

The search is qkv's own (:func:`qkv.models.decoding.search`): ``K`` hypotheses per input pruned by their summed
log-probabilities, a finished hypothesis kept with a frozen score and length, the winner ranked by Wu et al.'s
length penalty ``((5 + |Y|) / 6) ** alpha`` (and coverage penalty), with its hooks: a banned repeated n-gram, a
least length, the ids fed back (a copied word outside the vocabulary read as ``<unk>``), and CTC prefix scores
(joint CTC/attention decoding, :class:`CTCPrefix`, the numpy form of :class:`qkv.models.ctc.CTCPrefixScorer`).
Example::

    from qkv.export.runtime import Translator
    translator = Translator("exported/")            # what `qkv export RUN --out exported/` wrote
    ids = translator.decode([[5, 9, 7]], beam=4)    # source token ids -> target token ids

This module imports numpy and onnxruntime only, so that it can be copied beside the graphs and run where PyTorch
is not installed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Translator", "Captioner", "Summarizer", "Transcriber", "Decoded", "CTCPrefix", "search", "log_softmax",
           "ngram_ban"]

_NEG = -np.inf


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    m = x.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@dataclass
class Decoded:
    """One decoded sequence: ``tokens`` without ``<bos>``/``<eos>``, its ``score``, its ``attention`` rows
    ``(len(tokens) + 1 if finished else len(tokens), S)`` (``(n, 0)`` without attention)."""

    tokens: list[int]
    score: float
    attention: np.ndarray


def ngram_ban(tokens: np.ndarray, n: int, vocab: int) -> np.ndarray:
    """``(N, V')`` bool: True at the tokens that would repeat an n-gram of ``tokens (N, t)``."""
    rows, t = tokens.shape
    ban = np.zeros((rows, vocab), dtype=np.int64)
    if n < 1 or t < n:
        return ban.astype(bool)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n, axis=1)  # (N, t - n + 1, n)
    match = (windows[..., :-1] == tokens[:, None, t - n + 1:]).all(-1)
    np.add.at(ban, (np.repeat(np.arange(rows), windows.shape[1]), windows[..., -1].reshape(-1)),
              match.reshape(-1).astype(np.int64))
    return ban > 0


def search(step: Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray | None, Any]], state: Any, b: int, *,
           reorder: Callable[[Any, np.ndarray], Any], beam: int = 1, max_len: int = 100, min_len: int = 0,
           length_penalty: float = 0.0, coverage_penalty: float = 0.0, source_mask: np.ndarray | None = None,
           no_repeat_ngram_size: int = 0, normalize: bool = True, bos_id: int = 1, eos_id: int = 2,
           feed: Callable[[np.ndarray], np.ndarray] | None = None, prefix: CTCPrefix | None = None,
           prefix_state: Any = None) -> list[Decoded]:
    """Beam search over ``step(tokens (N,), state) -> (scores (N, V'), attention (N, S) | None, state)`` from
    ``state`` (``b`` rows; ``reorder(state, rows)`` selects rows): the best :class:`Decoded` of each input."""
    if beam < 1 or max_len < 1 or not 0 <= min_len <= max_len:
        raise ValueError(f"need beam >= 1, max_len >= 1 and 0 <= min_len <= max_len, got {beam}, {max_len}, "
                         f"{min_len}")
    k = beam
    expand = np.repeat(np.arange(b), k)
    state = reorder(state, expand)
    if prefix is not None:
        prefix_state = prefix.rows(prefix_state, expand)
    scores = np.full((b, k), _NEG, dtype=np.float32)
    scores[:, 0] = 0.0
    finished = np.zeros((b, k), dtype=bool)
    lengths = np.zeros((b, k), dtype=np.int64)
    tokens = np.zeros((b, k, 0), dtype=np.int64)
    attns: np.ndarray | None = None
    y = np.full(b * k, bos_id, dtype=np.int64)
    for t in range(max_len):
        logits, attn, state = step(y if feed is None else feed(y), state)
        logp = log_softmax(logits) if normalize else logits.astype(np.float32)
        logp = logp.reshape(b, k, -1)
        vocab = logp.shape[-1]
        if prefix is not None:
            extra, candidates = prefix(tokens.reshape(b * k, t), prefix_state)
            logp = logp + extra.astype(np.float32).reshape(b, k, vocab)
        if no_repeat_ngram_size:
            ban = ngram_ban(tokens.reshape(b * k, t), no_repeat_ngram_size, vocab).reshape(b, k, vocab)
            logp = np.where(ban, np.float32(_NEG), logp)
        if t < min_len:
            logp[..., eos_id] = _NEG
        frozen = np.full_like(logp, _NEG)
        frozen[..., eos_id] = 0.0
        logp = np.where(finished[..., None], frozen, logp)
        cand = (scores[..., None] + logp).reshape(b, k * vocab)
        flat = np.argsort(-cand, axis=-1, kind="stable")[:, :k]
        scores = np.take_along_axis(cand, flat, -1)
        origin, token = flat // vocab, flat % vocab
        pick = (np.arange(b)[:, None] * k + origin).reshape(-1)
        state = reorder(state, pick)
        if prefix is not None:
            prefix_state = prefix.select(candidates, pick, token.reshape(-1))
        was_finished = np.take_along_axis(finished, origin, 1)
        tokens = np.concatenate([np.take_along_axis(tokens, origin[..., None], 1), token[..., None]], -1)
        if attn is not None:
            row = np.take_along_axis(attn.astype(np.float32).reshape(b, k, -1), origin[..., None], 1)
            kept = np.zeros((b, k, 0, row.shape[-1]), np.float32) if attns is None else \
                np.take_along_axis(attns, origin[..., None, None], 1)
            attns = np.concatenate([kept, row[:, :, None]], 2)
        lengths = np.take_along_axis(lengths, origin, 1) + (~was_finished)
        finished = was_finished | (token == eos_id)
        y = token.reshape(-1)
        if finished.all():
            break
    final = scores / (((5.0 + lengths) / 6.0) ** length_penalty if length_penalty else 1.0)
    if coverage_penalty:
        produced = np.arange(attns.shape[2]) < lengths[..., None]
        coverage = (attns * produced[..., None]).sum(2)
        terms = np.log(np.clip(coverage, 1e-10, 1.0))
        if source_mask is not None:
            terms = np.where(source_mask[:, None, :], terms, 0.0)
        final = final + coverage_penalty * terms.sum(-1)
    best = final.argmax(-1)
    results = []
    for i in range(b):
        j = int(best[i])
        n = int(lengths[i, j])
        toks = tokens[i, j, :n].tolist()
        rows = attns[i, j, :n] if attns is not None else np.zeros((n, 0), np.float32)
        results.append(Decoded(toks[:-1] if finished[i, j] else toks, float(scores[i, j]), rows))
    return results


class CTCPrefix:
    """CTC prefix scores (Watanabe et al., 2017, Algorithm 2) for :func:`search`: ``weight * (psi(g + c) -
    psi(g))`` for every hypothesis ``g`` and next token ``c``, ``psi(g + <eos>)`` the probability that the output is
    exactly ``g``; the same computation as :class:`qkv.models.ctc.CTCPrefixScorer`, in numpy."""

    def __init__(self, *, blank: int, eos_id: int, weight: float, banned: tuple[int, ...] = ()):
        self.blank, self.eos_id, self.weight, self.banned = blank, eos_id, weight, tuple(banned)

    def initial(self, log_probs: np.ndarray, lengths: np.ndarray) -> dict:
        x = log_probs.astype(np.float32)
        n, s, _ = x.shape
        r = np.full((n, s, 2), _NEG, dtype=np.float32)
        r[:, :, 1] = np.cumsum(x[:, :, self.blank], axis=1)
        return {"r": r, "psi": np.zeros(n, np.float32), "x": x, "len": lengths.astype(np.int64)}

    @staticmethod
    def rows(state: dict, rows: np.ndarray) -> dict:
        return {k: v[rows] for k, v in state.items()}

    def __call__(self, prefixes: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
        x, r_g, length = state["x"], state["r"], state["len"]
        n, s, v = x.shape
        last = prefixes[:, -1] if prefixes.shape[1] else np.full(n, -1)
        with np.errstate(invalid="ignore"):
            r_gsum = np.logaddexp(r_g[..., 0], r_g[..., 1])
            same = np.arange(v)[None, :] == last[:, None]
            phi = np.where(same[:, None, :], r_g[:, :, 1:2], r_gsum[:, :, None]).astype(np.float32)
            r = np.full((n, s, v, 2), _NEG, dtype=np.float32)
            if prefixes.shape[1] == 0:
                r[:, 0, :, 0] = x[:, 0]
            psi = r[:, 0, :, 0].copy()
            valid = np.arange(s)[None, :] < length[:, None]
            for t in range(1, s):
                r[:, t, :, 0] = np.logaddexp(r[:, t - 1, :, 0], phi[:, t - 1]) + x[:, t]
                r[:, t, :, 1] = np.logaddexp(r[:, t - 1, :, 0], r[:, t - 1, :, 1]) + x[:, t, self.blank:self.blank + 1]
                psi = np.logaddexp(psi, np.where(valid[:, t, None], phi[:, t - 1] + x[:, t], _NEG))
            end = np.clip(length - 1, 0, None)
            psi[:, self.eos_id] = r_gsum[np.arange(n), end]
            psi[:, self.blank] = _NEG
            for banned in self.banned:
                psi[:, banned] = _NEG
            scores = self.weight * (psi - state["psi"][:, None])
            impossible = np.isneginf(state["psi"])[:, None] | np.isnan(scores)
        return np.where(impossible, _NEG, scores).astype(np.float32), {"r": r, "psi": psi, "x": x, "len": length}

    @staticmethod
    def select(candidates: dict, rows: np.ndarray, tokens: np.ndarray) -> dict:
        return {"r": candidates["r"][rows, :, tokens], "psi": candidates["psi"][rows, tokens],
                "x": candidates["x"][rows], "len": candidates["len"][rows]}


class _Exported:
    """The graphs in ``directory`` (``export.json`` names them), in ONNX Runtime sessions; ``run(graph, feed)``
    feeds each graph the inputs it has."""

    def __init__(self, directory: str | Path, *, providers: list[str] | None = None):
        import onnxruntime as ort

        d = Path(directory)
        self.manifest = json.loads((d / "export.json").read_text(encoding="utf-8"))
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        self.sessions = {name: ort.InferenceSession(str(d / g["file"]), options,
                                                    providers=providers or ["CPUExecutionProvider"])
                         for name, g in self.manifest["graphs"].items()}
        self.fed = {name: {i.name for i in s.get_inputs()} for name, s in self.sessions.items()}
        self.info = self.manifest["graphs"].get("decoder_step", self.manifest["graphs"]["encoder"])

    def run(self, graph: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self.manifest["graphs"][graph]["outputs"]
        out = self.sessions[graph].run(None, {k: v for k, v in feed.items() if k in self.fed[graph]})
        return dict(zip(names, out, strict=True))

    def encode(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The encoder's outputs, and the encoder inputs that are part of the decoding state as they are."""
        out = self.run("encoder", feed)
        for name, given in self.manifest["graphs"]["encoder"].get("state_inputs", {}).items():
            out[name] = feed[given]
        return out

    # -- the decoding state: named arrays, batch first -------------------------------------------------------
    def start(self, encoded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The step's state from the encoder's outputs, with empty key/value caches."""
        info, state = self.info, dict(encoded)
        b = next(iter(encoded.values())).shape[0]
        if info.get("kind") == "state":
            caches = info.get("caches")
            for n in (caches["names"] if caches else ()):
                state[n] = np.zeros((b, caches["kv_heads"], 0, caches["head_dim"]), dtype=caches["dtype"])
        else:  # a Transformer's decoder step: past_key_i / past_value_i
            for i in range(info["layers"]):
                for kv in ("key", "value"):
                    state[f"past_{kv}_{i}"] = np.zeros((b, info["kv_heads"], 0, info["head_dim"]),
                                                       dtype=encoded["memory"].dtype)
        return state

    def carried(self) -> dict[str, str]:
        """``{output: state name}`` for the state the step changes."""
        outs = self.info["outputs"][2:]
        if self.info.get("kind") == "state":
            return {o: o.removeprefix("next_") for o in outs if o.startswith("next_")}
        return {o: f"past_{o}" for o in outs if not o.startswith("attention.")}

    @staticmethod
    def reorder(state: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[rows] for k, v in state.items()}

    def step(self, extra: dict[str, np.ndarray] | None = None):
        """The search's step function over the decoder step graph."""
        carried = self.carried()

        def run(tokens: np.ndarray, state: dict[str, np.ndarray]):
            out = self.run("decoder_step", {"tokens": tokens, **state, **(extra or {})})
            new = dict(state)
            for o, name in carried.items():
                new[name] = out[o]
            return out["logits"], out["attention"], new

        return run


class Translator(_Exported):
    """An exported translator: ``Translator(directory).decode([[5, 9, 7]], beam=4)`` (source token ids)."""

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
        encoded = self.encode({"src": src, "src_mask": src_mask})
        if self.info.get("kind") != "state":
            encoded["src_mask"] = src_mask
        found = self.search(encoded, beam=beam, max_len=max_len, length_penalty=length_penalty)
        return [Decoded(d.tokens, d.score, d.attention[:, :len(s)]) for d, s in zip(found, sources, strict=True)]

    def search(self, encoded: dict[str, np.ndarray], *, beam: int = 1, max_len: int = 100,
               length_penalty: float = 0.6, **options) -> list[Decoded]:
        """Beam search from the encoder's outputs (``options``: :func:`search`'s)."""
        b = next(iter(encoded.values())).shape[0]
        return search(self.step(options.pop("extra", None)), self.start(encoded), b, reorder=self.reorder,
                      beam=beam, max_len=min(max_len, self.info["max_len"]), length_penalty=length_penalty,
                      bos_id=self.info["bos_id"], eos_id=self.info["eos_id"], **options)


class Captioner(Translator):
    """An exported captioner: ``Captioner(directory).decode(pixels (B, C, S, S) in [0, 1], beam=3)``."""

    def decode(self, pixels: np.ndarray, *, beam: int = 1, max_len: int = 40,
               length_penalty: float = 0.0) -> list[Decoded]:
        encoded = self.encode({"pixels": np.asarray(pixels, dtype=np.float32)})
        return self.search(encoded, beam=beam, max_len=max_len, length_penalty=length_penalty)


class Summarizer(Translator):
    """An exported summariser (pointer-generator, its baseline, or the Transformer pointer):
    ``Summarizer(directory).decode(src, src_ext, n_ext, beam=4)``. ``src`` the source ids (words outside the
    vocabulary as ``<unk>``), ``src_ext`` the same with the ``j``-th such word as ``V + j``, ``n_ext`` how many;
    the tokens decoded are ids of that extended vocabulary (``V + j``: a copy of source word ``j``)."""

    def decode(self, src: list[list[int]], src_ext: list[list[int]] | None = None, n_ext: list[int] | None = None,
               *, beam: int = 4, max_len: int = 40, min_len: int = 0, length_penalty: float = 0.0,
               coverage_penalty: float = 0.0, no_repeat_ngram_size: int = 3) -> list[Decoded]:
        if not src or any(len(s) == 0 for s in src):
            raise ValueError("every source needs at least one token")
        src_ext = src if src_ext is None else src_ext
        b, width = len(src), max(len(s) for s in src)
        ids = np.full((b, width), self.info["pad_id"], dtype=np.int64)
        ext = ids.copy()
        mask = np.zeros((b, width), dtype=bool)
        for i, (s, e) in enumerate(zip(src, src_ext, strict=True)):
            ids[i, :len(s)], ext[i, :len(e)], mask[i, :len(s)] = s, e, True
        encoded = self.encode({"src": ids, "src_mask": mask, "src_ext": ext})
        x = max(max(n_ext or [0]), 1) if self.info.get("copy") else 0
        below = self.info["feed_below"]
        step = self.step()
        width_out = self.info["vocab"] + (max(n_ext or [0]) if self.info.get("copy") else 0)

        def sliced(tokens, state):
            state = {**state, **({"ext_slots": np.zeros((len(tokens), x), dtype=bool)} if x else {})}
            logits, attn, state = step(tokens, state)
            return logits[:, :width_out], attn, state

        found = search(sliced, self.start(encoded), b, reorder=self.reorder, beam=beam,
                       max_len=min(max_len, self.info["max_len"]), min_len=min_len, length_penalty=length_penalty,
                       coverage_penalty=coverage_penalty, source_mask=mask, no_repeat_ngram_size=no_repeat_ngram_size,
                       normalize=False, bos_id=self.info["bos_id"], eos_id=self.info["eos_id"],
                       feed=lambda t: np.where(t >= below, self.info["unk_id"], t))
        return [Decoded(d.tokens, d.score, d.attention[:, :len(s)]) for d, s in zip(found, src, strict=True)]


class Transcriber(_Exported):
    """An exported speech recogniser: ``Transcriber(directory).decode([features (F, n_mels)], beam=1)``.

    Decodes as qkv does with the run's settings (``export.json``): an attention model by :func:`search` with at
    most ``ceil(max_rate * seconds) + 5`` characters per utterance, the end allowed only above ``eos_threshold``,
    and with a CTC head and ``ctc_weight > 0`` joint CTC/attention decoding (:class:`CTCPrefix`); a CTC model
    alone by its best path (``beam=1``) or CTC prefix beam search."""

    def decode(self, features: list[np.ndarray], *, beam: int = 1, max_len: int = 300,
               ctc_weight: float | None = None) -> list[Decoded]:
        info = self.info
        if not features:
            raise ValueError("no features to transcribe")
        lengths = np.array([f.shape[0] for f in features], dtype=np.int64)
        x = np.zeros((len(features), int(lengths.max()), features[0].shape[1]), dtype=np.float32)
        for i, f in enumerate(features):
            x[i, :f.shape[0]] = f
        encoded = self.encode({"features": x, "frames": lengths})
        b = len(features)
        ctc = encoded.get("ctc_log_probs")
        frames = encoded["lengths"]
        pad, eos, bos = info["pad_id"], info["eos_id"], info["bos_id"]
        limits = np.full(b, max_len, dtype=np.int64)
        if info.get("max_rate") is not None:
            limits = np.minimum(limits, np.ceil(lengths.astype(np.float32) * np.float32(0.01)
                                                * np.float32(info["max_rate"])).astype(np.int64) + 5)
        if "decoder_step" not in self.sessions:  # CTC alone
            if beam == 1:
                return [Decoded(_best_path(ctc[i, :int(frames[i])], pad)[:int(limits[i])], 0.0,
                                np.zeros((0, 0), np.float32)) for i in range(b)]
            scorer = CTCPrefix(blank=pad, eos_id=eos, weight=1.0, banned=(bos,))
            v = ctc.shape[-1]
            found = search(lambda t, s: (np.zeros((len(t), v), np.float32), None, s), {}, b,
                           reorder=lambda s, r: s, beam=beam, max_len=int(limits.max()) + 1, normalize=False,
                           bos_id=bos, eos_id=eos, prefix=scorer, prefix_state=scorer.initial(ctc, frames))
            return [Decoded(d.tokens[:int(n)], d.score, d.attention) for d, n in zip(found, limits, strict=True)]
        weight = float(info.get("ctc_weight", 0.0) if ctc_weight is None else ctc_weight)
        limits = limits + 1  # max_len and max_rate count characters: the end token is one step more
        limits = np.clip(limits, None, 4 * int(encoded["memory"].shape[1]) + 10)
        limits = np.clip(limits, 1, None)
        limits = np.clip(limits, None, (info.get("model_max_len") or max_len + 2) - 1)
        step = self.step()
        per_row = np.repeat(limits, beam)
        gamma = float(info.get("eos_threshold") or 0.0)
        t_seen = [0]

        def decode_step(tokens, state):
            logits, attn, state = step(tokens, state)
            logits = logits.astype(np.float32)
            if gamma:
                others = logits.copy()
                others[:, eos] = _NEG
                low = logits[:, eos] - others.max(-1) < math.log(gamma)
                logits = logits.copy()
                logits[:, eos] = np.where(low, _NEG, logits[:, eos])
            if weight:
                logits = np.float32(1.0 - weight) * log_softmax(logits)
            end = t_seen[0] + 1 >= per_row
            t_seen[0] += 1
            if end.any():
                eos_score = np.maximum(logits[:, eos], np.float32(-1e4))
                logits = np.where(end[:, None], np.float32(_NEG), logits)
                logits[:, eos] = np.where(end, eos_score, logits[:, eos])
            return logits, attn, state

        prefix = prefix_state = None
        if weight:
            prefix = CTCPrefix(blank=pad, eos_id=eos, weight=weight, banned=(bos,))
            prefix_state = prefix.initial(ctc, frames)
        found = search(decode_step, self.start(encoded), b, reorder=self.reorder, beam=beam,
                       max_len=int(limits.max()), length_penalty=float(info.get("length_penalty") or 0.0),
                       normalize=not weight, bos_id=bos, eos_id=eos, prefix=prefix, prefix_state=prefix_state)
        return [Decoded(d.tokens, d.score, d.attention[:, :int(n)]) for d, n in zip(found, frames, strict=True)]


def _best_path(log_probs: np.ndarray, blank: int) -> list[int]:
    ids, last = [], None
    for tok in log_probs.argmax(-1).tolist():
        if tok != last and tok != blank:
            ids.append(tok)
        last = tok
    return ids
