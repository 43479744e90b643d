"""Image captioning models: a CNN feature grid and a word-by-word decoder that looks at it (Show, Attend and Tell).

Paper: Xu et al., 2015, "Show, Attend and Tell: Neural Image Caption Generation with Visual Attention"
(https://arxiv.org/abs/1502.03044). Axis letters: ``B`` batch, ``T`` caption positions, ``L = h * w`` grid
positions, ``D`` feature channels, ``H`` decoder state, ``E`` word embedding, ``V`` vocabulary.

- :class:`GridEncoder`: a small conv stack (stride 8) from ``(B, C, H, W)`` to the annotation vectors
  ``a (B, L, D)``, trained end to end. Differs from the paper (a frozen VGG on 224x224 images): small images,
  optionally (``coords=True``, the models' default for old configurations; ``qkv train caption`` now builds
  ``coords=False``) two coordinate channels appended to the input (CoordConv, Liu et al., 2018). Without them
  the features are (nearly) translation-equivariant: an item looks the same in every cell, which is what lets
  the decoder name an item at a place it never saw it in training.
- ``where=True`` (soft/hard): the decoder is also told *where* it looked, apart from *what* it saw: the expected
  location ``loc_t = sum_l alpha_tl (y_l, x_l)`` in [-1, 1] (the sampled cell's for hard attention in training),
  an input of the LSTM (``[E y_{t-1}, z_t, loc_t]``) and of the deep output (``+ L_loc loc_t``). Computed by the
  same attention call, the grid coordinates riding along as two more value channels.
- ``deep_output="context"`` (soft/hard): the item words (``content_ids``) are predicted from
  ``L_o(E y_{t-1} + L_z z_t)`` alone, without the decoder state or the location (Xu et al.'s deep output minus
  ``L_h h_t``), so no "item k never at cell c" prior can reach them; the other words keep the full output.
- ``padding="circular"`` (every model): the encoder is exactly equivariant to circular shifts by whole grid cells,
  so nothing in the features tells one cell from another.
- ``keys`` (soft/hard): ``"features"`` (the paper: ``score(h, a_l)``), ``"both"`` (``score(h, a_l + P(y_l, x_l))``,
  ``P`` a small MLP) or ``"positions"`` (``score(h, P(y_l, x_l)) + s(a_l)``, ``s`` an MLP salience of the features
  alone, an additive bias of the scores): with the last, where the decoder looks next cannot depend on which item
  stands where. ``init_state="learned"``: ``h_0, c_0`` learned instead of computed from the mean annotation.
- ``deep_output="grounded"`` (soft/hard, ``where=True``): the item words from ``L_o(E y_{t-1} + L_z z_t)``; the LSTM
  input is ``[E' y_{t-1}, loc_t, found_t]`` (``E'``: one shared embedding for every item word; ``found_t = sum_l
  alpha_tl s(a_l)``, the attended salience) and every other word comes from ``L_o(E' y_{t-1} + L_loc loc_t +
  L_h h_t)``: neither the state nor the position words know which item was seen or named.
- ``glimpse_features`` (with ``glimpse``): what the window reads. ``"grid"``: the annotations ``a``, which see 54
  pixels, so the features beside an item name it as well as the item's own and the attention may settle beside
  it. ``"local"``: the CNN's third stage at the grid's stride (22 pixels seen, less than an item of the scenes),
  through a per-place ``ReLU(Linear)`` to ``D``: an item word is right only with the window on the item.
  ``"mid"``: the first convolution after it (38 pixels seen, about an item), through the same kind of layer.
- ``naming`` (with ``glimpse``): in training, each step's word is also read from the third stage's features (22
  pixels seen) through the same window (``CaptionOutput.naming``), and the task adds that reading's cross-entropy
  at the item words, weighted: features that see less than an item name it only with the window on it, so the
  term draws the attention onto the items, whatever the glimpse reads for the caption itself (a place 20 px beside
  an item, whose grid or ``mid`` features name it as well, names nothing here).
- :class:`SoftCaptioner` (``caption-soft``): LSTM decoder, ``alpha_t = softmax(score(h_{t-1}, a))`` through
  :func:`qkv.functional.attention` with any qkv score (the paper's is ``additive``), the gate
  ``beta_t = sigmoid(f_beta(h_{t-1}))`` on the context ``z_t = beta_t sum_i alpha_ti a_i``, initial ``h_0, c_0``
  from the mean annotation, the deep output ``L_o(E y_{t-1} + L_h h_t + L_z z_t)`` and dropout. The doubly
  stochastic penalty is :func:`doubly_stochastic_penalty` (the task adds it to the loss).
- :class:`HardCaptioner` (``caption-hard``): the same decoder, with ``z_t = a_{s_t}``, ``s_t ~ alpha_t`` sampled in
  training (the REINFORCE terms are :func:`reinforce_loss`); in evaluation the expectation (``z_t`` of the soft
  model, no gate) or the argmax location, as ``test_attention`` says. As in the paper, a share of the captions
  (``expected_share``, 0.5) trains on the expected context instead of a sample (no REINFORCE term for them).
- :class:`FixedCaptioner` (``caption-fixed``): the "distracted" baseline: the mean annotation (a learned
  projection of it) at every step, no attention; its attention is reported as uniform, which is what a mean is.
- :class:`TransformerCaptioner` (``caption-transformer``): pre-norm Transformer decoder layers, causal
  self-attention and cross-attention to the grid (:class:`~qkv.layers.TransformerLayer`).

Every model: ``forward(images, tgt_in) -> CaptionOutput``; ``encode(images)`` and
``decode_step(y_prev, state) -> (logits (B, V), attention (B, L), state)``, the
:class:`~qkv.models.decoding.Decodable` protocol: ``beam_search(model, images, ...)`` decodes with the one decoder,
the attention rows being the maps over the ``L`` grid cells. The module is split in three, a tree of imports:
:mod:`~qkv.models.caption_base` (:class:`CaptionOutput`), :mod:`~qkv.models.caption_encoder` (:class:`GridEncoder`)
and :mod:`~qkv.models.caption_transformer`, all re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import attention
from ..layers import Attention
from .caption_base import CaptionLosses, CaptionOutput, doubly_stochastic_penalty, reinforce_loss, rows_of
from .caption_encoder import GridEncoder, grid_coords
from .caption_transformer import TransformerCaptioner

__all__ = ["CAPTION_MODELS", "CaptionOutput", "GridEncoder", "SoftCaptioner", "HardCaptioner", "FixedCaptioner",
           "TransformerCaptioner", "doubly_stochastic_penalty", "reinforce_loss", "grid_coords"]


KEYS = ("features", "both", "positions")
#: what the glimpse reads: the grid features (54 px seen), the third stage (22 px) or the conv after it (38 px)
GLIMPSE_FEATURES = ("grid", "local", "mid")


class _Window(nn.Module):
    """The glimpse: ``softmax_l(s_l - |loc - p_l|^2 / (2 sigma^2))``-weighted features, one location per row."""

    def forward(self, loc: Tensor, coords: Tensor, a: Tensor, salience: Tensor, log_sigma: Tensor
                ) -> tuple[Tensor, Tensor]:
        """``loc (B, 2)``, ``coords (B, L, 2)``, ``a (B, L, D)``, ``salience (B, 1, L)`` -> ``(z (B, D), w (B, L))``."""
        def score(q, k):
            return -((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1) / (2 * torch.exp(2 * log_sigma))

        z, w = attention(loc[:, None], coords, a, score=score, mask=salience, return_weights=True)
        return z[:, 0], w[:, 0]


class _LSTMCaptioner(CaptionLosses, nn.Module):
    """What the three LSTM captioners share: encoder, embedding, LSTM cell, initial state, deep output.

    Args (keyword): in_channels, widths, coords, padding: the :class:`GridEncoder`'s.  embed_dim, hidden_dim: word
        embedding and LSTM sizes.  attn_dim, score: the attention's score (any qkv score name).  dropout.
        where, deep_output, content_ids (the item words' token ids), keys, init_state: see the module docstring.
    """

    looks = True  #: whether the model attends (False: the fixed-context baseline)

    def __init__(self, vocab_size: int, *, in_channels: int = 1, widths: Sequence[int] = (16, 32, 64, 128),
                 embed_dim: int = 64, hidden_dim: int = 128, attn_dim: int = 128, score: str = "additive",
                 dropout: float = 0.3, coords: bool = True, where: bool = False, deep_output: str = "full",
                 content_ids: Sequence[int] = (), padding: str = "zeros", keys: str = "features",
                 init_state: str = "mean", glimpse: bool = False, salience: str = "features",
                 glimpse_features: str = "grid", naming: bool = False):
        super().__init__()
        if vocab_size < 4 or embed_dim < 1 or hidden_dim < 1 or attn_dim < 1:
            raise ValueError(f"vocab_size (>= 4), embed_dim, hidden_dim and attn_dim must be positive, got "
                             f"{vocab_size}, {embed_dim}, {hidden_dim}, {attn_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if deep_output not in ("full", "context", "grounded"):
            raise ValueError(f"deep_output must be 'full', 'context' or 'grounded', got {deep_output!r}")
        if deep_output == "grounded" and not where:
            raise ValueError("deep_output='grounded' needs where=True (the position words come from the location)")
        content_ids = [int(i) for i in content_ids]
        if deep_output != "full" and not content_ids:
            raise ValueError(f"deep_output={deep_output!r} needs content_ids (the token ids of the item words)")
        if any(not 0 <= i < vocab_size for i in content_ids):
            raise ValueError(f"content_ids must be token ids in [0, {vocab_size}), got {content_ids}")
        if keys not in KEYS:
            raise ValueError(f"keys must be one of {', '.join(KEYS)}, got {keys!r}")
        if glimpse and deep_output != "grounded":
            raise ValueError("glimpse=True needs deep_output='grounded' (it is what the item words read)")
        if glimpse_features not in GLIMPSE_FEATURES:
            raise ValueError(f"glimpse_features must be one of {', '.join(GLIMPSE_FEATURES)}, got "
                             f"{glimpse_features!r}")
        if glimpse_features != "grid" and not glimpse:
            raise ValueError(f"glimpse_features={glimpse_features!r} needs glimpse=True (it is what the glimpse reads)")
        if naming and not glimpse:
            raise ValueError("naming=True needs glimpse=True (the item words are read again through its window)")
        if salience not in ("features", "local"):
            raise ValueError(f"salience must be 'features' or 'local', got {salience!r}")
        if init_state not in ("mean", "learned"):
            raise ValueError(f"init_state must be 'mean' or 'learned', got {init_state!r}")
        if (where or keys != "features") and not self.looks:
            raise ValueError(f"where=True and keys={keys!r} need a model that attends")
        self.encoder = GridEncoder(in_channels, widths, coords=coords, padding=padding)
        d = self.encoder.dim
        self.where, self.deep_output, self.hidden_dim = where, deep_output, hidden_dim
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.init_state = init_state
        if init_state == "mean":  # h_0, c_0 from the mean annotation (the paper)
            self.init_h, self.init_c = nn.Linear(d, hidden_dim), nn.Linear(d, hidden_dim)
        else:  # learned h_0, c_0: the decoder knows nothing of the image before it looks
            self.h0, self.c0 = nn.Parameter(torch.zeros(hidden_dim)), nn.Parameter(torch.zeros(hidden_dim))
        grounded = deep_output == "grounded"
        # grounded: the LSTM gets the location and whether something was found there, not the context z
        self.cell = nn.LSTMCell(embed_dim + (1 if grounded else d) + (2 if where else 0), hidden_dim)
        if grounded:  # the one embedding the LSTM sees for every item word
            self.item_embed = nn.Parameter(torch.randn(embed_dim) * 0.1)
        self.glimpse = glimpse
        if glimpse:  # log of the Gaussian window's width, in grid coordinates ([-1, 1] across the grid)
            self.log_sigma = nn.Parameter(torch.tensor(-1.2))
            self.window = _Window()  # its own module: qkv.capture_attention records the glimpse apart from alpha
        self.glimpse_features = glimpse_features
        if glimpse_features != "grid":  # the third stage (22 px seen) or the next conv (38 px), per place to D
            self.read = nn.Sequential(nn.Linear(tuple(widths)[2 if glimpse_features == "local" else 3], d), nn.ReLU())
        self.naming = naming
        if naming:  # the second reading (training only): the third stage per place, the window, the vocabulary
            self.name_read = nn.Sequential(nn.Linear(tuple(widths)[2], d), nn.ReLU())
            self.name_out = nn.Linear(d, vocab_size)
        self.out_h, self.out_z = nn.Linear(hidden_dim, embed_dim), nn.Linear(d, embed_dim, bias=False)
        if where:
            self.out_loc = nn.Linear(2, embed_dim, bias=False)
        content = torch.zeros(vocab_size, dtype=torch.bool)
        content[content_ids] = True
        self.register_buffer("content", content, persistent=False)
        self.out = nn.Linear(embed_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)
        if self.looks:
            self.attend = Attention(score, query_dim=hidden_dim, key_dim=d, hidden_dim=attn_dim)
        self.keys = keys
        self.salience_from = salience  # "local": from what each position holds itself (second-stage features)
        if keys != "features":  # an embedding of each grid position's (y, x), for the keys only
            self.key_pos = nn.Sequential(nn.Linear(2, d), nn.ReLU(), nn.Linear(d, d))
        if keys == "positions" or grounded:  # what is worth looking at, from the features alone (no query or place)
            d_in = tuple(widths)[1] if salience == "local" else d
            self.salience = nn.Sequential(nn.Linear(d_in, attn_dim), nn.ReLU(), nn.Linear(attn_dim, 1))

    def encode(self, images: Tensor) -> dict:
        """The decoding state of ``images (B, C, H, W)``: annotations, prepared keys, ``h``, ``c``."""
        local_salience, read_items = self.salience_from == "local", self.glimpse_features != "grid"
        naming = self.naming and self.training
        with_items = self.glimpse_features == "local" or naming
        a, grid, *taps = self.encoder(images, with_local=local_salience, with_items=with_items,
                                      with_mid=self.glimpse_features == "mid")
        mean = a.mean(dim=1)
        if self.init_state == "mean":
            h, c = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))
        else:
            h, c = torch.tanh(self.h0).expand(a.shape[0], -1), torch.tanh(self.c0).expand(a.shape[0], -1)
        state = {"a": a, "mean": mean, "h": h, "c": c,
                 "grid": grid, "coords": grid_coords(*grid, device=a.device, dtype=a.dtype).expand(a.shape[0], -1, -1)}
        if self.looks:
            keys = a if self.keys == "features" else self.key_pos(state["coords"])
            if self.keys == "both":
                keys = keys + a
            state["keys"] = self.attend.score.prepare_key(keys)
            if hasattr(self, "salience"):
                source = taps[0] if local_salience else a
                state["salience"] = self.salience(source).transpose(1, 2)  # (B, 1, L)
            # where=True: the grid coordinates ride along as two more value channels, so one attention gives
            # the context z and the expected location sum_l alpha_l (y_l, x_l)
            state["values"] = torch.cat([a, state["coords"]], -1) if self.where else a
            if read_items:  # what the glimpse reads: features that see less than an item
                state["items"] = self.read(taps[-1])
            if naming:  # the third stage, read again for the naming term
                state["naming"] = self.name_read(taps[1 if local_salience else 0])
        return state

    def _look(self, state: dict) -> tuple[Tensor, Tensor, Tensor]:
        """``(soft context (B, D), alpha (B, L), expected location (B, 2) (y, x) in [-1, 1])`` from ``h_{t-1}``
        (the location is zeros when ``where`` is off)."""
        z, w = attention(state["h"][:, None], state["keys"], state["values"], score=self.attend.score,
                         mask=state["salience"] if self.keys == "positions" else None,  # an additive bias
                         return_weights=True, key_prepared=True)
        z, d = z[:, 0], state["a"].shape[-1]
        loc = z[:, d:] if self.where else z.new_zeros(z.shape[0], 2)
        return z[:, :d], w[:, 0], loc

    def context(self, state: dict) -> tuple[Tensor, Tensor, Tensor, dict]:
        """``(z (B, D), attention (B, L), location (B, 2), extras)`` of one step; ``extras`` hold
        ``beta``/``log_prob``/``entropy``."""
        raise NotImplementedError

    def step(self, y_prev: Tensor, state: dict) -> tuple[Tensor, Tensor, dict, dict]:
        """One word: ``(logits (B, V), attention (B, L), new state, extras)``; ``extras["loc"]`` is the location
        the word looked at (``where`` models)."""
        z, attn, loc, extras = self.context(state)
        e = self.dropout(self.embed(y_prev))
        if self.deep_output == "grounded":
            return self._grounded_step(y_prev, e, z, attn, loc, state, extras)
        inputs = [e, z, loc] if self.where else [e, z]
        h, c = self.cell(torch.cat(inputs, dim=-1), (state["h"], state["c"]))
        what = e + self.out_z(z)
        if self.where:
            what = what + self.out_loc(loc)
            extras = {**extras, "loc": loc}
        logits = self.out(self.dropout(what + self.out_h(self.dropout(h))))
        if self.deep_output == "context":  # item words from what was seen (e, z) only: no h, no location
            logits = torch.where(self.content, self.out(self.dropout(e + self.out_z(z))), logits)
        return logits, attn, {**state, "h": h, "c": c}, extras

    def _grounded_step(self, y_prev, e, z, attn, loc, state, extras):
        """``deep_output="grounded"``: item words from ``L_o(E y_{t-1} + L_z z_t)``; the LSTM and every other
        word see neither the context nor which item was named: inputs ``[E' y_{t-1}, loc_t, found_t]`` with
        ``E'`` one shared embedding for the item words and ``found_t = sum_l alpha_tl s(a_l)`` the attended
        salience; the other words from ``L_o(E' y_{t-1} + L_loc loc_t + L_h h_t)``. ``glimpse``: the item words
        read ``z_t = beta_t sum_l w_tl a_l``, ``w_t = softmax(s(a_l) - |p_l - loc_t|^2 / 2 sigma^2)``, a Gaussian
        window at the attended location (the same in every cell) instead of alpha's own weights; the step's
        attention map is then ``w_t``, the weights its item word was read with (alpha only places the window)."""
        e_state = torch.where(self.content[y_prev, None], self.dropout(self.item_embed), e)
        found = (attn * state["salience"][:, 0]).sum(-1, keepdim=True)
        h, c = self.cell(torch.cat([e_state, loc, found], dim=-1), (state["h"], state["c"]))
        if self.glimpse:  # the same window around the attended place in every cell, weighted by salience only
            z, attn = self.window(loc, state["coords"], state.get("items", state["a"]), state["salience"],
                                  self.log_sigma)
            z = z * extras.get("beta", z.new_ones(z.shape[0]))[:, None]
        rest = self.out(self.dropout(e_state + self.out_loc(loc) + self.out_h(self.dropout(h))))
        logits = torch.where(self.content, self.out(self.dropout(e + self.out_z(z))), rest)
        return logits, attn, {**state, "h": h, "c": c}, {**extras, "loc": loc}

    def decode_step(self, y_prev: Tensor, state: dict) -> tuple[Tensor, Tensor, dict]:
        logits, attn, state, _ = self.step(y_prev, state)
        return logits, attn, state

    def forward(self, images: Tensor, tgt_in: Tensor, owner: Tensor | None = None) -> CaptionOutput:
        """Teacher forcing: ``images (B, C, H, W)``, ``tgt_in (B, T)`` starting with BOS -> :class:`CaptionOutput`;
        ``owner (R,)``: the image of each row of ``tgt_in (R, T)`` (several captions of an image, encoded once)."""
        state = rows_of(self.encode(images), owner)
        logits, attns, extras = [], [], []
        for t in range(tgt_in.shape[1]):
            lg, attn, state, ex = self.step(tgt_in[:, t], state)
            logits.append(lg)
            attns.append(attn)
            extras.append(ex)
        stack = {k: torch.stack([ex[k] for ex in extras], dim=1) for k in (extras[0] if extras else {})}
        attention = torch.stack(attns, 1)
        naming = None
        if "naming" in state:  # the glimpse's own window over the third stage: names an item only when on it
            naming = self.name_out(torch.einsum("btl,bld->btd", attention, state["naming"]))
        return CaptionOutput(torch.stack(logits, 1), attention, stack.get("beta"), stack.get("log_prob"),
                             stack.get("entropy"), naming)


class SoftCaptioner(_LSTMCaptioner):
    """Deterministic soft attention with the gate ``beta`` (see the module docstring); ``options``: those of every
    LSTM captioner."""

    def __init__(self, vocab_size: int, **options: Any):
        super().__init__(vocab_size, **options)
        self.f_beta = nn.Linear(self.hidden_dim, 1)

    def auxiliary_loss(self, out, log_likelihood, mask, *, doubly_stochastic=0.0, **_):
        """Xu et al.'s doubly stochastic penalty, weighted by ``doubly_stochastic`` (none at 0)."""
        if not doubly_stochastic:
            return None, {}
        penalty = doubly_stochastic_penalty(out.attention.float(), mask)
        return doubly_stochastic * penalty, {"penalty": penalty.detach()}

    def context(self, state):
        z, alpha, loc = self._look(state)
        beta = torch.sigmoid(self.f_beta(state["h"]))  # (B, 1)
        return beta * z, alpha, loc, {"beta": beta[:, 0]}


class HardCaptioner(_LSTMCaptioner):
    """Stochastic hard attention: one sampled location per word in training (see the module docstring).

    ``test_attention``: ``"expectation"`` (the expected context) or ``"argmax"`` (the most likely location;
    its attention is then that one-hot map). It may be changed on a built model (``model.test_attention = ...``).
    """

    def __init__(self, vocab_size: int, *, test_attention: str = "expectation", expected_share: float = 0.5,
                 **options: Any):
        super().__init__(vocab_size, **options)
        if test_attention not in ("expectation", "argmax"):
            raise ValueError(f"test_attention must be 'expectation' or 'argmax', got {test_attention!r}")
        if not 0.0 <= expected_share <= 1.0:
            raise ValueError(f"expected_share must be in [0, 1], got {expected_share}")
        self.test_attention, self.expected_share = test_attention, expected_share
        # moving average of the captions' log-likelihood (REINFORCE baseline), kept in checkpoints
        self.register_buffer("baseline", torch.zeros(()))
        self.register_buffer("baseline_ready", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def update_baseline(self, log_likelihood: Tensor, decay: float = 0.9) -> None:
        """``b <- decay * b + (1 - decay) * mean(log_likelihood)`` (the first call sets ``b`` to the mean)."""
        mean = log_likelihood.float().mean()
        if not bool(self.baseline_ready):
            self.baseline.copy_(mean)
            self.baseline_ready.fill_(True)
        else:
            self.baseline.mul_(decay).add_((1 - decay) * mean)

    def auxiliary_loss(self, out, log_likelihood, mask, *, reward_weight=1.0, entropy_weight=0.0, baseline_decay=0.9,
                       **_):
        """The REINFORCE terms of a training batch (none outside training), against the moving-average baseline
        of the captions' log-likelihood, which is then updated with this batch (the first batch sets it)."""
        if out.sample_log_prob is None:
            return None, {}
        if not bool(self.baseline_ready):
            self.update_baseline(log_likelihood, baseline_decay)
        loss = reinforce_loss(log_likelihood, out.sample_log_prob.float(), out.entropy.float(), mask, self.baseline,
                              reward_weight=reward_weight, entropy_weight=entropy_weight)
        self.update_baseline(log_likelihood, baseline_decay)
        return loss, {}

    def context(self, state):
        z, alpha, loc = self._look(state)
        rows = torch.arange(alpha.shape[0], device=alpha.device)
        if self.training:
            s = torch.multinomial(alpha.detach().float(), 1)[:, 0]
            log_alpha = torch.log(alpha.clamp_min(torch.finfo(alpha.dtype).tiny))
            expect = state.get("expect")  # (B,) bool: captions trained on the expected context (Xu et al. 4.1)
            if expect is None:
                expect = torch.zeros(len(s), dtype=torch.bool, device=s.device)
            log_prob = torch.where(expect, torch.zeros_like(log_alpha[rows, s]), log_alpha[rows, s])
            extras = {"log_prob": log_prob, "entropy": -(alpha * log_alpha).sum(-1)}
            chosen = torch.where(expect[:, None], z, state["a"][rows, s])
            return chosen, alpha, torch.where(expect[:, None], loc, self._where_at(state, s, loc)), extras
        if self.test_attention == "argmax":
            s = alpha.argmax(-1)
            one_hot = torch.nn.functional.one_hot(s, alpha.shape[-1]).to(alpha.dtype)
            return state["a"][rows, s], one_hot, self._where_at(state, s, loc), {}
        return z, alpha, loc, {}

    def encode(self, images: Tensor) -> dict:
        state = super().encode(images)
        if self.training and self.expected_share > 0:  # per caption: the expected context instead of a sample
            state["expect"] = torch.rand(len(images), device=images.device) < self.expected_share
        return state

    def _where_at(self, state: dict, s: Tensor, loc: Tensor) -> Tensor:
        """The location of the chosen positions ``s (B,)`` (zeros ``loc`` when ``where`` is off)."""
        return state["coords"][torch.arange(s.shape[0], device=s.device), s] if self.where else loc


class FixedCaptioner(_LSTMCaptioner):
    """The fixed-context ("distracted") baseline: a projection of the mean annotation at every step."""

    looks = False

    def __init__(self, vocab_size: int, *, in_channels: int = 1, widths: Sequence[int] = (16, 32, 64, 128),
                 embed_dim: int = 64, hidden_dim: int = 128, dropout: float = 0.3, coords: bool = True,
                 padding: str = "zeros"):
        super().__init__(vocab_size, in_channels=in_channels, widths=widths, embed_dim=embed_dim,
                         hidden_dim=hidden_dim, dropout=dropout, coords=coords, padding=padding)
        d = self.encoder.dim
        self.project = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def context(self, state):
        a = state["a"]
        uniform = torch.full(a.shape[:2], 1.0 / a.shape[1], dtype=a.dtype, device=a.device)
        return self.project(state["mean"]), uniform, a.new_zeros(a.shape[0], 2), {}


#: model name -> constructor taking keyword arguments (registered in :mod:`qkv.models.registry`)
CAPTION_MODELS: dict[str, Callable[..., nn.Module]] = {
    "caption-soft": SoftCaptioner, "caption-hard": HardCaptioner, "caption-fixed": FixedCaptioner,
    "caption-transformer": TransformerCaptioner,
}
