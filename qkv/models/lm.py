"""A causal Transformer language model (GPT-style), built from :class:`qkv.layers.TransformerLayer`.

Paper: Radford et al., 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2): token embeddings plus
learned positions, a stack of pre-norm decoder layers with causal self-attention, a final LayerNorm and an output
projection tied to the token embeddings (Press & Wolf, 2017, https://arxiv.org/abs/1608.05859).

What differs here:

- Positions may also be sinusoidal, or ALiBi (Press et al., 2022, https://arxiv.org/abs/2108.12409): no position
  embedding but a causal linear bias on the scores (:func:`qkv.mods.alibi`), which lets the model read past
  ``max_len`` at inference.
- Any qkv score can replace the scaled dot product, and ``kv_heads`` gives grouped-query attention.
- Incremental decoding keeps a :class:`~qkv.layers.KVCache` per layer: :meth:`CausalLM.step` over a cache gives
  the logits that :meth:`CausalLM.forward` gives over the whole sequence.

Axis letters: ``B`` batch, ``T`` positions, ``V`` vocabulary, ``E`` model width (``dim``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..layers import KVCache, PositionalEncoding, TransformerLayer
from ..mods import alibi
from ..scores import score_names

__all__ = ["LMConfig", "CausalLM", "sample_next", "generate"]

#: position encodings of the language model
LM_POSITIONS = ("learned", "sinusoidal", "alibi")


@dataclass
class LMConfig:
    """Sizes and options of :class:`CausalLM` (defaults: a small model that trains on a CPU in minutes)."""

    vocab_size: int
    dim: int = 128  #: model width E
    num_heads: int = 4
    num_layers: int = 4
    ffn_dim: int | None = None  #: feed-forward width (default 4 E)
    kv_heads: int | None = None  #: key/value heads (grouped-query attention); default num_heads
    max_len: int = 256  #: the context: positions the model is trained on (learned/sinusoidal: the most it reads)
    positions: str = "learned"  #: learned, sinusoidal or alibi
    dropout: float = 0.1
    activation: str = "gelu"
    score: str = "scaled_dot"
    tie_weights: bool = True  #: the output projection is the token embedding
    pad_id: int = 0
    #: a backward model: it was trained on each text from its last token to its first (ULMFiT's second model); the
    #: model itself reads what it is given, and whoever feeds it text reverses it (the language-model task, its
    #: generation, a classifier initialised from it)
    reverse: bool = False

    def __post_init__(self):
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if self.positions not in LM_POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(LM_POSITIONS)}, got {self.positions!r}")
        if self.score not in score_names():
            raise ValueError(f"unknown score {self.score!r}; expected one of {score_names()}")
        if self.max_len < 1 or self.num_layers < 1:
            raise ValueError(f"max_len and num_layers must be >= 1, got {self.max_len} and {self.num_layers}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be a token id (< vocab_size {self.vocab_size})")


class CausalLM(nn.Module):
    """Decoder-only Transformer: ``tokens (B, T)`` -> next-token ``logits (B, T, V)``.

    Example:
        >>> model = CausalLM(LMConfig(vocab_size=50, dim=32, num_heads=4, num_layers=2)).eval()
        >>> tokens = torch.randint(1, 50, (2, 9))
        >>> model(tokens).shape
        torch.Size([2, 9, 50])
        >>> caches = model.new_caches()
        >>> step = model.step(tokens[:, :5], caches)       # the prompt, then one token at a time
        >>> step = model.step(tokens[:, 5:6], caches)
        >>> torch.allclose(step[:, -1], model(tokens[:, :6])[:, -1], atol=1e-5)
        True
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_id)
        self.pos = None if cfg.positions == "alibi" else PositionalEncoding(cfg.dim, cfg.max_len, cfg.positions)
        self.bias = alibi(cfg.num_heads) if cfg.positions == "alibi" else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(cfg.dim, cfg.num_heads, cfg.ffn_dim, dropout=cfg.dropout, activation=cfg.activation,
                             kv_heads=cfg.kv_heads, score=cfg.score) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings ``N(0, 0.02^2)`` (padding row zero), as GPT-2; the attention layers keep their own init."""
        nn.init.normal_(self.embed.weight, std=0.02)
        with torch.no_grad():
            self.embed.weight[self.cfg.pad_id].zero_()
        if self.pos is not None:
            self.pos.reset_parameters()
        if self.cfg.tie_weights:
            self.out.weight = self.embed.weight
        else:
            nn.init.normal_(self.out.weight, std=0.02)

    @property
    def context(self) -> int | None:
        """The most positions the model can read (``None``: any, with ALiBi)."""
        return None if self.pos is None else self.cfg.max_len

    def _run(self, tokens: Tensor, start: int, caches: list[KVCache] | None, key_mask: Tensor | None) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
            raise ValueError(f"tokens must be (B, T) integer ids, got {tuple(tokens.shape)} {tokens.dtype}")
        if self.context is not None and start + tokens.shape[1] > self.context:
            raise ValueError(f"{start + tokens.shape[1]} positions are more than the model's context "
                             f"({self.context}); cut the text or build the model with a larger max_len")
        x = self.embed(tokens)
        x = self.dropout(x if self.pos is None else self.pos(x, start))
        for i, layer in enumerate(self.layers):
            x = layer(x, is_causal=True, key_mask=key_mask, cache=None if caches is None else caches[i],
                      score_mod=self.bias)
        return self.norm(x)

    def features(self, tokens: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """``tokens (B, T)`` -> the last layer's normalised states ``(B, T, E)``, what the output projection reads
        (row ``t`` has seen tokens ``0..t``): the body a classifier starts from."""
        return self._run(tokens, 0, None, key_mask)

    def forward(self, tokens: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """``tokens (B, T)`` -> ``logits (B, T, V)``: row ``t`` predicts token ``t + 1`` from tokens ``0..t``.

        ``key_mask (B, T)`` bool, True at real tokens (right padding needs none: the causal mask keeps it out of
        every real position).
        """
        return self.out(self._run(tokens, 0, None, key_mask))

    def new_caches(self) -> list[KVCache]:
        """Empty key/value caches, one per layer, for :meth:`step`."""
        return [KVCache() for _ in self.layers]

    def step(self, tokens: Tensor, caches: list[KVCache]) -> Tensor:
        """The next ``tokens (B, L)`` after what ``caches`` hold (updated in place) -> ``logits (B, L, V)``."""
        if len(caches) != len(self.layers):
            raise ValueError(f"caches must hold one KVCache per layer ({len(self.layers)}), got {len(caches)}")
        return self.out(self._run(tokens, len(caches[0]), caches, None))


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                greedy: bool = False, generator: torch.Generator | None = None) -> Tensor:
    """The next token of each row of ``logits (B, V)``: the most likely (``greedy``) or one drawn from the softmax
    of ``logits / temperature`` restricted to the ``top_k`` most likely tokens and to the smallest set whose
    probability reaches ``top_p`` (Holtzman et al., 2020, nucleus sampling). Returns ``(B,)`` ids."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, V), got {tuple(logits.shape)}")
    if greedy:
        return logits.argmax(-1)
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a positive number, got {temperature} (for the most likely token "
                         "use greedy decoding)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    # in float64, from the best logit down: a tiny temperature (1e-45, 1e-300) sends the others to -inf and keeps the
    # best at 0, the limit greedy decoding is (ties shared), where logits / temperature overflowed to inf - inf = NaN
    scores = logits.double()
    scores = (scores - scores.amax(-1, keepdim=True)) / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p is not None and top_p < 1:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        before = probs.cumsum(-1) - probs  # the probability of the tokens ranked above each one
        drop = before >= top_p  # the most likely token is always kept (before = 0)
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, -math.inf))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: CausalLM, prompt: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, greedy: bool = False, eos_id: int | None = None,
             seed: int | None = None) -> Tensor:
    """Continue ``prompt (B, P)`` by up to ``max_new_tokens`` tokens with the key/value caches (the prompt is read
    once): ``(B, P + N)``. Rows that produce ``eos_id`` stop there (later positions repeat ``eos_id``). ``seed``
    makes sampling reproducible on any device. A prompt and continuation longer than the model's context is an
    error (before any work)."""
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (B, P) token ids with P >= 1, got {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if model.context is not None and prompt.shape[1] + max_new_tokens > model.context:
        raise ValueError(f"the prompt ({prompt.shape[1]} tokens) and {max_new_tokens} new tokens are more than the "
                         f"model's context ({model.context})")
    generator = None if seed is None else torch.Generator(device=prompt.device).manual_seed(seed)
    caches = model.new_caches()
    logits = model.step(prompt, caches)[:, -1]
    out, done = [prompt], torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                          generator=generator)
        if eos_id is not None:
            nxt = nxt.masked_fill(done, eos_id)
            done = done | (nxt == eos_id)
        out.append(nxt[:, None])
        if eos_id is not None and bool(done.all()):
            break
        logits = model.step(nxt[:, None], caches)[:, -1]
    return torch.cat(out, dim=1)
