"""Which heads matter: measures beside the attention weights of a Hugging Face model.

A head with large weights can be one the output does not depend on: the value vectors it reads may be small, or
what it writes may be undone later. Three measures answer in different ways:

- :func:`head_importance`: ``(layers, heads)``, the increase of the model's mean loss in nats (next-token negative
  log-likelihood; masked-token or class negative log-likelihood for an encoder with a head) on the given text when
  one head's output is zeroed before the attention's output projection. One ablation per head, many heads per
  forward pass: the batch holds one copy of the text per ablated head, and the layers below the ablated one are not
  run again (Michel et al., "Are Sixteen Heads Really
  Better than One?", NeurIPS 2019, https://arxiv.org/abs/1905.10650, measure the same dependence through a
  gradient; this is the exact ablation). Zeroing takes the model off its usual inputs (a mean ablation would read
  differently), and heads ablated one at a time may compensate for each other: a head at 0 is not a head that
  does nothing.
- :func:`value_weighted_records`: each map's weights times the norm of the value vector each key gives,
  ``w_ij ||v_j||`` (Kobayashi et al., "Attention is Not Only a Weight: Analyzing Transformers with Vector Norms",
  EMNLP 2020, https://arxiv.org/abs/2004.10102), rows rescaled to sum to 1 for the page. It differs from the
  paper in leaving out the output projection (``||v_j W_O||`` there): it is the size of what each key gives the
  head, not of what reaches the residual stream.
- :func:`attention_gradient`: for one output token, each map's weights times the gradient of that token's
  log-probability with respect to them, ``A * dlogp/dA``: a first-order, local sensitivity (large where a small
  change of the weight would move the token's probability), not a decomposition of the output.

The model runs on qkv's attention backend for the call (:func:`qkv.integrations.transformers.on_qkv`) and is put
back as it was.

Example::

    from qkv.integrations.importance import head_importance
    scores = head_importance(model, tok("the cat sat on the mat", return_tensors="pt").input_ids)
    scores.shape            # (layers, heads), nats
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any

import torch
from torch import Tensor, nn

from ..capture import AttentionRecord
from ..viz.head_stats import MEASURES
from .generation import _layer_index, count_layers
from .transformers import on_qkv, probing

__all__ = ["head_importance", "objective_of", "value_weighted", "value_weighted_records", "attention_gradient",
           "MEASURES"]

log = logging.getLogger(__name__)

OBJECTIVES = ("causal", "masked", "classification")


def objective_of(model: nn.Module) -> str:
    """``causal``, ``masked`` or ``classification``: the loss :func:`head_importance` measures for ``model``'s
    head; a ``ValueError`` (one line) for a model without a head or an encoder-decoder."""
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is an encoder-decoder model: head importance is measured on a decoder-only model "
                         "or an encoder with a masked-language or classification head")
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal"
    if name.endswith("ForMaskedLM"):
        return "masked"
    if name.endswith("ForSequenceClassification"):
        return "classification"
    raise ValueError(f"{name} has no language-model or classification head: head importance needs a loss "
                     "(load it as ...ForCausalLM, ...ForMaskedLM or ...ForSequenceClassification)")


def _losses(model: nn.Module, objective: str, ids: Tensor, mask: Tensor | None, target: Tensor) -> Tensor:
    """``(B,)`` the mean negative log-likelihood of each row of the batch (in float64, one row at a time: the
    logits of a large vocabulary are the largest tensor here)."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    if objective == "classification":
        return nn.functional.cross_entropy(logits.double(), target.expand(len(ids)), reduction="none")
    if objective == "causal":
        logits, target = logits[:, :-1], ids[:, 1:]
        keep = torch.ones_like(target, dtype=torch.bool) if mask is None else mask[:, 1:].bool()
    else:  # masked: target (T,) holds the original ids at the masked positions, -100 elsewhere
        target = target.expand(len(ids), -1)
        keep = target >= 0
    out = []
    for row, t, k in zip(logits, target, keep, strict=True):
        row = row[k].double()
        nll = torch.logsumexp(row, -1) - row.gather(-1, t[k][:, None])[:, 0]
        out.append(nll.sum() / max(int(k.sum()), 1))
    return torch.stack(out)


