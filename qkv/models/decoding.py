"""Greedy and batched beam-search decoding for every :class:`~qkv.models.seq2seq.EncoderDecoder`.

Both call ``encode`` once and ``decode_step`` per token (the Transformer's step uses its key/value cache)
and return each hypothesis with its alignment ``(T, S)``: the attention of every output token over the
source, the picture a translation command draws.

Beam search keeps ``beam`` hypotheses per sentence, all sentences of the batch in one tensor of
``B * beam`` rows. Finished hypotheses stay in the beam with a frozen score; the winner maximises
``log p / lp(len)`` with the length penalty of Wu et al., 2016 (https://arxiv.org/abs/1609.08144),
``lp = ((5 + len) / 6) ** alpha``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..data.tokenize import BOS_ID, EOS_ID
from .seq2seq import EncoderDecoder, reorder_state

__all__ = ["Hypothesis", "greedy_decode", "beam_search"]


@dataclass
class Hypothesis:
    """One decoded sentence: ``tokens`` without ``<bos>``/``<eos>``, its log-probability, its alignment."""

    tokens: list[int]
    score: float  #: sum of the token log-probabilities (the ``<eos>`` included when it was produced)
    attention: Tensor  #: (len(tokens) + 1 if finished else len(tokens), S): one row per produced token


def _check(src: Tensor, src_mask: Tensor, max_len: int) -> None:
    if src.dim() != 2 or src_mask.shape != src.shape or src_mask.dtype != torch.bool:
        raise ValueError(f"src must be (B, S) and src_mask a bool tensor of the same shape, got "
                         f"{tuple(src.shape)} and {tuple(src_mask.shape)} {src_mask.dtype}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, src_mask: Tensor, *, max_len: int = 100,
                  bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> list[Hypothesis]:
    """The most likely token at every step, for a batch ``src (B, S)``."""
    return beam_search(model, src, src_mask, beam=1, max_len=max_len, bos_id=bos_id, eos_id=eos_id)


@torch.no_grad()
def beam_search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, *, beam: int = 5, max_len: int = 100,
                length_penalty: float = 0.6, bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> list[Hypothesis]:
    """Batched beam search: the best of ``beam`` hypotheses for each row of ``src (B, S)``.

    Args:
        beam: hypotheses kept per sentence (1 is greedy decoding).
        max_len: most tokens produced per sentence (``<eos>`` included).
        length_penalty: ``alpha`` of ``lp``; 0 ranks by total log-probability.
    """
    _check(src, src_mask, max_len)
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    b, s = src.shape
    k = beam
    device = src.device
    state = model.encode(src, src_mask)
    rows = torch.arange(b, device=device).repeat_interleave(k)
    state = reorder_state(state, rows)
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
    finished = torch.zeros(b, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(b, k, dtype=torch.long, device=device)
    tokens = torch.empty(b, k, 0, dtype=torch.long, device=device)
    attns = torch.empty(b, k, 0, s, device=device)
    y = torch.full((b * k,), bos_id, dtype=torch.long, device=device)
    for _ in range(max_len):
        logits, attn, state = model.decode_step(y, state)
        logp = torch.log_softmax(logits.float(), dim=-1).view(b, k, -1)
        vocab = logp.shape[-1]
        # a finished hypothesis only continues with <eos> at no cost (it keeps its score and length)
        frozen = torch.full_like(logp, float("-inf"))
        frozen[..., eos_id] = 0.0
        logp = torch.where(finished[..., None], frozen, logp)
        cand = (scores[..., None] + logp).view(b, k * vocab)
        scores, flat = cand.topk(k, dim=-1)
        origin = torch.div(flat, vocab, rounding_mode="floor")  # (B, K) which hypothesis each came from
        token = flat % vocab
        pick = (torch.arange(b, device=device)[:, None] * k + origin).view(-1)
        state = reorder_state(state, pick)
        was_finished = finished.gather(1, origin)
        tokens = torch.cat([tokens.gather(1, origin[..., None].expand_as(tokens)), token[..., None]], dim=-1)
        attn = attn.float().view(b, k, s).gather(1, origin[..., None].expand(b, k, s))
        attns = torch.cat([attns.gather(1, origin[..., None, None].expand_as(attns)), attn[:, :, None]], dim=2)
        lengths = lengths.gather(1, origin) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        y = token.view(-1)
        if bool(finished.all()):
            break
    lp = ((5.0 + lengths.float()) / 6.0) ** length_penalty if length_penalty else torch.ones_like(scores)
    best = (scores / lp).argmax(dim=-1)
    out = []
    for i in range(b):
        j = int(best[i])
        n = int(lengths[i, j])
        toks = tokens[i, j, :n].tolist()
        done = bool(finished[i, j])
        words = toks[:-1] if done else toks
        out.append(Hypothesis(words, float(scores[i, j]), attns[i, j, :n].cpu()))
    return out
