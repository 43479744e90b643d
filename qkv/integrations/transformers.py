"""qkv as an attention backend of Hugging Face ``transformers`` (5.x): ``attn_implementation="qkv"``.

``transformers`` lets a library register an attention function by name (``AttentionInterface.register``); every
recent model (BERT, GPT-2, Llama, Mistral, Gemma, BART, T5, ...) then calls it with the attention module and
``query (B, H, Tq, D)``, ``key``/``value (B, Hkv, Tk, D)`` and a 4-D mask. :func:`register` registers
:func:`qkv.attention` under a name (nothing happens on import)::

    from transformers import AutoModelForCausalLM
    from qkv.integrations.transformers import register

    register()                                                  # "qkv"; calling it again is harmless
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="qkv")
    out = model(ids, output_attentions=True)                    # weights from qkv's weights path
    with qkv.capture_attention(model) as records:               # every layer, head, self and cross
        model(ids)

What ``transformers`` passes, and what qkv does with it:

- ``attention_mask``: ``None`` (no padding; causal models then rely on ``is_causal``, taken from the call or the
  module as ``sdpa`` does), a boolean ``(B, 1|H, Tq, Tk)`` mask (True = may attend: the ``sdpa`` mask functions are
  registered for the same name) or an additive float mask: passed as qkv's ``mask``.
- ``scaling`` -> ``scale``; ``dropout`` -> ``dropout`` (the modules pass 0 in eval).
- grouped-query heads (``Hkv < H``): keys and values repeated per group, as the ``eager`` path does (SDPA's fused
  CPU kernel is 3x slower on grouped 5-D inputs than on repeated ones).
- ``sliding_window``: already in the mask that ``transformers`` builds; when the mask is ``None`` and more keys
  than the window are given, qkv adds it itself.
- ``softcap`` (Gemma 2) -> :func:`qkv.mods.softcap`; ``position_bias`` (T5) joins the mask as an additive bias.
- attention sinks (``s_aux``, ``sinks``), packed-sequence kernel arguments (``cu_seq_lens_*``, ``max_length_*``),
  paged caches and any other argument that would change the attention are refused with a ``ValueError`` naming
  them; arguments that do not concern the attention (``position_ids``, ``use_cache``, ...) are ignored, as by
  ``sdpa``.
- the weights are computed only when the model was asked for them (``output_attentions=True``, by argument or
  config), through qkv's weights path (one matmul, an in-place softmax, one matmul); otherwise the fused path.

Differences from ``eager``: a query row with no key to attend to (a left-padding position of a causal model) gets
zero weights and a zero output, where ``eager`` spreads it uniformly; every row of a real token is the same.

Any score in any model: ``register("qkv-cosine", score="cosine", scale=10.0)`` or
``register("qkv-alibi", score_mod=qkv.mods.alibi(num_heads))`` registers another name, which runs every
self-attention of the model with that score or modifier (cross-attention gets the score only). Pretrained weights
were trained for the model's own score: expect a fine-tuned, not a pretrained, model to do well with another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .. import mods as _mods
from ..functional import attention
from .fused_record import fused_and_record

__all__ = ["register", "registered", "BackendOptions", "attention_kind", "recording", "probing", "on_qkv"]

log = logging.getLogger(__name__)

#: names ``transformers`` already uses for its own implementations: never replaced
RESERVED = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4",
            "paged|eager", "paged|sdpa")

#: arguments the models pass that do not concern the attention itself (``sdpa`` ignores them too)
IGNORED = frozenset({"position_ids", "cache_position", "use_cache", "output_hidden_states", "return_dict",
                     "past_key_values", "past_key_value", "encoder_hidden_states", "encoder_attention_mask",
                     "token_type_ids", "layer_idx", "output_router_logits", "logits_to_keep"})

#: arguments qkv cannot honour, with what they are
REFUSED = {"s_aux": "attention sinks", "sinks": "attention sinks",
           "cu_seq_lens_q": "packed sequences for flash-attention kernels", "cu_seq_lens_k": "packed sequences",
           "max_length_q": "packed sequences", "max_length_k": "packed sequences", "cache": "a paged cache",
           "head_mask": "a head mask", "attention_chunk_size": "chunked attention",
           "target_dtype": "flash-attention's dtype cast"}


@dataclass(frozen=True)
class BackendOptions:
    """What a registered name runs (see :func:`register`)."""

    score: Any = "scaled_dot"  # a qkv score: name or parameter-free callable (q, k) -> (..., Tq, Tk)
    scale: float | str | None = "model"  # "model": the model's own scaling; None: the score's default; a number
    normalize: Any = "softmax"  # softmax, sparsemax or a callable
    score_mod: Callable | None = None  # applied to self-attention, after the model's own soft-capping
    mask_mod: Callable | None = None  # and-ed with the model's mask in self-attention


_REGISTERED: dict[str, BackendOptions] = {}

#: the recorder of :func:`recording` while one is active: ``heads_of(module, H)`` -> the head indices to record
#: (None: not this module), ``add(module, first_row, weights (B, h, rows, Tk), Tq)`` (a call's rows, in pieces)
_RECORDER: Any = None


@contextmanager
def recording(recorder: Any) -> Iterator[Any]:
    """While the block runs, every attention call of a model on a registered name gives ``recorder`` the weights
    of the heads it asks for (``recorder.heads_of(module, num_heads)``: a list of head indices, or None), computed
    beside the fused path for those heads only, a few hundred query rows at a time (or taken from the weights path
    when the model asked for its weights).
    Used by :mod:`qkv.integrations.generation`; recordings do not nest."""
    global _RECORDER
    if _RECORDER is not None:
        raise RuntimeError("a recording is already active; recordings do not nest")
    _RECORDER = recorder
    try:
        yield recorder
    finally:
        _RECORDER = None


#: the probe of :func:`probing` while one is active: ``probe(module, value (B, H, Tk, D))`` -> None, or a ``(B, H)``
#: factor on each head's output before the output projection (0: the head ablated in that row of the batch)
_PROBE: Any = None


@contextmanager
def probing(probe: Any) -> Iterator[Any]:
    """While the block runs, every attention call of a model on a registered name calls ``probe(module, value)``
    with its values ``(B, H, Tk, D)`` (key/value heads repeated for grouped-query attention); a ``(B, H)`` tensor
    it returns scales each head's output before the output projection (:mod:`qkv.integrations.importance`)."""
    global _PROBE
    if _PROBE is not None:
        raise RuntimeError("a probe is already active; probes do not nest")
    _PROBE = probe
    try:
        yield probe
    finally:
        _PROBE = None


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("qkv.integrations.transformers needs transformers: pip install 'qkv[hf]'") from e
    return transformers


