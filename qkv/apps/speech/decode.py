"""What speech recognition's task and predictor share: an utterance's features (:func:`utterance_features`),
transcribing a batch with the one decoder (:func:`transcribe_batch`) and its result :class:`Transcript`, and the
error rates (:func:`speech_metrics`, with ``jiwer``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...options import OptionError, ref
from ...train.threads import follow_threads

__all__ = ["Transcript", "utterance_features", "transcribe_batch", "limited_step", "eos_threshold_step",
           "speech_metrics", "pad_features"]

logger = logging.getLogger(__name__)


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
    #: why decoding stopped: ``"end"`` (the model ended it), or the limit it reached: ``"max_len"``, ``"max_rate"``
    #: (characters a second of audio), ``"frames"`` (4 characters a listener frame) or ``"positions"`` (the model's)
    stopped: str = "end"
    #: the beam's own transcript when a word model corrected ``text`` after it
    #: (:meth:`~qkv.apps.speech.words.WordModel.correct`)
    spelled: str = ""


def utterance_features(wave: Tensor, n_mels: int) -> Tensor:
    """Log-mel features ``(F, n_mels)`` of a 16 kHz ``wave (T,)``, normalised per channel over the utterance
    (zero mean, unit variance: the level and the voice's colour matter less)."""
    from .audio import log_mel

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
                     ctc_weight: float | None = None, length_penalty: float = 0.0, window: Sequence[int] = (),
                     max_rate: float | None = None, eos_threshold: float = 0.0, lm=None, lm_weight: float | None = None,
                     length_reward: float = 0.0, words=None, words_weight: float | None = None,
                     words_fusion: float | None = None, batch_size: int = 32) -> list[Transcript]:
    """Transcribe ``features`` (each ``(F, M)``) in length-sorted batches.

    Attention models decode with :func:`qkv.models.decoding.search` (greedy when ``beam`` is 1); with a CTC head
    and ``ctc_weight > 0`` (default: none) the beam adds CTC prefix scores (joint CTC/attention decoding). A CTC
    model decodes the best path (``beam`` 1) or by CTC prefix beam search (:func:`qkv.models.ctc.ctc_beam_search`).

    Limits that keep decoding robust to the utterance's length:

    - ``max_rate``: at most ``ceil(max_rate * seconds) + 5`` characters for an utterance of ``F`` frames of 10 ms
      (each its own limit; English speech is 10-20 characters a second), and never more than ``max_len``
      characters (the end token is not one of them); a transcript that reached a limit names it in ``stopped``;
    - ``window = (left, right)``: Listen, Attend and Spell attends only to the listener frames ``[m - left,
      m + right]`` around the median ``m`` of the previous step's weights (:func:`qkv.models.speech.attention_window`);
    - ``eos_threshold`` ``gamma`` in ``(0, 1]``: the end is proposed only when ``p(<eos>) >= gamma * max_c p(c)``
      (Hannun et al., 2019, https://arxiv.org/abs/1904.02619: a beam stops less often too early);
    - ``length_penalty``: Wu et al.'s ``alpha``, the final beam ranked by ``score / lp``.

    ``lm`` (a trained language model: anything with ``.model``, a :class:`~qkv.models.lm.CausalLM`, and
    ``.tokenizer``, of characters like the decoder's) is fused into the beam of an attention model with weight
    ``lm_weight`` (default :data:`qkv.models.fusion.DEFAULT_WEIGHT`), and ``length_reward`` per character
    (:mod:`qkv.models.fusion`); ``lm_weight = 0`` is decoding without it.

    ``words`` (a :class:`~qkv.apps.speech.words.WordModel`) is fused into the beam of an attention model with
    weight ``words_fusion`` (:class:`~qkv.apps.speech.words.WordScorer`, look-ahead over each word's characters;
    default :data:`~qkv.apps.speech.words.DEFAULT_WORDS_FUSION`, 0: not in the beam), then corrects each
    transcript's words with ``words_weight`` (default :data:`~qkv.apps.speech.words.DEFAULT_WORDS_WEIGHT`), the
    decoder's own spelling kept in ``spelled``.
    """
    from ...data import BOS_ID, EOS_ID, PAD_ID
    from ...models.ctc import CTCPrefixScorer, ctc_beam_search, ctc_greedy, joint_step
    from ...models.decoding import search
    from ...models.fusion import ScorerSum

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=lambda i: features[i].shape[0])
    results: dict[int, Transcript] = {}
    attending = hasattr(model, "decode_step")
    weight = float(ctc_weight or 0.0)
    if weight and getattr(model, "ctc_head", None) is None:
        raise OptionError(ref("ctc_weight") + " needs a model with a CTC head (trained with " + ref("ctc_weight") +
                          " > 0)", "ctc_weight")
    if attending and not 0 <= weight < 1:
        raise ValueError(f"ctc_weight must be in [0, 1) for an attention model, got {weight}")
    window = tuple(window or ())
    if window and (len(window) != 2 or min(window) < 0):
        raise ValueError(f"window must be two frame counts (left, right) >= 0, got {window}")
    if window and not hasattr(model, "attend"):
        raise OptionError(ref("window") + " applies to Listen, Attend and Spell (" + ref("model") + " las) only",
                          "window", "model")
    if max_rate is not None and max_rate <= 0:
        raise ValueError(f"max_rate must be > 0 characters a second, got {max_rate}")
    if not 0 <= eos_threshold <= 1:
        raise ValueError(f"eos_threshold must be in [0, 1], got {eos_threshold}")
    fusion = _lm_fusion(lm, lm_weight, length_reward, tokenizer, attending)
    word_scorer = _word_fusion(words, words_fusion, tokenizer, attending)
    with torch.no_grad():
        frames = [f.shape[0] for f in features]
        for start in follow_threads(range(0, len(order), batch_size),
                                    lambda s: sum(frames[i] for i in order[s:s + batch_size]), device=device):
            idx = order[start:start + batch_size]
            x, lengths = pad_features([features[i] for i in idx])
            state = model.encode(x.to(device), lengths.to(device))
            ctc = state.get("ctc_log_probs")
            bounds = {"max_len": torch.full((len(idx),), max_len, dtype=torch.long)}
            if max_rate is not None:
                bounds["max_rate"] = (lengths.float() * 0.01 * max_rate).ceil().long() + 5
            if not attending:
                limits = _tightest(bounds)
                if beam == 1:  # the best path, then cut at the limit
                    found = [(ids, 0.0) for ids in ctc_greedy(ctc, state["lengths"], blank=PAD_ID)]
                else:  # the beam stops at the longest limit of the batch, each cut at its own
                    found = [(h.tokens, h.score) for h in ctc_beam_search(
                        ctc, state["lengths"], beam=beam, blank=PAD_ID, eos_id=EOS_ID, banned=(BOS_ID,),
                        max_len=int(limits.max()))]
                hyps = [(ids[:int(n)], None, score, len(ids) > n)
                        for (ids, score), n in zip(found, limits, strict=True)]
            else:
                # the end is forced once an utterance has its most characters; <eos> is one token more
                bounds = {k: v + 1 for k, v in bounds.items()}
                bounds["frames"] = torch.full((len(idx),), 4 * int(state["memory"].shape[1]) + 10)
                bounds["positions"] = torch.full((len(idx),), getattr(model, "max_len", max_len + 2) - 1)
                limits = _tightest(bounds).clamp(min=1)
                options = {}
                step = model.decode_step
                if eos_threshold:
                    step = eos_threshold_step(step, EOS_ID, eos_threshold)
                if window:
                    state["window"] = window
                scorers, states = [], []
                if weight:
                    scorer = CTCPrefixScorer(blank=PAD_ID, eos_id=EOS_ID, weight=weight, banned=(BOS_ID,))
                    scorers.append(scorer)
                    states.append(scorer.initial_state(ctc, state["lengths"]))
                    options = {"normalize": False}
                    step = joint_step(step, weight)
                if fusion is not None:
                    scorers.append(fusion)
                    states.append(fusion.initial_state())
                if word_scorer is not None:
                    scorers.append(word_scorer)
                    states.append(word_scorer.initial_state())
                if scorers:
                    options.update({"prefix_scorer": scorers[0] if len(scorers) == 1 else ScorerSum(scorers),
                                    "prefix_state": states[0] if len(states) == 1 else states})
                step = limited_step(step, EOS_ID, limits.to(device), beam)
                found = search(step, state, len(idx), beam=beam, max_len=int(limits.max()),
                               length_penalty=length_penalty, device=device,
                               reorder=getattr(model, "reorder_state", None) or _reorder, **options)
                hyps = [(h.tokens, h.attention, h.score, len(h.tokens) + 1 >= n)
                        for h, n in zip(found, limits, strict=True)]
            for row, (i, (ids, attn, score, reached)) in enumerate(zip(idx, hyps, strict=True)):
                s = int(state["lengths"][row])
                stopped = next((k for k, v in bounds.items() if v[row] <= limits[row]), "max_len") if reached \
                    else "end"
                results[i] = Transcript(tokenizer.decode(ids), tokenizer.tokens_of_ids(ids),
                                        None if attn is None else attn[:, :s].float(),
                                        None if ctc is None else ctc[row, :s].float().cpu(), features[i],
                                        float(score), stopped=stopped)
    model.train(was_training)
    out = [results[i] for i in range(len(features))]
    if words is not None:
        from .words import DEFAULT_WORDS_WEIGHT

        weight = DEFAULT_WORDS_WEIGHT if words_weight is None else words_weight
        for t in out:
            t.spelled, t.text = t.text, words.correct(t.text, weight)
    return out


