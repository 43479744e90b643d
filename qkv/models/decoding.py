"""The one decoder: greedy and batched beam search over a step function and an encoder state, for every generator.

Axis letters: ``B`` inputs in the batch, ``K`` beam, ``N = B * K`` hypotheses (row ``b * K + j`` is hypothesis
``j`` of input ``b``), ``t`` tokens produced so far, ``V'`` the size of the step's output distribution (the model's
vocabulary ``V``, or an extended vocabulary ``V' >= V`` for copying), ``S`` the positions the decoder attends to
(source tokens, image grid cells, audio frames).

The protocol (:class:`Decodable`; translation's :class:`~qkv.models.seq2seq.EncoderDecoder` s and every
captioner implement it directly, with no adapter):

- ``model.encode(*inputs) -> state``: the encoder state of ``B`` inputs (``(src, src_mask)``, ``(images,)``, ...),
  batch first: tensors, :class:`~qkv.layers.KVCache` s and dicts/lists/tuples of them, each tensor with ``B`` rows.
- ``model.decode_step(tokens (N,), state) -> (scores (N, V'), attention (N, S) or None, state)``: one token of
  every hypothesis. ``scores`` are logits or log-probabilities (``log_softmax`` is applied to them unless
  ``normalize=False``); the attention row is the picture of the step (it may be None when there is none).
- optional ``model.reorder_state(state, index (N,)) -> state``: keep the rows ``index`` (beam search calls it after
  each step with the hypotheses kept, and once to repeat the ``B`` rows ``K`` times). Default:
  :func:`reorder_state`, ``index_select`` of every tensor along dim 0.
- optional ``model.feed_tokens(tokens (N,), state) -> tokens (N,)``: the ids fed back to the next step, for a
  model whose output is over an extended vocabulary (token ``>= V``: a copied source word). Without it, tokens
  ``>= vocab_size`` (when given) are fed back as ``unk_id``.

:func:`search` is the algorithm on a bare step function (what the tests hold to brute force);
:func:`beam_search` and :func:`greedy_decode` call it on a model.

Beam search keeps ``K`` hypotheses per input. They are pruned by their accumulated score (the step log-probabilities
plus the prefix scorer's); a finished hypothesis stays in the beam with a frozen score and length. The winner among
the ``K`` at the end maximises ``score / lp + cp``, Wu et al., 2016, "Google's Neural Machine Translation System"
(https://arxiv.org/abs/1609.08144): length penalty ``lp = ((5 + |Y|) / 6) ** alpha`` (``|Y|`` counts ``<eos>``
when produced) and coverage penalty ``cp = beta * sum_j log(min(sum_i a_ij, 1))`` over the source positions ``j``
(``a_ij``: the attention of output token ``i``, ``<eos>`` included). Differs from the paper: both penalties rank
the final beam only (pruning uses the plain score), and ``log`` is floored at ``log(1e-10)`` so that a source
position that was never attended does not make every hypothesis ``-inf``.

Hooks for the applications built on it: ``no_repeat_ngram_size`` (a token that would repeat an n-gram of the
hypothesis scores ``-inf``), ``min_len``/``max_len``, one ``eos_id`` (and ``bos_id``) per input, and a
``prefix_scorer`` (:class:`PrefixScorer`) adding a log-score per prefix and next token, with its own state that the
search selects by hypothesis and token (CTC prefix scores in joint CTC/attention decoding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..data.tokenize import BOS_ID, EOS_ID, UNK_ID
from ..layers import KVCache

__all__ = ["Hypothesis", "Decodable", "PrefixScorer", "reorder_state", "teacher_forced", "search", "beam_search",
           "greedy_decode", "length_penalty_wu", "coverage_penalty_wu", "repeated_ngram_ban"]

_COVERAGE_FLOOR = 1e-10


@dataclass
class Hypothesis:
    """One decoded sequence: ``tokens`` without ``<bos>``/``<eos>``, its score, its attention rows."""

    tokens: list[int]
    score: float  #: accumulated step log-probabilities (+ prefix scores), ``<eos>`` included when produced
    attention: Tensor  #: (len(tokens) + 1 if finished else len(tokens), S): one row per produced token
    #: why it stopped: ``"end"`` (it produced ``<eos>``) or ``"max_len"`` (it had the most tokens allowed)
    stopped: str = "end"


def reorder_state(state: Any, index: Tensor) -> Any:
    """Select batch rows ``index`` of every tensor (and :class:`~qkv.layers.KVCache`, in place) in a decoding
    state made of dicts, lists and tuples; anything else is kept as it is."""
    if isinstance(state, Tensor):
        return state.index_select(0, index)
    if isinstance(state, KVCache):
        state.reorder(index)
        return state
    if isinstance(state, dict):
        return {k: reorder_state(v, index) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(reorder_state(v, index) for v in state)
    return state


@runtime_checkable
class Decodable(Protocol):
    """What :func:`beam_search` needs of a model (see the module docstring for the optional methods)."""

    def encode(self, *inputs: Any) -> Any: ...

    def decode_step(self, tokens: Tensor, state: Any) -> tuple[Tensor, Tensor | None, Any]: ...


class PrefixScorer:
    """An extra additive log-score for every hypothesis and next token (e.g. CTC prefix scores).

    ``scorer(prefixes (N, t), state) -> (scores (N, V'), candidates)``: ``prefixes`` the tokens chosen so far (no
    ``<bos>``); ``candidates`` the state of every extension, from which :meth:`select` keeps those chosen. A plain
    callable with the same signature works too (its state is then reordered by :func:`reorder_state`).
    """

    def __call__(self, prefixes: Tensor, state: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def select(self, candidates: Any, rows: Tensor, tokens: Tensor) -> Any:
        """The state of the kept hypotheses: extension ``tokens (N,)`` of hypotheses ``rows (N,)``. Default: the
        rows of a state that does not depend on the next token."""
        return reorder_state(candidates, rows)


def teacher_forced(step: Callable[..., tuple[Any, ...]], tokens: Tensor,
                   state: Any) -> tuple[list[Tensor], Any]:
    """Teacher forcing: ``step(tokens[:, t], state) -> (*outputs, state)`` at every position ``t`` of
    ``tokens (B, T)``, each given the state the one before returned. Returns each output stacked along dim 1
    (``(B, T, ...)``) and the last state."""
    rows = []
    for t in range(tokens.shape[1]):
        *outputs, state = step(tokens[:, t], state)
        rows.append(outputs)
    return [torch.stack(x, dim=1) for x in zip(*rows, strict=True)], state


def length_penalty_wu(lengths: Tensor, alpha: float) -> Tensor:
    """Wu et al.'s ``lp = ((5 + |Y|) / 6) ** alpha`` for ``lengths (...)`` (ones when ``alpha`` is 0)."""
    if not alpha:
        return torch.ones_like(lengths, dtype=torch.float)
    return ((5.0 + lengths.float()) / 6.0) ** alpha


def coverage_penalty_wu(coverage: Tensor, beta: float, mask: Tensor | None = None) -> Tensor:
    """Wu et al.'s ``cp = beta * sum_j log(min(c_j, 1))`` of ``coverage (..., S)`` (``c_j = sum_i a_ij``, the
    attention summed over the output tokens), over the positions where ``mask (..., S)`` is True (all without)."""
    terms = torch.log(coverage.float().clamp(max=1.0).clamp(min=_COVERAGE_FLOOR))
    if mask is not None:
        terms = terms.masked_fill(~mask, 0.0)
    return beta * terms.sum(-1)


def repeated_ngram_ban(tokens: Tensor, n: int, vocab: int) -> Tensor:
    """``(N, V')`` bool: True at the tokens that would repeat an n-gram of ``tokens (N, t)`` (none when ``t < n``)."""
    rows, t = tokens.shape
    ban = torch.zeros(rows, vocab, dtype=torch.long, device=tokens.device)
    if n < 1 or t < n:
        return ban.bool()
    windows = tokens.unfold(1, n, 1)  # (N, t - n + 1, n): every n-gram so far
    match = (windows[..., :-1] == tokens[:, None, t - n + 1:]).all(-1)  # its first n - 1 tokens end the prefix
    return ban.scatter_add_(1, windows[..., -1], match.long()) > 0


def _per_input(value: int | Sequence[int] | Tensor, b: int, name: str, device) -> Tensor:
    ids = torch.as_tensor(value, dtype=torch.long, device=device)
    if ids.dim() == 0:
        return ids.expand(b)
    if ids.shape != (b,):
        raise ValueError(f"{name} must be one id or one per input ({b}), got shape {tuple(ids.shape)}")
    return ids


@torch.no_grad()
def search(step: Callable[[Tensor, Any], tuple[Tensor, Tensor | None, Any]], state: Any, batch_size: int, *,
           beam: int = 5, max_len: int = 100, min_len: int = 0, length_penalty: float = 0.6,
           coverage_penalty: float = 0.0, source_mask: Tensor | None = None, no_repeat_ngram_size: int = 0,
           prefix_scorer: Callable[[Tensor, Any], tuple[Tensor, Any]] | None = None, prefix_state: Any = None,
           bos_id: int | Sequence[int] | Tensor = BOS_ID, eos_id: int | Sequence[int] | Tensor = EOS_ID,
           vocab_size: int | None = None, unk_id: int = UNK_ID, feed: Callable[[Tensor, Any], Tensor] | None = None,
           reorder: Callable[[Any, Tensor], Any] = reorder_state, normalize: bool = True,
           device: torch.device | str | None = None) -> list[Hypothesis]:
    """Batched beam search over ``step(tokens (N,), state) -> (scores (N, V'), attention (N, S) | None, state)``
    from ``state`` (``batch_size`` rows, batch first); the best hypothesis of each input.

    Args:
        beam: hypotheses kept per input (1 is greedy decoding).
        max_len: most tokens produced per input (``<eos>`` included).  min_len: fewest tokens before ``<eos>``.
        length_penalty: ``alpha`` of ``lp``; 0 ranks by the plain score.
        coverage_penalty: ``beta`` of ``cp`` (needs the attention); 0 switches it off.
        source_mask: ``(B, S)`` bool, the positions ``cp`` sums over (all without).
        no_repeat_ngram_size: ``n > 0`` forbids repeating any n-gram within a hypothesis.
        prefix_scorer, prefix_state: an extra log-score (:class:`PrefixScorer`) and its state for the ``B`` inputs
            (batch first; repeated for the beams with :func:`reorder_state`); a scorer of fewer tokens than the
            step's (a base vocabulary under an extended one) scores the others as its ``unk_id``.
        bos_id, eos_id: one id, or one per input ``(B,)``.
        vocab_size, unk_id: tokens ``>= vocab_size`` (an extended vocabulary) are fed back as ``unk_id``.
        feed: ``feed(tokens (N,), state) -> tokens (N,)``, the ids fed back (replaces ``vocab_size``/``unk_id``).
        reorder: ``reorder(state, index (N,)) -> state``.  normalize: apply ``log_softmax`` to the step's scores.
        device: where the search's own tensors live (default: the first tensor of ``state``, else the CPU).
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if max_len < 1 or not 0 <= min_len <= max_len:
        raise ValueError(f"max_len must be at least 1 and min_len in [0, max_len], got {max_len} and {min_len}")
    if no_repeat_ngram_size < 0 or coverage_penalty < 0:
        raise ValueError(f"no_repeat_ngram_size and coverage_penalty must be >= 0, got {no_repeat_ngram_size} and "
                         f"{coverage_penalty}")
    b, k = batch_size, beam
    device = torch.device(device) if device is not None else _device_of(state)
    bos, eos = _per_input(bos_id, b, "bos_id", device), _per_input(eos_id, b, "eos_id", device)
    eos = eos[:, None].expand(b, k)
    if feed is None and vocab_size is not None:
        feed = partial(_unk_beyond, vocab_size=vocab_size, unk_id=unk_id)
    select = getattr(prefix_scorer, "select", None) or (lambda cand, rows, _tokens: reorder_state(cand, rows))
    expand = torch.arange(b, device=device).repeat_interleave(k)
    state = reorder(state, expand)
    if prefix_scorer is not None:
        prefix_state = reorder_state(prefix_state, expand)
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live hypothesis per input at the start
    finished = torch.zeros(b, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(b, k, dtype=torch.long, device=device)
    tokens = torch.empty(b, k, 0, dtype=torch.long, device=device)
    attns: Tensor | None = None  # (B, K, t, S) once a step returned attention
    y = bos.repeat_interleave(k)
    for t in range(max_len):
        logits, attn, state = step(y if feed is None else feed(y, state), state)
        logp = torch.log_softmax(logits.float(), dim=-1) if normalize else logits.float()
        logp = logp.view(b, k, -1)
        vocab = logp.shape[-1]
        if prefix_scorer is not None:
            extra, candidates = prefix_scorer(tokens.view(b * k, t), prefix_state)
            if extra.shape[-1] < vocab:  # a scorer of the base vocabulary: an extended token scores as its <unk>
                extra = torch.cat([extra, extra[:, unk_id:unk_id + 1].expand(-1, vocab - extra.shape[-1])], -1)
            logp = logp + extra.float().view(b, k, vocab)
        if no_repeat_ngram_size:
            ban = repeated_ngram_ban(tokens.view(b * k, t), no_repeat_ngram_size, vocab).view(b, k, vocab)
            logp = logp.masked_fill(ban, float("-inf"))
        if t < min_len:
            logp = logp.scatter(-1, eos[..., None], float("-inf"))
        # a finished hypothesis only continues with <eos> at no cost (it keeps its score and length)
        frozen = torch.full_like(logp, float("-inf")).scatter_(-1, eos[..., None], 0.0)
        logp = torch.where(finished[..., None], frozen, logp)
        cand = (scores[..., None] + logp).view(b, k * vocab)
        scores, flat = cand.topk(k, dim=-1)
        origin = torch.div(flat, vocab, rounding_mode="floor")  # (B, K) which hypothesis each came from
        token = flat % vocab
        pick = (torch.arange(b, device=device)[:, None] * k + origin).view(-1)
        state = reorder(state, pick)
        if prefix_scorer is not None:
            prefix_state = select(candidates, pick, token.view(-1))
        was_finished = finished.gather(1, origin)
        tokens = torch.cat([tokens.gather(1, origin[..., None].expand_as(tokens)), token[..., None]], dim=-1)
        if attn is not None:
            s = attn.shape[-1]
            attn = attn.float().view(b, k, s).gather(1, origin[..., None].expand(b, k, s))
            kept = attns.gather(1, origin[..., None, None].expand_as(attns)) if attns is not None else \
                attn.new_zeros(b, k, t, s)
            attns = torch.cat([kept, attn[:, :, None]], dim=2)
        lengths = lengths.gather(1, origin) + (~was_finished).long()
        finished = was_finished | (token == eos)
        y = token.view(-1)
        if bool(finished.all()):
            break
    final = scores / length_penalty_wu(lengths, length_penalty)
    if coverage_penalty:
        if attns is None:
            raise ValueError("coverage_penalty needs a step that returns attention")
        produced = torch.arange(attns.shape[2], device=device) < lengths[..., None]  # (B, K, t)
        coverage = (attns * produced[..., None]).sum(2)  # (B, K, S)
        mask = None if source_mask is None else source_mask.to(device)[:, None, :]
        final = final + coverage_penalty_wu(coverage, coverage_penalty, mask)
    best = final.argmax(dim=-1)
    out = []
    for i in range(b):
        j = int(best[i])
        n = int(lengths[i, j])
        toks = tokens[i, j, :n].tolist()
        words = toks[:-1] if bool(finished[i, j]) else toks
        rows = attns[i, j, :n].cpu() if attns is not None else torch.zeros(n, 0)
        out.append(Hypothesis(words, float(scores[i, j]), rows, "end" if bool(finished[i, j]) else "max_len"))
    return out


def _unk_beyond(tokens: Tensor, _state: Any, *, vocab_size: int, unk_id: int) -> Tensor:
    """``tokens (N,)`` with every id ``>= vocab_size`` (a word of an extended vocabulary) replaced by ``unk_id``."""
    return torch.where(tokens >= vocab_size, torch.full_like(tokens, unk_id), tokens)


def _device_of(state: Any) -> torch.device:
    """The device of the first tensor in a decoding state (the CPU when there is none)."""
    if isinstance(state, Tensor):
        return state.device
    if isinstance(state, KVCache) and state.key is not None:
        return state.key.device
    values = state.values() if isinstance(state, dict) else state if isinstance(state, list | tuple) else ()
    for v in values:
        d = _device_of(v)
        if d.type != "cpu":
            return d
    return torch.device("cpu")


def beam_search(model: Decodable, *inputs: Any, beam: int = 5, max_len: int = 100,
                length_penalty: float = 0.6, **options: Any) -> list[Hypothesis]:
    """Beam search with a model: ``model.encode(*inputs)`` once, then ``model.decode_step`` per token.

    ``inputs`` are the model's encoder inputs, batch first (translation: ``src (B, S), src_mask (B, S)``;
    captioning: ``images (B, C, H, W)``); ``options`` are :func:`search`'s. The model's ``reorder_state`` and
    ``feed_tokens`` are used when it has them.

    Example:
        >>> from qkv.models import create
        >>> model = create("bahdanau", src_vocab=20, tgt_vocab=20, embed_dim=8, hidden_dim=8, attn_dim=8).eval()
        >>> src = torch.randint(4, 20, (2, 5)); mask = torch.ones(2, 5, dtype=torch.bool)
        >>> best = beam_search(model, src, mask, beam=3, max_len=6, no_repeat_ngram_size=2)
        >>> len(best), best[0].attention.shape[1]       # one Hypothesis per input, rows over S = 5
        (2, 5)
    """
    if not inputs or not isinstance(inputs[0], Tensor):
        raise ValueError("beam_search needs the model's encoder inputs, the first a batch-first tensor")
    options.setdefault("reorder", getattr(model, "reorder_state", reorder_state))
    if getattr(model, "feed_tokens", None) is not None:
        options.setdefault("feed", model.feed_tokens)
    options.setdefault("device", inputs[0].device)
    with torch.no_grad():
        state = model.encode(*inputs)
    return search(model.decode_step, state, inputs[0].shape[0], beam=beam, max_len=max_len,
                  length_penalty=length_penalty, **options)


def greedy_decode(model: Decodable, *inputs: Any, max_len: int = 100, **options: Any) -> list[Hypothesis]:
    """The most likely token at every step (:func:`beam_search` with ``beam=1``)."""
    return beam_search(model, *inputs, beam=1, max_len=max_len, **options)