def register(name: str = "qkv", *, score: Any = "scaled_dot", scale: float | str | None = "model",
             normalize: Any = "softmax", score_mod: Callable | None = None,
             mask_mod: Callable | None = None) -> str:
    """Register qkv's attention with ``transformers`` under ``name``; return ``name``.

    Then ``from_pretrained(..., attn_implementation=name)``, ``from_config(..., attn_implementation=name)`` or
    ``model.set_attn_implementation(name)``. Registers the attention function and, for the masks, the ``sdpa`` mask
    functions (boolean masks, ``None`` where ``is_causal`` suffices). Calling it again with the same ``name``
    replaces that name's options: models already set to ``name`` use the new ones from their next call.

    Args:
        score, normalize: as in :func:`qkv.attention` (a :class:`qkv.scores.Score` with parameters would not be a
            parameter of the model: it is neither saved nor trained with it).
        scale: ``"model"`` takes the model's ``scaling`` (``1/sqrt(D)`` for most); ``None`` the score's default
            (1 for ``cosine``: give ``1/temperature``); a number overrides.
        score_mod, mask_mod: :mod:`qkv.mods` modifiers for every self-attention (e.g. ``qkv.mods.alibi(H)``
            with the model's number of heads ``H``); query positions count from the first cached key.
    """
    transformers = _require_transformers()
    if not isinstance(name, str) or not name or name in RESERVED or name.startswith("paged|"):
        raise ValueError(f"name must be a new attention name, not one of transformers' own ({', '.join(RESERVED)}); "
                         f"got {name!r}")
    if not (scale in ("model", None) or (isinstance(scale, (int, float)) and scale > 0)):
        raise ValueError(f"scale must be 'model', None or a positive number, got {scale!r}")
    from transformers.masking_utils import sdpa_mask

    from ..normalize import get_normalizer
    from ..scores import get_score

    get_score(score)  # an unknown name is refused here, with the valid ones, not at the model's first call
    get_normalizer(normalize)
    options = BackendOptions(score, scale, normalize, score_mod, mask_mod)
    transformers.AttentionInterface.register(name, _backend(options))
    transformers.masking_utils.AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED[name] = options
    return name


def registered() -> dict[str, BackendOptions]:
    """The names registered by :func:`register` in this process, with their options."""
    return dict(_REGISTERED)