def _tightest(bounds: dict[str, Tensor]) -> Tensor:
    """The per-utterance limit ``(B,)``: the smallest of ``bounds`` (each ``(B,)``, by the name of its limit)."""
    return torch.stack(list(bounds.values())).min(0).values


def _lm_fusion(lm, weight: float | None, reward: float, tokenizer, attending: bool):
    """:func:`~qkv.models.fusion.fusion_scorer` for the decoder's ``tokenizer``; a language model for a CTC model
    alone is a ``ValueError``."""
    from ...data import EOS_ID
    from ...models.fusion import fusion_scorer

    if lm is not None and not attending:
        raise ValueError("a language model is fused into an attention decoder's beam (las, transformer or a hybrid "
                         "run), not into a CTC model alone")
    return fusion_scorer(lm, tokenizer, weight=weight, reward=reward, eos_id=EOS_ID)


def _word_fusion(words, weight: float | None, tokenizer, attending: bool):
    """The :class:`~qkv.apps.speech.words.WordScorer` of ``words`` for an attention decoder's beam, or None (no word
    model, weight 0, or a CTC model alone, whose beam does not take it)."""
    from ...data import EOS_ID
    from .words import DEFAULT_WORDS_FUSION, WordScorer

    weight = DEFAULT_WORDS_FUSION if weight is None else float(weight)
    if weight < 0:
        raise ValueError(f"words_fusion must be >= 0, got {weight}")
    if words is None or not weight or not attending:
        return None
    return WordScorer(words, tokenizer.tokens_of_ids(range(tokenizer.vocab_size)), weight=weight, eos_id=EOS_ID)


