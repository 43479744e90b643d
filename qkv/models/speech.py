"""Speech recognisers on log-mel features: Listen, Attend and Spell (with a CTC head for the hybrid) and CTC alone.

- :class:`Listener`: the encoder that shortens time by ``reduction`` (4 or 8): a pyramidal BiLSTM (Chan et al.,
  2016, "Listen, Attend and Spell", https://arxiv.org/abs/1508.01211: each pyramid layer joins two neighbouring
  frames) or strided 1-D convolutions followed by BiLSTMs.
- :class:`LAS`: a character speller, ``s_i = LSTM(s_{i-1}, [y_{i-1}, c_{i-1}])``, ``c_i = Attend(s_i, h)``,
  ``P(y_i) = softmax(W [s_i, c_i])``. The attention's score is content-only (``additive``, Bahdanau's) or
  ``location`` (:class:`qkv.LocationAware`, Chorowski et al., 2015, https://arxiv.org/abs/1506.07503: the previous
  step's weights, convolved, feed the score), with sharpening ``beta`` (a factor on the scores) and optional
  smoothing (``normalize="smooth"``). With ``ctc=True`` a linear CTC head on the listener gives the hybrid
  CTC/attention model (Watanabe et al., 2017, https://arxiv.org/abs/1609.06773): the task weighs the two losses,
  and decoding adds CTC prefix scores (:class:`qkv.models.ctc.CTCPrefixScorer`) to the beam. At decoding time the
  attention can be *windowed* (Chorowski et al., 2015, section 2.3): a decoding state with ``"window": (left, right)``
  lets step ``i`` attend only to the frames ``[m - left, m + right]`` around the median ``m`` of step ``i - 1``'s
  weights (:func:`attention_window`), so that the alignment cannot jump back or far ahead (it is not used in
  training here, only when decoding; the paper also trained with it).
- :class:`CTCModel`: the listener and a CTC head, no attention (the baseline).

Axis letters: ``B`` utterances, ``F`` feature frames, ``M`` mel channels, ``S = F / reduction`` listener frames,
``T`` characters, ``V`` the vocabulary (CTC's blank is the padding id 0). Every model implements the one decoder's
protocol (:mod:`qkv.models.decoding`): ``encode(features, lengths)`` and, for the attention models,
``decode_step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..data.tokenize import PAD_ID
from ..functional import attention
from ..location import LocationAware
from ..scores import create_score
from .decoding import teacher_forced

__all__ = ["Listener", "LAS", "CTCModel", "SpeechOutput", "SpellerAttention", "frames_mask", "attention_median",
           "attention_window", "SPEECH_MODELS"]


@dataclass
class SpeechOutput:
    """A teacher-forced pass: ``logits (B, T, V)`` and ``attention (B, T, S)`` (None for CTC alone),
    ``ctc_logits (B, S, V)`` (None without a CTC head) and the listener's ``lengths (B,)``."""

    logits: Tensor | None
    attention: Tensor | None
    ctc_logits: Tensor | None
    lengths: Tensor


def frames_mask(lengths: Tensor, frames: int) -> Tensor:
    """``(B, frames)`` bool, True at the frames before each length."""
    return torch.arange(frames, device=lengths.device) < lengths[:, None]


def attention_median(weights: Tensor) -> Tensor:
    """``(B,)`` long: the median frame of each row of ``weights (B, S)``, the first frame where the cumulative
    weight reaches one half."""
    below = weights.float().cumsum(-1) < 0.5
    return below.sum(-1).clamp(max=weights.shape[-1] - 1)


def attention_window(previous: Tensor, left: int, right: int) -> Tensor:
    """``(B, S)`` bool: the frames ``[m - left, m + right]`` around the median ``m`` of the previous weights
    ``(B, S)`` (Chorowski et al.'s windowing; ``m`` itself is always inside)."""
    if left < 0 or right < 0:
        raise ValueError(f"the attention window needs left and right >= 0, got {left} and {right}")
    m = attention_median(previous)[:, None]
    j = torch.arange(previous.shape[-1], device=previous.device)[None, :]
    return (j >= m - left) & (j <= m + right)