@contextmanager
def on_qkv(model: nn.Module, name: str = "qkv") -> Iterator[nn.Module]:
    """``model`` (a ``transformers`` model) on qkv's backend ``name`` for the block, and back on the attention it
    had after it (a model already on a registered name stays on it). ``name`` is registered with the default
    options when it is not yet."""
    config = getattr(model, "config", None)
    old = getattr(config, "_attn_implementation", None)
    if old in _REGISTERED:
        yield model
        return
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"{type(model).__name__} is not a transformers model that can change its attention")
    if name not in _REGISTERED:
        register(name)
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(old or "eager")


def attention_kind(module: nn.Module) -> str:
    """``"self"`` or ``"cross"`` for a ``transformers`` attention module, stored as ``module.attention_kind``
    (which :func:`qkv.capture_attention` reads, and which may be set by hand for a module this guesses wrong).

    Cross: ``is_cross_attention`` is set (GPT-2), the class is a cross-attention (``BertCrossAttention``), or a
    decoder's attention that is not causal (BART's, Whisper's and T5's encoder attention).
    """
    kind = getattr(module, "attention_kind", None)
    if kind in ("self", "cross"):
        return kind
    cross = (bool(getattr(module, "is_cross_attention", False)) or "CrossAttention" in type(module).__name__
             or (bool(getattr(module, "is_decoder", False)) and getattr(module, "is_causal", None) is False))
    kind = "cross" if cross else "self"
    module.attention_kind = kind
    return kind


def _weights_wanted(kwargs: dict[str, Any]) -> bool:
    """Whether the model was asked for attention weights: the argument, else ``transformers``' output recorder."""
    if kwargs.get("output_attentions"):
        return True
    try:  # GPT-2 and others take output_attentions out of the kwargs and record the modules' outputs with hooks
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - another transformers layout
        return False
    collected = _active_collector.get()
    return bool(collected) and any(k.endswith("attentions") for k in collected)


def _check_kwargs(module: nn.Module, kwargs: dict[str, Any]) -> None:
    for k, v in kwargs.items():
        if k in IGNORED or k in ("output_attentions", "is_causal", "sliding_window", "softcap", "position_bias"):
            continue
        if v is None or v is False:
            continue
        what = REFUSED.get(k, "an argument qkv does not know")
        raise ValueError(f"qkv attention backend: {type(module).__name__} passed {k}= ({what}), which qkv does not "
                         f"support; use attn_implementation='eager' or 'sdpa' for this model")