class _Prefix:
    """The layers below an ablated one give what they gave without ablation: their outputs of the unablated pass
    are kept (forward hooks on the stack's layers), and while a batch ablates heads of layer ``l`` only, layers
    ``0..l-1`` return those outputs repeated along the batch instead of running. No stack found: nothing kept."""

    def __init__(self, model: nn.Module, names: dict[nn.Module, str]):
        self.blocks: dict[int, nn.Module] = {}
        for module, name in names.items():
            match = re.match(r"^(.*?)(?:^|\.)(\d+)\.", name + ".") if _is_attention(module) else None
            if match:
                path = f"{match.group(1)}.{match.group(2)}" if match.group(1) else match.group(2)
                try:
                    self.blocks.setdefault(int(match.group(2)), model.get_submodule(path))
                except AttributeError:
                    continue
        self.kept: dict[int, Any] = {}

    def keep(self):
        hooks = [b.register_forward_hook(lambda m, a, out, i=i: self.kept.__setitem__(i, out))
                 for i, b in self.blocks.items()]
        return hooks

    def skip(self, below: int, rows: int) -> list[nn.Module]:
        patched = []
        for i in range(below):
            if i not in self.blocks or i not in self.kept:
                break
            out = _repeat(self.kept[i], rows)
            self.blocks[i].forward = lambda *a, out=out, **kw: out
            patched.append(self.blocks[i])
        return patched