class _BiLSTM(nn.Module):
    """A bidirectional LSTM layer over padded sequences (packed, so that padding never enters the backward pass)."""

    def __init__(self, input_dim: int, hidden_dim: int):
        super().__init__()
        self.rnn = nn.LSTM(input_dim, hidden_dim, batch_first=True, bidirectional=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


class Listener(nn.Module):
    """The encoder: ``features (B, F, M)`` -> ``(B, S, 2 * hidden_dim)``, ``S = ceil(F / reduction)`` roughly.

    Args:
        n_mels: ``M``.  hidden_dim: LSTM size per direction.  num_layers: BiLSTM layers (a pyramid has
            ``1 + log2(reduction)`` at least: one on the frames, then one per halving).
        kind: ``pyramid`` (pBLSTM) or ``conv`` (``log2(reduction)`` strided convolutions, then the BiLSTMs).
        reduction: 4 or 8 (any power of two >= 1).  dropout: between layers.
    """

    def __init__(self, n_mels: int, hidden_dim: int = 128, num_layers: int = 3, *, kind: str = "pyramid",
                 reduction: int = 4, dropout: float = 0.1):
        super().__init__()
        if kind not in ("pyramid", "conv"):
            raise ValueError(f"listener kind must be 'pyramid' or 'conv', got {kind!r}")
        if reduction < 1 or reduction & (reduction - 1):
            raise ValueError(f"reduction must be a power of two, got {reduction}")
        halvings = int(math.log2(reduction))
        if kind == "pyramid" and num_layers < 1 + halvings:
            raise ValueError(f"a pyramid listener with reduction {reduction} needs at least {1 + halvings} layers, "
                             f"got num_layers={num_layers}")
        self.kind, self.reduction, self.halvings = kind, reduction, halvings
        self.out_dim = 2 * hidden_dim
        self.dropout = nn.Dropout(dropout)
        if kind == "conv":
            chans = [n_mels] + [hidden_dim] * halvings
            self.convs = nn.ModuleList(nn.Conv1d(chans[i], chans[i + 1], 5, stride=2, padding=2)
                                       for i in range(halvings))
            first = chans[-1]
            self.layers = nn.ModuleList(_BiLSTM(first if i == 0 else self.out_dim, hidden_dim)
                                        for i in range(num_layers))
        else:
            self.convs = nn.ModuleList()
            # layer 0 reads the frames; the last `halvings` layers read two frames joined
            dims = [n_mels] + [self.out_dim * (2 if i >= num_layers - halvings else 1) for i in range(1, num_layers)]
            self.layers = nn.ModuleList(_BiLSTM(dims[i], hidden_dim) for i in range(num_layers))

    def out_lengths(self, lengths: Tensor) -> Tensor:
        """The listener's frames for inputs of ``lengths`` frames."""
        for _ in range(self.halvings):
            lengths = (lengths + 1) // 2 if self.kind == "conv" else lengths // 2
        return lengths.clamp(min=1)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """``(B, F, M)``, ``(B,)`` -> ``(B, S, 2 * hidden_dim)``, ``(B,)``."""
        x = features
        if self.kind == "conv":
            x = x.transpose(1, 2)
            for conv in self.convs:  # padding zeroed first: a frame near the end reads no padding
                x = F.gelu(conv(x * frames_mask(lengths, x.shape[-1])[:, None]))
                lengths = (lengths + 1) // 2
            x = x.transpose(1, 2)
        num = len(self.layers)
        for i, layer in enumerate(self.layers):
            if self.kind == "pyramid" and i >= num - self.halvings:
                b, s, d = x.shape
                x = x[:, : s // 2 * 2].reshape(b, s // 2, 2 * d)  # join frames 2j and 2j + 1
                lengths = lengths // 2
            x = self.dropout(layer(x, lengths.clamp(min=1)))
        lengths = lengths.clamp(min=1, max=x.shape[1])
        return x * frames_mask(lengths, x.shape[1])[..., None], lengths


class SpellerAttention(nn.Module):
    """The speller's attention over the listener's frames: :func:`qkv.attention` with a content or location-aware
    score, sharpening ``beta`` (``scale``) and ``normalize`` (``softmax``, or ``smooth``)."""

    attention_kind = "cross"

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, *, score: str = "location",
                 filters: int = 10, kernel_size: int = 31, beta: float = 1.0, normalize: str = "softmax"):
        super().__init__()
        if score not in ("content", "location"):
            raise ValueError(f"score must be 'content' or 'location', got {score!r}")
        self.kind, self.beta, self.normalize = score, beta, normalize
        self.score = LocationAware(query_dim, key_dim, hidden_dim, filters=filters, kernel_size=kernel_size) \
            if score == "location" else create_score("additive", query_dim, key_dim, hidden_dim)

    def prepare_key(self, memory: Tensor) -> Tensor:
        return self.score.prepare_key(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor, previous: Tensor) -> tuple[Tensor,
                                                                                                         Tensor]:
        """``query (B, Dq)``, prepared ``keys (B, S, H)``, ``memory (B, S, D)``, ``mask (B, S)``, the previous
        weights ``(B, S)`` -> context ``(B, D)`` and weights ``(B, S)``."""
        score = self.score.given(previous) if self.kind == "location" else self.score
        context, weights = attention(query[:, None], keys, memory, score=score, key_prepared=True,
                                     mask=mask[:, None], scale=self.beta, normalize=self.normalize,
                                     return_weights=True)
        return context[:, 0], weights[:, 0]


class LAS(nn.Module):
    """Listen, Attend and Spell (module docstring), optionally with a CTC head (``ctc=True``: the hybrid)."""

    def __init__(self, vocab_size: int, n_mels: int, *, hidden_dim: int = 128, num_layers: int = 3,
                 listener: str = "pyramid", reduction: int = 4, embed_dim: int = 64, decoder_dim: int = 256,
                 attn_dim: int = 128, score: str = "location", filters: int = 10, kernel_size: int = 31,
                 beta: float = 1.0, smoothing: bool = False, ctc: bool = False, dropout: float = 0.1):
        super().__init__()
        self.listener = Listener(n_mels, hidden_dim, num_layers, kind=listener, reduction=reduction,
                                 dropout=dropout)
        d = self.listener.out_dim
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD_ID)
        self.cell = nn.LSTMCell(embed_dim + d, decoder_dim)
        self.attend = SpellerAttention(decoder_dim, d, attn_dim, score=score, filters=filters,
                                       kernel_size=kernel_size, beta=beta,
                                       normalize="smooth" if smoothing else "softmax")
        self.hidden = nn.Linear(decoder_dim + d, decoder_dim)
        self.out = nn.Linear(decoder_dim, vocab_size)
        self.ctc_head = nn.Linear(d, vocab_size) if ctc else None
        self.dropout = nn.Dropout(dropout)
        self.decoder_dim = decoder_dim

    def encode(self, features: Tensor, lengths: Tensor) -> dict:
        """The decoding state of ``B`` utterances: the listener's frames, their prepared keys and mask, the
        speller's LSTM state, the last context and the last weights (all on the first frame at the start), and the
        CTC log-probabilities (with a CTC head)."""
        memory, out_lengths = self.listener(features, lengths)
        b, s, d = memory.shape
        previous = memory.new_zeros(b, s)
        previous[:, 0] = 1.0
        zeros = memory.new_zeros(b, self.decoder_dim)
        state = {"memory": memory, "keys": self.attend.prepare_key(memory), "mask": frames_mask(out_lengths, s),
                 "lengths": out_lengths, "h": zeros, "c": zeros, "context": memory.new_zeros(b, d),
                 "previous": previous}
        if self.ctc_head is not None:
            state["ctc_log_probs"] = torch.log_softmax(self.ctc_head(memory).float(), -1)
        return state

    def decode_step(self, tokens: Tensor, state: dict) -> tuple[Tensor, Tensor, dict]:
        """One character of every row: ``tokens (N,)`` -> logits ``(N, V)``, weights ``(N, S)``, the new state
        (windowed when the state holds ``"window": (left, right)``, see the module docstring)."""
        x = torch.cat([self.dropout(self.embed(tokens)), state["context"]], -1)
        h, c = self.cell(x, (state["h"], state["c"]))
        mask = state["mask"]
        if state.get("window") is not None:  # decoding only: frames around the previous median
            mask = mask & attention_window(state["previous"], *state["window"])
        context, weights = self.attend(h, state["keys"], state["memory"], mask, state["previous"])
        logits = self.out(self.dropout(torch.tanh(self.hidden(torch.cat([h, context], -1)))))
        return logits, weights, {**state, "h": h, "c": c, "context": context, "previous": weights}

    def forward(self, features: Tensor, lengths: Tensor, tgt_in: Tensor) -> SpeechOutput:
        """Teacher forcing: ``features (B, F, M)``, ``lengths (B,)``, ``tgt_in (B, T)`` (``<bos>`` first)."""
        (logits, weights), state = teacher_forced(self.decode_step, tgt_in, self.encode(features, lengths))
        ctc = self.ctc_head(state["memory"]) if self.ctc_head is not None else None
        return SpeechOutput(logits, weights, ctc, state["lengths"])


