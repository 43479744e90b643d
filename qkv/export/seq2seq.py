"""Translation and captioning as two graphs: the encoder, and one decoder step with the keys and values of every
decoder layer's self-attention as inputs (the past, ``T`` positions; ``T = 0`` at the first step) and outputs
(``T + 1``).

``encoder``: ``src (B, S)`` int64, ``src_mask (B, S)`` bool -> ``memory (B, S, E)``.
``decoder_step``: ``tokens (N,)``, ``memory (N, S, E)``, ``src_mask (N, S)``, ``past_key_i``/``past_value_i``
``(N, G, T, D)`` per layer -> ``logits (N, V)``, ``attention (N, S)`` (the last layer's cross-attention averaged over
heads, as qkv's decoder reports it), ``key_i``/``value_i`` ``(N, G, T + 1, D)``. The cross-attention's keys and
values are computed from ``memory`` in every step. Captioning's are the same without ``src_mask``, its encoder
``pixels (B, C, S, S)`` float in [0, 1] -> ``memory (B, L, E)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..layers import KVCache

__all__ = ["TransformerEncoder", "TransformerStep", "CaptionEncoder", "CaptionStep", "decoder_graphs", "sources",
           "longest"]


def longest(model: nn.Module) -> int:
    """The longest source or target the model reads (its table of positions; ALiBi and relative biases have none,
    and the graphs take up to 2**20 positions then)."""
    return model.cfg.max_len if model.cfg.positions in ("sinusoidal", "learned") else 1 << 20


class TransformerEncoder(nn.Module):
    inputs = ("src", "src_mask")
    outputs = ("memory",)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        source = ("source", None, longest(model))
        self.dynamic = ({0: "batch", 1: source}, {0: "batch", 1: source})

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.model.encode(src, src_mask)["memory"]


class TransformerStep(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        layers = len(model.decoder)
        self.inputs = ("tokens", "memory", "src_mask",
                       *(f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")))
        self.outputs = ("logits", "attention", *(f"{kv}_{i}" for i in range(layers) for kv in ("key", "value")))
        past = {0: "batch", 2: ("past", None, longest(model) - 1)}
        source = ("source", None, longest(model))
        self.dynamic = ({0: "batch"}, {0: "batch", 1: source}, {0: "batch", 1: source},
                        *(past for _ in range(2 * layers)))

    def forward(self, tokens: Tensor, memory: Tensor, src_mask: Tensor, *past: Tensor):
        return _step(self.model, tokens, {"memory": memory, "src_mask": src_mask}, past)


def _step(model: nn.Module, tokens: Tensor, state: dict[str, Any], past: tuple[Tensor, ...]):
    caches = [KVCache(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
    state = {**state, "self_cache": caches, "cross_cache": [KVCache(static=True) for _ in caches]}
    logits, attention, state = model.decode_step(tokens, state)
    return (logits.float(), attention.float(), *(t for c in state["self_cache"] for t in (c.key, c.value)))


class CaptionEncoder(nn.Module):
    """``pixels (B, C, S, S)`` float in [0, 1] at the trained size -> ``memory (B, L, E)`` (``L`` grid cells)."""

    inputs = ("pixels",)
    outputs = ("memory",)
    dynamic = ({0: "batch"},)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels: Tensor) -> Tensor:
        return self.model.encode(pixels)["memory"]


class CaptionStep(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        layers = len(model.layers)
        self.inputs = ("tokens", "memory", *(f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")))
        self.outputs = ("logits", "attention", *(f"{kv}_{i}" for i in range(layers) for kv in ("key", "value")))
        past = {0: "batch", 2: ("past", None, model.positions.max_len - 1)}
        self.dynamic = ({0: "batch"}, {0: "batch"}, *(past for _ in range(2 * layers)))

    def forward(self, tokens: Tensor, memory: Tensor, *past: Tensor):
        return _step(self.model, tokens, {"memory": memory}, past)


def decoder_graphs(model, encoder, step, encoder_inputs, step_state, layers_of, max_len, extra):
    """``encoder`` and ``decoder_step`` of a Transformer decoder over a key/value cache: the step's example is a
    past of two positions the model made itself; the manifest gets the cache's shape and the special token ids."""
    from ..data.tokenize import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    with torch.no_grad():
        state = model.encode(*encoder_inputs)
        for token in (1, 5):  # a past of two positions, made by the model itself
            _, _, state = model.decode_step(torch.full((2,), token), state)
    past = tuple(t for c in state["self_cache"] for t in (c.key, c.value))
    tokens = torch.full((2,), 6)
    shapes = {"layers": layers_of, "kv_heads": past[0].shape[1], "head_dim": past[0].shape[-1], "max_len": max_len,
              "bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "unk_id": UNK_ID, **extra}
    return {"encoder": (encoder, encoder_inputs, {}),
            "decoder_step": (step, (tokens, *(state[k] for k in step_state), *past), shapes)}


def sources(vocab: int, length: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Two example sources of ``length`` token ids (the second two shorter, padded) and their mask."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, max(vocab, 5), (2, length), generator=gen)
    src_mask = torch.ones(2, length, dtype=torch.bool)
    src_mask[1, length - 2:] = False
    src[1, length - 2:] = 0
    return src, src_mask
