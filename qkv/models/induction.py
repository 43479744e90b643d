"""Induction heads of a causal language model, found on repeated random tokens (:func:`induction_table`).

Paper: Olsson et al., 2022, "In-context Learning and Induction Heads"
(https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html). A sequence of ``T``
random tokens is repeated: ``[start] R R``. An induction head, reading a token of the second copy, attends to the
token that followed the same token in the first copy (*prefix matching*) and raises that token's logit
(*copying*); a previous-token head in an earlier layer is the other half of the circuit. Scores per layer and head:

- ``induction``: the mean attention weight, over the rows of the second copy, on the token after the earlier
  occurrence (1 for a perfect induction head; about ``1 / (position + 1)`` for a uniform causal head);
- ``previous``: the same mean on the previous token;
- ``copying``: the head's OV circuit alone (a token's embedding through the layer's norm, the head's value and
  output projections, the final norm's scale and the unembedding), on the ``T`` random tokens: the share of them
  whose own logit comes first among the ``T`` (1: the head copies what it reads; chance is ``1 / T``). What differs
  from the paper: it counts the top-1 agreement where the paper measures the share of positive eigenvalues, and the
  layer norms are applied to single embeddings only.

The model's own in-context learning shows in its loss: ``loss_first`` and ``loss_second`` are the mean negative
log-likelihoods (nats) of the tokens of the first copy (unpredictable: about ``log V``) and of the second.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..capture import capture_attention
from .lm import CausalLM

__all__ = ["repeated_tokens", "attention_scores", "copying_scores", "induction_table", "InductionTable"]


@dataclass
class InductionTable:
    """What :func:`induction_table` measures: ``induction``, ``previous`` and ``copying`` ``(L, H)``, the loss on
    each copy, the ``length`` T and the ``tokens (1, 1 + 2T)`` read."""

    induction: Tensor
    previous: Tensor
    copying: Tensor
    loss_first: float
    loss_second: float
    length: int
    tokens: Tensor

    def rows(self) -> list[dict[str, float | int]]:
        """One row per head: ``layer``, ``head``, ``induction``, ``previous``, ``copying``."""
        layers, heads = self.induction.shape
        return [{"layer": i, "head": h, "induction": float(self.induction[i, h]),
                 "previous": float(self.previous[i, h]), "copying": float(self.copying[i, h])}
                for i in range(layers) for h in range(heads)]


def repeated_tokens(vocab_size: int, length: int, *, start_id: int, low: int = 4, seed: int = 0) -> Tensor:
    """``(1, 1 + 2 length)`` ids: ``start_id``, then ``length`` distinct random ids from ``low..vocab_size - 1`` (the
    special tokens left out), twice."""
    if vocab_size - low < length or length < 2:
        raise ValueError(f"a repeated sequence needs 2 <= length <= {vocab_size - low} distinct tokens, got {length}")
    g = torch.Generator().manual_seed(seed)
    r = torch.randperm(vocab_size - low, generator=g)[:length] + low
    return torch.cat([torch.tensor([start_id]), r, r])[None]


def attention_scores(weights: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """``(induction, previous)`` of attention ``weights (..., N, N)`` over ``[start] R R`` (``N = 1 + 2 length``):
    the mean weight, over the rows of the second copy, on the token after the earlier occurrence and on the
    previous token. Shapes ``(...)``."""
    n = 1 + 2 * length
    if weights.shape[-2:] != (n, n):
        raise ValueError(f"weights must be (..., {n}, {n}) for length {length}, got {tuple(weights.shape)}")
    rows = torch.arange(1 + length, n)
    induction = weights[..., rows, rows - length + 1].mean(-1)
    previous = weights[..., rows, rows - 1].mean(-1)
    return induction, previous


@torch.no_grad()
def copying_scores(model: CausalLM, tokens: Tensor) -> Tensor:
    """``(L, H)``: for each head, the share of ``tokens`` whose own logit comes first among ``tokens`` when the
    head's OV circuit alone reads the token's embedding (see the module docstring)."""
    tokens = tokens.flatten().to(model.embed.weight.device)
    emb = model.embed.weight[tokens]  # (T, E)
    scores = []
    for layer in model.layers:
        attn = layer.self_attn
        h, g, d = attn.num_heads, attn.kv_heads, attn.head_dim
        v = attn.v_proj(layer.attn_norm(emb)).view(len(tokens), g, d)  # (T, G, D)
        row = []
        for head in range(h):
            out = v[:, head // (h // g)] @ attn.out_proj.weight[:, head * d:(head + 1) * d].T  # (T, E)
            logits = (out * model.norm.weight) @ model.out.weight[tokens].T  # (T, T): read t, logit of each
            row.append((logits.argmax(-1) == torch.arange(len(tokens), device=logits.device)).float().mean())
        scores.append(torch.stack(row))
    return torch.stack(scores).cpu()


@torch.no_grad()
def induction_table(model: CausalLM, *, start_id: int, length: int = 50, seed: int = 0, low: int = 4) -> InductionTable:
    """Scores of every layer and head of ``model`` on a random sequence of ``length`` tokens repeated (cut to fit
    the model's context: ``1 + 2 length`` positions); ``start_id`` is the token that starts a document."""
    if model.context is not None:
        length = min(length, (model.context - 1) // 2)
    length = min(length, model.cfg.vocab_size - low)
    tokens = repeated_tokens(model.cfg.vocab_size, length, start_id=start_id, low=low, seed=seed)
    was_training = model.training
    model.eval()
    try:
        device = model.embed.weight.device
        with capture_attention(model) as records:
            logits = model(tokens.to(device)).float()
    finally:
        model.train(was_training)
    weights = torch.stack([r.weights[0] for r in records if r.kind == "self"])  # (L, H, N, N)
    induction, previous = attention_scores(weights, length)
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:].to(device), reduction="none").cpu()
    return InductionTable(induction, previous, copying_scores(model, tokens[0, 1:1 + length]),
                          float(nll[:length].mean()), float(nll[length:].mean()), length, tokens)