class CTCModel(nn.Module):
    """The listener and a linear CTC head (no attention): ``P(y | x)`` summed over the alignments."""

    def __init__(self, vocab_size: int, n_mels: int, *, hidden_dim: int = 128, num_layers: int = 3,
                 listener: str = "pyramid", reduction: int = 4, dropout: float = 0.1):
        super().__init__()
        self.listener = Listener(n_mels, hidden_dim, num_layers, kind=listener, reduction=reduction,
                                 dropout=dropout)
        self.ctc_head = nn.Linear(self.listener.out_dim, vocab_size)

    def encode(self, features: Tensor, lengths: Tensor) -> dict:
        memory, out_lengths = self.listener(features, lengths)
        return {"memory": memory, "lengths": out_lengths,
                "ctc_log_probs": torch.log_softmax(self.ctc_head(memory).float(), -1)}

    def forward(self, features: Tensor, lengths: Tensor, tgt_in: Tensor | None = None) -> SpeechOutput:
        memory, out_lengths = self.listener(features, lengths)
        return SpeechOutput(None, None, self.ctc_head(memory), out_lengths)


#: registry names of the speech models built here (``speech-transformer`` is in :mod:`.speech_transformer`)
SPEECH_MODELS = {"speech-las": LAS, "speech-ctc": CTCModel}
