"""What speech recognition's task and predictor share: an utterance's features (:func:`utterance_features`),
transcribing a batch with the one decoder (:func:`transcribe_batch`) and its result :class:`Transcript`, and the
error rates (:func:`speech_metrics`, with ``jiwer``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["Transcript", "utterance_features", "transcribe_batch", "speech_metrics", "pad_features"]


@dataclass
class Transcript:
    """One transcribed utterance: the ``text`` and its characters ``tokens``; ``attention (T, S)`` (a row per
    output character, the end's included; None for CTC alone), ``ctc (S, V)`` the CTC log-probabilities of each
    listener frame (None without a CTC head), the ``features (F, M)`` it read and the decoder's ``score``."""

    text: str
    tokens: list[str]
    attention: Tensor | None
    ctc: Tensor | None
    features: Tensor
    score: float = 0.0
    source: str = ""


def utterance_features(wave: Tensor, n_mels: int) -> Tensor:
    """Log-mel features ``(F, n_mels)`` of a 16 kHz ``wave (T,)``, normalised per channel over the utterance
    (zero mean, unit variance: the level and the voice's colour matter less)."""
    from ...data.audio import log_mel

    x = log_mel(wave, n_mels=n_mels)
    return (x - x.mean(0)) / (x.std(0) + 1e-5)


def pad_features(features: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``(B, F_max, M)`` float32 zero-padded, and the lengths ``(B,)``."""
    lengths = torch.tensor([f.shape[0] for f in features])
    out = torch.zeros(len(features), int(lengths.max()), features[0].shape[1])
    for i, f in enumerate(features):
        out[i, : f.shape[0]] = f.float()
    return out, lengths


def transcribe_batch(model: nn.Module, tokenizer, features: Sequence[Tensor], *, beam: int = 1, max_len: int = 300,
                     ctc_weight: float | None = None, length_penalty: float = 0.0,
                     batch_size: int = 32) -> list[Transcript]:
    """Transcribe ``features`` (each ``(F, M)``) in length-sorted batches.

    Attention models decode with :func:`qkv.models.decoding.search` (greedy when ``beam`` is 1); with a CTC head
    and ``ctc_weight > 0`` (default: none) the beam adds CTC prefix scores (joint CTC/attention decoding). A CTC
    model decodes the best path.
    """
    from ...data import BOS_ID, EOS_ID, PAD_ID
    from ...models.ctc import CTCPrefixScorer, ctc_greedy, joint_step
    from ...models.decoding import search

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=lambda i: features[i].shape[0])
    results: dict[int, Transcript] = {}
    attending = hasattr(model, "decode_step")
    weight = float(ctc_weight or 0.0)
    if weight and getattr(model, "ctc_head", None) is None:
        raise ValueError("ctc_weight needs a model with a CTC head (trained with --ctc-weight > 0)")
    if attending and not 0 <= weight < 1:
        raise ValueError(f"ctc_weight must be in [0, 1) for an attention model, got {weight}")
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            x, lengths = pad_features([features[i] for i in idx])
            state = model.encode(x.to(device), lengths.to(device))
            ctc = state.get("ctc_log_probs")
            if not attending:
                hyps = [(ids, None, 0.0) for ids in ctc_greedy(ctc, state["lengths"], blank=PAD_ID)]
            else:
                limit = min(max_len, 4 * int(state["memory"].shape[1]) + 10, getattr(model, "max_len", max_len + 1) - 1)
                options = {}
                step = model.decode_step
                if weight:
                    scorer = CTCPrefixScorer(blank=PAD_ID, eos_id=EOS_ID, weight=weight, banned=(BOS_ID,))
                    options = {"prefix_scorer": scorer, "prefix_state": scorer.initial_state(ctc, state["lengths"]),
                               "normalize": False}
                    step = joint_step(model.decode_step, weight)
                found = search(step, state, len(idx), beam=beam, max_len=limit, length_penalty=length_penalty,
                               reorder=getattr(model, "reorder_state", None) or _reorder, device=device,
                               **options)
                hyps = [(h.tokens, h.attention, h.score) for h in found]
            for row, (i, (ids, attn, score)) in enumerate(zip(idx, hyps, strict=True)):
                s = int(state["lengths"][row])
                results[i] = Transcript(tokenizer.decode(ids), tokenizer.tokens_of_ids(ids),
                                        None if attn is None else attn[:, :s].float(),
                                        None if ctc is None else ctc[row, :s].float().cpu(), features[i],
                                        float(score))
    model.train(was_training)
    return [results[i] for i in range(len(features))]


def _reorder(state, index):
    from ...models.decoding import reorder_state

    return reorder_state(state, index)


def speech_metrics(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Word and character error rates (``jiwer``, over the whole set, in %), exact match and the count."""
    try:
        import jiwer
    except ImportError:
        raise ImportError("speech metrics need jiwer (pip install qkv[speech])") from None
    if len(hypotheses) != len(references) or not references:
        raise ValueError(f"need as many hypotheses as references, and some: {len(hypotheses)} and {len(references)}")
    refs = [r if r.strip() else "<empty>" for r in references]
    hyps = [h if h.strip() else "" for h in hypotheses]
    return {"wer": 100.0 * jiwer.wer(refs, hyps), "cer": 100.0 * jiwer.cer(refs, hyps),
            "exact_match": sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs),
            "utterances": float(len(refs))}