def eos_threshold_step(step, eos_id: int, gamma: float):
    """``step`` (a :func:`qkv.models.decoding.search` step function giving logits) with ``<eos>`` allowed only where
    ``p(<eos>) >= gamma * max_c p(c)`` over the other tokens ``c`` (its logit is ``-inf`` elsewhere)."""
    if not 0 < gamma <= 1:
        raise ValueError(f"eos_threshold must be in (0, 1], got {gamma}")
    log_gamma = math.log(gamma)

    def thresholded(tokens: Tensor, state):
        logits, attn, state = step(tokens, state)
        logits = logits.float().clone()
        others = logits.clone()
        others[:, eos_id] = float("-inf")
        low = logits[:, eos_id] - others.max(-1).values < log_gamma
        logits[:, eos_id] = logits[:, eos_id].masked_fill(low, float("-inf"))
        return logits, attn, state

    return thresholded


def limited_step(step, eos_id: int, limits: Tensor, beam: int):
    """``step`` (a :func:`qkv.models.decoding.search` step function) with the hypotheses of input ``b`` ending at
    their ``limits[b]``-th token: there only ``<eos>`` is allowed (with its own score, floored at -1e4).
    ``limits (B,)``; rows ``b * beam ... b * beam + beam - 1`` are input ``b``'s (the search's layout), and the
    search calls the step once per position, from the first."""
    t = 0
    per_row = limits.repeat_interleave(beam)

    def limited(tokens: Tensor, state):
        nonlocal t
        scores, attn, state = step(tokens, state)
        end = t + 1 >= per_row.to(scores.device)
        t += 1
        if not bool(end.any()):
            return scores, attn, state
        eos = scores[:, eos_id].float().clamp(min=-1e4)
        scores = scores.float().masked_fill(end[:, None], float("-inf"))
        scores[:, eos_id] = torch.where(end, eos, scores[:, eos_id])
        return scores, attn, state

    return limited


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