def _is_attention(module: nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith(("Attention", "SelfAttention")) and "Cross" not in name and not name.endswith("Output")


def _repeat(x: Any, rows: int) -> Any:
    if isinstance(x, Tensor):
        return x.expand(rows, *x.shape[1:]).contiguous() if x.dim() and x.shape[0] == 1 else x
    if isinstance(x, tuple):
        return type(x)(_repeat(v, rows) for v in x) if not hasattr(x, "_fields") else type(x)(
            *(_repeat(v, rows) for v in x))
    return x


class _Ablation:
    """The probe of one batch: row ``i`` zeroes head ``heads[i]`` of layer ``layers[i]`` (-1: none)."""

    def __init__(self, names: dict[nn.Module, str], layers: list[int], heads: list[int]):
        self.names, self.layers, self.heads = names, torch.tensor(layers), torch.tensor(heads)
        self.cache: dict[int, Tensor | None] = {}

    def __call__(self, module: nn.Module, value: Tensor) -> Tensor | None:
        layer = _layer_index(module, self.names.get(module, ""))
        h = value.shape[1]
        if layer not in self.cache:
            rows = (self.layers == layer).nonzero().flatten()
            if not len(rows):
                self.cache[layer] = None
            else:
                factor = torch.ones(len(self.layers), h)
                factor[rows, self.heads[rows]] = 0
                self.cache[layer] = factor
        factor = self.cache[layer]
        return None if factor is None else factor.to(value.device)


@torch.no_grad()
def head_importance(model: nn.Module, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                    labels: Tensor | int | None = None, mask_token_id: int | None = None,
                    masked: Tensor | None = None, batch: int = 8, seed: int = 0, reuse: bool = True) -> Tensor:
    """``(layers, heads)``: how much the model's mean loss on ``input_ids`` rises (nats) when each head's output
    is zeroed before its attention's output projection (see the module's docstring).

    Args:
        model: a ``transformers`` model with a head: ``...ForCausalLM`` (next-token loss over the text),
            ``...ForMaskedLM`` (loss of the masked tokens) or ``...ForSequenceClassification``.
        input_ids: ``(1, T)`` one text.  attention_mask: ``(1, T)`` (1: a token, 0: padding).
        labels: a classifier's class (default: the class it predicts for the text as it is).
        mask_token_id: a masked-language model's mask token (its tokenizer's ``mask_token_id``), put at the
            ``masked`` positions ``(T,)`` bool (default: 15% of the positions but the first and last, at least one,
            drawn with ``seed``).
        batch: ablated heads per forward pass, all of one layer (memory grows with it: one copy of the text each).
        reuse: the layers below the ablated one are not run again: their outputs of the unablated pass are
            repeated along the batch (a model whose layers cannot be found runs them all).

    Returns a float32 tensor on the CPU; it is computed in the model's dtype, the losses in float64.
    """
    objective = objective_of(model)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be one text (1, T) of at least 2 tokens, got {tuple(input_ids.shape)}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    mask = None if attention_mask is None else attention_mask.to(device)
    target = torch.zeros(0)
    if objective == "masked":
        if mask_token_id is None:
            raise ValueError(f"{type(model).__name__} is a masked-language model: give mask_token_id (its "
                             "tokenizer's mask_token_id)")
        t = ids.shape[1]
        if masked is None:
            g = torch.Generator().manual_seed(seed)
            inner = torch.randperm(max(t - 2, 1), generator=g)[:max(1, round(0.15 * (t - 2)))] + (1 if t > 2 else 0)
            masked = torch.zeros(t, dtype=torch.bool)
            masked[inner] = True
        masked = masked.to(device)
        target = torch.where(masked, ids[0], -100)
        ids = torch.where(masked, mask_token_id, ids)
    layers = count_layers(model.config)
    names = {m: n for n, m in model.named_modules()}
    with on_qkv(model):
        if objective == "classification":
            target = torch.tensor([int(labels)], device=device) if labels is not None else \
                model(input_ids=ids, attention_mask=mask).logits.argmax(-1)[:1]
        heads = []
        prefix = _Prefix(model, names) if reuse else None
        hooks = prefix.keep() if prefix is not None else []
        try:
            with probing(lambda module, value: heads.append(value.shape[1])):
                base = float(_losses(model, objective, ids, mask, target)[0])
        finally:
            for hook in hooks:
                hook.remove()
        if not heads:
            raise ValueError(f"{type(model).__name__} ran no attention through qkv's backend")
        h = max(heads)
        out = torch.zeros(layers, h, dtype=torch.float64)
        for layer in range(layers):  # a batch ablates heads of one layer: the layers below it are kept
            for first in range(0, h, batch):
                chunk = list(range(first, min(first + batch, h)))
                rows = len(chunk)
                probe = _Ablation(names, [layer] * rows, chunk)
                patched = prefix.skip(layer, rows) if prefix is not None else []
                try:
                    with probing(probe):
                        losses = _losses(model, objective, ids.expand(rows, -1),
                                         None if mask is None else mask.expand(rows, -1), target)
                finally:
                    for block in patched:
                        del block.forward
                out[layer, chunk] = losses.double().cpu()
        out -= base
    return out.float()


def value_weighted(weights: Tensor, value_norms: Tensor, *, normalize: bool = True) -> Tensor:
    """``weights (..., H, Tq, Tk)`` times ``value_norms (..., H, Tk)`` (the norm of each key's value vector in
    each head): ``w_ij ||v_j||``, each row rescaled to sum to 1 when ``normalize`` (rows that are all 0 stay 0)."""
    if value_norms.shape[-1] != weights.shape[-1] or value_norms.shape[:-1] != weights.shape[:-2]:
        raise ValueError(f"value_norms must be (..., H, Tk) for weights (..., H, Tq, Tk), got "
                         f"{tuple(value_norms.shape)} and {tuple(weights.shape)}")
    out = weights * value_norms[..., None, :].to(weights.dtype)
    if normalize:
        total = out.sum(-1, keepdim=True)
        out = torch.where(total > 0, out / total.clamp_min(torch.finfo(out.dtype).tiny), 0)
    return out


@torch.no_grad()
def value_weighted_records(model: nn.Module, **inputs: Any) -> tuple[list[AttentionRecord], list[AttentionRecord]]:
    """``(records, value-weighted records)`` of one forward pass of ``model`` on ``inputs``: every attention map
    (:func:`qkv.capture_attention`) and beside each, named ``value-weighted NAME``, :func:`value_weighted` of it
    with the norms of the values the call read."""
    from ..capture import capture_attention

    names = {m: n for n, m in model.named_modules()}
    norms: dict[str, list[Tensor]] = {}

    def probe(module: nn.Module, value: Tensor) -> None:
        norms.setdefault(names.get(module, type(module).__name__), []).append(value.float().norm(dim=-1).cpu())

    with on_qkv(model), capture_attention(model) as records, probing(probe):
        model(**inputs)
    weighted = []
    for r in records:
        got = norms.get(r.name)
        if not got or r.weights.dim() != 4 or got[-1].shape[-1] != r.weights.shape[-1]:
            continue
        weighted.append(dataclasses.replace(r, name=f"value-weighted {r.name}",
                                            weights=value_weighted(r.weights.float(), got[-1])))
    return list(records), weighted


def attention_gradient(model: nn.Module, input_ids: Tensor, *, position: int = -1, token: int | None = None,
                       attention_mask: Tensor | None = None) -> tuple[list[Tensor], int]:
    """``([A * dlogp/dA per layer (H, Tq, Tk)], token)``: for the output at ``position`` (a causal model's
    prediction of the next token there; a masked model's at that position) and ``token`` (default: the one the
    model predicts), each layer's weights times the gradient of ``log p(token)`` with respect to them."""
    objective = objective_of(model)
    if objective == "classification":
        position = 0
    with on_qkv(model), torch.enable_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
        maps = [a for a in out.attentions if a is not None]
        if not maps:
            raise ValueError(f"{type(model).__name__} returned no attention weights")
        logits = out.logits[0] if objective == "classification" else out.logits[0, position]
        logp = torch.log_softmax(logits.double(), -1)
        token = int(logp.argmax()) if token is None else int(token)
        if not 0 <= token < logp.shape[-1]:
            raise ValueError(f"token {token} is outside the model's {logp.shape[-1]} outputs")
        grads = torch.autograd.grad(logp[token], maps, allow_unused=True)
    result = [(a * (g if g is not None else torch.zeros_like(a)))[0].detach().float() for a, g in
              zip(maps, grads, strict=True)]
    if not all(math.isfinite(float(r.abs().sum())) for r in result):
        log.warning("attention x gradient is not finite for some layer")
    return result, token