def _repeat_heads(t: Tensor, groups: int) -> Tensor:
    """``(B, Hkv, T, D) -> (B, Hkv * groups, T, D)``, each key/value head once per query head of its group."""
    if groups == 1:
        return t
    b, h, n, d = t.shape
    return t[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def _window_mask(tq: int, tk: int, window: int, device: torch.device) -> Tensor:
    """``(Tq, Tk)`` True where a query (the last ``Tq`` positions of ``Tk``) sees a key in its causal window."""
    dist = torch.arange(tk - tq, tk, device=device)[:, None] - torch.arange(tk, device=device)[None, :]
    return (dist >= 0) & (dist < window)


#: query rows whose weights a recording computes at once (its memory beyond the weights it keeps)
RECORD_ROWS = 256


def _record_weights(recorder: Any, module: nn.Module, options: BackendOptions, query: Tensor, key: Tensor,
                    value: Tensor, mask: Tensor | None, scale: float | None, is_causal: bool, score_mod: Any,
                    mask_mod: Any, heads: list[int]) -> None:
    """The weights of the heads asked for, beside the fused path, :data:`RECORD_ROWS` query rows at a time (a value
    of width 1 keeps each weighted sum cheap), given to ``recorder.add(module, first_row, weights, rows)``."""
    h, tq, tk = query.shape[1], query.shape[2], key.shape[2]
    all_heads = score_mod is not None  # a modifier may depend on the head's number
    sel = slice(None) if all_heads else heads
    if not all_heads and mask is not None and mask.dim() == 4 and mask.shape[1] == h:
        mask = mask[:, heads]
    q, k, v = query[:, sel], key[:, sel], value[:, sel, :, :1]
    for i in range(0, tq, RECORD_ROWS):
        n = min(RECORD_ROWS, tq - i)
        m = mask[..., i:i + n, :] if mask is not None and mask.dim() >= 2 and mask.shape[-2] == tq else mask
        if is_causal:  # queries are the last tq of the tk positions
            allowed = torch.arange(tk, device=query.device)[None, :] <= \
                torch.arange(tk - tq + i, tk - tq + i + n, device=query.device)[:, None]
            m = allowed if m is None else (m & allowed if m.dtype == torch.bool
                                           else m.masked_fill(~allowed, float("-inf")))
        _, w = attention(q[:, :, i:i + n], k, v, score=options.score, mask=m, normalize=options.normalize,
                         scale=scale, return_weights=True, score_mod=score_mod, mask_mod=mask_mod,
                         q_offset=tk - tq + i if score_mod is not None or mask_mod is not None else 0)
        recorder.add(module, i, w[:, heads] if all_heads else w, tq)


def _backend(options: BackendOptions) -> Callable[..., tuple[Tensor, Tensor | None]]:
    def qkv_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                              attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """``transformers``' attention interface on :func:`qkv.attention`.

        Args:
            module: the calling attention module (its ``is_causal``, and the kind recorded by captures).
            query: ``(B, H, Tq, D)``.  key, value: ``(B, Hkv, Tk, D)``, ``H`` a multiple of ``Hkv``.
            attention_mask: ``None``, boolean ``(B, 1|H, Tq, Tk)`` (True = may attend) or additive float.
            dropout: on the weights.  scaling: on the scores (``None``: ``1/sqrt(D)``).

        Returns:
            ``output (B, Tq, H, D)`` and the weights ``(B, H, Tq, Tk)`` if the model asked for them, else None.
        """
        _check_kwargs(module, kwargs)
        kind = attention_kind(module)
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.shape[1] % key.shape[1]:
            raise ValueError(f"qkv attention backend: expected query (B, H, Tq, D) and key/value (B, Hkv, Tk, D) "
                             f"with H a multiple of Hkv, got query {tuple(query.shape)}, key {tuple(key.shape)}")
        h, hkv, tq, tk = query.shape[1], key.shape[1], query.shape[2], key.shape[2]
        key, value = _repeat_heads(key, h // hkv), _repeat_heads(value, h // hkv)
        mask = attention_mask
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        is_causal = bool(is_causal) and mask is None and tq > 1 and kind == "self"
        if is_causal and tk > tq:  # an empty static cache's prefill: the keys after the queries are not there yet
            key, value, tk = key[:, :, :tq], value[:, :, :tq], tq
        window = kwargs.get("sliding_window")
        if window is not None and mask is None and tk > window and kind == "self":
            mask = _window_mask(tq, tk, int(window), query.device)
            is_causal = False
        bias = kwargs.get("position_bias")
        if bias is not None:  # T5: the bias joins the mask
            if mask is None:
                mask = bias
            elif mask.dtype == torch.bool:
                mask = bias.masked_fill(~mask, float("-inf"))
            else:
                mask = bias + mask
        score_mods = []
        if kwargs.get("softcap") is not None:
            score_mods.append(_mods.softcap(float(kwargs["softcap"])))
        mask_mod = None
        if kind == "self":
            score_mods += [options.score_mod] if options.score_mod is not None else []
            mask_mod = options.mask_mod
        score_mod = None if not score_mods else score_mods[0] if len(score_mods) == 1 else _mods.chain(*score_mods)
        scale = scaling if options.scale == "model" else options.scale
        recorder = _RECORDER
        heads = recorder.heads_of(module, h) if recorder is not None else None
        want = _weights_wanted(kwargs)
        fused = None
        if (heads is not None and not want and not dropout and options.score == "scaled_dot"
                and options.normalize == "softmax" and score_mod is None and mask_mod is None):
            # the weights rebuilt from the fused kernel's log-sum-exp (one more q.k, no second softmax)
            fused = fused_and_record(recorder, module, query, key, value, mask, scale, is_causal, heads)
        if fused is not None:
            out, weights, heads = fused, None, None
        else:
            result = attention(query, key, value, score=options.score, mask=mask, normalize=options.normalize,
                               dropout=dropout, scale=scale, is_causal=is_causal, return_weights=want,
                               score_mod=score_mod, mask_mod=mask_mod,
                               q_offset=tk - tq if score_mod is not None or mask_mod is not None else 0)
            out, weights = result if want else (result, None)
        if _PROBE is not None:
            factor = _PROBE(module, value)
            if factor is not None:
                out = out * factor[:, :, None, None].to(out.dtype)
        if heads is not None:
            if weights is not None:
                recorder.add(module, 0, weights[:, heads] if len(heads) < h else weights, tq)
            else:
                _record_weights(recorder, module, options, query, key, value, mask, scale, is_causal, score_mod,
                                mask_mod, heads)
        return out.transpose(1, 2).contiguous(), weights

    qkv_attention_forward.options = options
    return qkv_attention_forward

