"""A Hugging Face model generating through qkv's attention backend, its attention recorded as it happens.

:func:`record_generation` runs ``model.generate`` (greedy, sampling with a seed, or beam search) with the KV cache on
qkv's backend and records, for every step, the attention of the token being fed over the prompt and what came
before: the decoder's self-attention, the cross-attention of an encoder-decoder model (and its encoder's
self-attention, run once). Nothing runs twice: the weights are taken in the model's own calls, for the layers and
heads asked for only (the other heads and layers stay on the fused path, so one layer of a large model costs the
memory of one layer). For beam search the hypothesis that is kept is followed back through the beams (its
``beam_indices``), so each step's row is the one whose continuation was kept.

:func:`view_generation` does it for a saved model directory and a prompt, and gives the page input of
``qkv view DIR "prompt" --generate N``: the records, the token lists, and for each step the token chosen, its
probability and the most probable alternatives.

Example::

    from qkv.integrations.generation import view_generation
    from qkv.viz.page import save_attention_page

    view = view_generation("my-gpt2", "The cat sat on", generate=20, strategy="beam", beams=4, layers=[0, 5])
    save_attention_page("gen.html", view.records, **view.page_kwargs())
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..capture import AttentionRecord
from ..options import OptionError, ref
from .transformers import attention_kind, recording

__all__ = ["record_generation", "view_generation", "generation_page", "steps_of", "Recorded", "Step", "STRATEGIES"]

log = logging.getLogger(__name__)

STRATEGIES = ("greedy", "sample", "beam")


@dataclass
class Step:
    """One generated token: its id, the model's probability of it and the ``top`` most probable ``(id, p)``."""

    token_id: int
    probability: float
    top: list[tuple[int, float]]
    beam: int = 0  # the row of the batch (beam) whose continuation this token is


@dataclass
class Recorded:
    """What :func:`record_generation` returns.

    Attributes:
        sequence: ``(T,)`` the kept output of ``generate`` (decoder-only: the prompt and the generated tokens;
            encoder-decoder: the decoder's start token and the generated tokens).
        generated: ``(N,)`` the generated token ids.
        steps: one :class:`Step` per generated token.
        records: one :class:`AttentionRecord` per recorded module, batch 1, the heads asked for: an encoder's
            self-attention ``(1, h, S, S)``; a decoder's self-attention ``(1, h, T - 1, T - 1)``, row ``i`` being
            the attention of the token at position ``i`` when it was fed (the prompt's rows from the first call,
            then one row per step; keys not there yet are 0); its cross-attention ``(1, h, N, S)``.
        first_row: the decoder row of the first generated token's step (prompt length - 1; 0 for an
            encoder-decoder model), so step ``s`` is row ``first_row + s``.
        layers, heads: what was recorded (None: all).
    """

    sequence: Tensor
    generated: Tensor
    steps: list[Step]
    records: list[AttentionRecord]
    first_row: int
    encoder_decoder: bool
    layers: list[int] | None = None
    heads: list[int] | None = None


def _layer_index(module: nn.Module, name: str) -> int | None:
    layer = getattr(module, "layer_idx", None)
    if isinstance(layer, int):
        return layer
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[0]) if numbers else None


def count_layers(config) -> int:
    """The number of layers of a ``transformers`` config (of its decoder and encoder, the larger)."""
    values = [getattr(config, f, None) for f in ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
                                                  "decoder_layers", "num_decoder_layers")]
    values = [v for v in values if isinstance(v, int) and v > 0]
    if not values:
        raise ValueError(f"{type(config).__name__} names no number of layers")
    return max(values)


def count_heads(config) -> int:
    """The number of attention heads of a ``transformers`` config (the fewest, when the encoder's and decoder's
    differ)."""
    values = [getattr(config, f, None) for f in ("num_attention_heads", "n_head", "num_heads",
                                                  "encoder_attention_heads", "decoder_attention_heads")]
    values = [v for v in values if isinstance(v, int) and v > 0]
    if not values:
        raise ValueError(f"{type(config).__name__} names no number of attention heads")
    return min(values)


def check_selection(config, layers: Sequence[int] | None, heads: Sequence[int] | None) -> tuple[list | None, ...]:
    """``layers`` and ``heads`` as sorted lists (None: all), or an :class:`~qkv.options.OptionError` naming the option
    (``layers``/``heads``) and what the model has."""
    out = []
    for option, given, n, what in (("layers", layers, count_layers(config), "layers"),
                                   ("heads", heads, count_heads(config), "heads")):
        if given is None:
            out.append(None)
            continue
        given = sorted({int(x) for x in given})
        if not given:
            raise OptionError(ref(option) + ": give at least one (the model has {n} {what}, 0-{last})", option, n=n,
                              what=what, last=n - 1)
        bad = [x for x in given if not 0 <= x < n]
        if bad:
            raise OptionError(ref(option) + " {bad}: the model has {n} {what} (0-{last})", option, bad=bad[0], n=n,
                              what=what, last=n - 1)
        out.append(given)
    return tuple(out)


@dataclass
class _Recorder:
    """The recorder of :func:`qkv.integrations.transformers.recording` for one ``generate`` call.

    A call with many query rows (a prompt's, an encoder's) is written, piece by piece as the backend computes it,
    into one buffer per module of the size the joined record will have (room for ``extra`` generated rows and
    keys), from the first row of the batch (the beams of a prompt are copies); the one-row calls of the steps are
    kept per step, every beam, until the kept hypothesis is known."""

    names: dict[nn.Module, str]
    layers: set[int] | None
    heads: list[int] | None
    extra: int = 0  # rows and keys a decoder's self-attention gains after the prompt
    step: int = -1  # calls before the model's first forward (an encoder's) are step -1
    calls: list[tuple[int, str, str, bool, Tensor]] = field(default_factory=list)
    buffers: dict[str, tuple[Tensor, int, int, int]] = field(default_factory=dict)  # buffer, rows, keys, room
    cache: dict[int, tuple[str, str, bool, bool]] = field(default_factory=dict)

    def _info(self, module: nn.Module) -> tuple[str, str, bool, bool]:
        key = id(module)
        if key not in self.cache:
            name = self.names.get(module, type(module).__name__)
            kind = attention_kind(module)
            layer = _layer_index(module, name)
            wanted = self.layers is None or layer in self.layers
            in_encoder = bool(re.search(r"(^|\.)encoder(\.|$)", name))
            causal = kind == "self" and bool(getattr(module, "is_causal", not in_encoder)) and not in_encoder
            self.cache[key] = (name, kind, causal, wanted)
        return self.cache[key]

    def heads_of(self, module: nn.Module, num_heads: int) -> list[int] | None:
        name, kind, causal, wanted = self._info(module)
        if not wanted:
            return None
        if self.heads is None:
            return list(range(num_heads))
        if self.heads[-1] >= num_heads:
            raise OptionError(ref("heads") + " {bad}: {name} has {n} heads (0-{last})", "heads", bad=self.heads[-1],
                              name=name, n=num_heads, last=num_heads - 1)
        return self.heads

    def add(self, module: nn.Module, first: int, weights: Tensor, rows: int) -> None:
        name, kind, causal, _ = self._info(module)
        w = weights.detach()
        if rows > 1 and self.step <= 0:  # a prompt's or an encoder's call, given in pieces of rows
            if first == 0:
                grow = self.extra if causal and self.step == 0 else 0
                buf = torch.zeros(1, w.shape[1], rows + grow, w.shape[-1] + grow)
                self.buffers[name] = (buf, rows, w.shape[-1], grow)
                self.calls.append((self.step, name, kind, causal, buf))
            buf = self.buffers[name][0]
            buf[:, :, first:first + w.shape[-2], :w.shape[-1]] = w[:1].float().cpu()
            return
        self.calls.append((self.step, name, kind, causal, w.float().cpu()))


@torch.no_grad()
def record_generation(model: nn.Module, input_ids: Tensor, *, max_new_tokens: int, strategy: str = "greedy",
                      beams: int = 4, seed: int = 0, layers: Sequence[int] | None = None,
                      heads: Sequence[int] | None = None, attention_mask: Tensor | None = None, top: int = 5,
                      **generate_kwargs: Any) -> Recorded:
    """Generate from one prompt ``input_ids (1, T)`` through qkv's backend and record every step's attention.

    Args:
        model: a ``transformers`` model that can generate, set to a name registered by
            :func:`qkv.integrations.transformers.register` (``attn_implementation="qkv"``).
        max_new_tokens: at most this many tokens (generation stops earlier at the end-of-sequence token).
        strategy: ``greedy``; ``sample`` (the model's generation settings, seeded by ``seed``); ``beam`` (``beams``
            hypotheses; the kept one is recorded).
        layers, heads: the layer and head numbers to record (None: all); others are not computed.
        top: how many alternatives each :class:`Step` keeps.
        generate_kwargs: more arguments of ``generate`` (``temperature``, ``top_k``...).
    """
    if strategy not in STRATEGIES:
        raise OptionError(ref("strategy") + " must be one of {choices}, got {given!r}", "strategy",
                          choices=", ".join(STRATEGIES), given=strategy)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise OptionError(ref("generate") + " must be a number of tokens >= 1, got {n}", "generate", n=max_new_tokens)
    if strategy == "beam" and beams < 2:
        raise OptionError(ref("beam") + " must be >= 2 for beam search, got {n}", "beam", n=beams)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be one non-empty prompt (1, T), got {tuple(input_ids.shape)}")
    if not model.can_generate():
        raise ValueError(f"{type(model).__name__} has no generation head: it cannot generate")
    layers, heads = check_selection(model.config, layers, heads)
    enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
    rec = _Recorder({m: n for n, m in model.named_modules()}, None if layers is None else set(layers), heads,
                    extra=max_new_tokens - 1)
    gen = getattr(model, "generation_config", None)
    pad = getattr(gen, "pad_token_id", None)
    if pad is None:
        eos = getattr(gen, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    args = dict(max_new_tokens=max_new_tokens, do_sample=strategy == "sample",
                num_beams=beams if strategy == "beam" else 1, use_cache=True, return_dict_in_generate=True,
                output_logits=True, pad_token_id=pad, num_return_sequences=1)
    args.update(generate_kwargs)
    hook = model.register_forward_pre_hook(lambda module, a: setattr(rec, "step", rec.step + 1))
    device = next(model.parameters()).device
    try:
        if strategy == "sample":
            torch.manual_seed(seed)
        with recording(rec):
            out = model.generate(input_ids=input_ids.to(device), attention_mask=None if attention_mask is None
                                 else attention_mask.to(device), **args)
    finally:
        hook.remove()
    sequence = out.sequences[0].cpu()
    prompt_len = 1 if enc_dec else input_ids.shape[1]
    start = 1 if enc_dec else prompt_len  # enc-dec sequences start with the decoder's start token
    generated = sequence[start:]
    beam_indices = getattr(out, "beam_indices", None)
    n = len(generated)
    if beam_indices is not None:  # the kept hypothesis' beam at every step; -1 past its end
        rows = [int(b) for b in beam_indices[0, :n].tolist()]
        n = sum(b >= 0 for b in rows)
        rows = rows[:n]
    else:
        rows = [0] * n
    generated, sequence = generated[:n], sequence[:start + n]
    steps = steps_of(torch.stack([out.logits[s][rows[s]] for s in range(n)]) if n else torch.zeros(0, 1),
                     generated.tolist(), top=top, beams=rows)
    records = _join(rec.calls, rec.buffers, rows)
    return Recorded(sequence, generated, steps, records, prompt_len - 1 if not enc_dec else 0, enc_dec, layers, heads)


def steps_of(logits: Tensor, generated: Sequence[int], *, top: int = 5,
             beams: Sequence[int] | None = None) -> list[Step]:
    """One :class:`Step` per generated token: ``logits (N, V)`` the scores each step chose ``generated[s]`` from
    (softmaxed here), its probability and the ``top`` most probable tokens; ``beams[s]`` the step's beam."""
    steps = []
    for s, token in enumerate(generated):
        p = torch.softmax(logits[s].float().cpu(), dim=-1)
        best = torch.topk(p, min(top, p.numel()))
        steps.append(Step(int(token), float(p[int(token)]),
                          [(int(i), float(v)) for i, v in zip(best.indices, best.values, strict=True)],
                          0 if beams is None else beams[s]))
    return steps


def generation_page(records: list[AttentionRecord], tokens: dict[str, list[str]], steps: list[Step], names, *,
                    first_row: int, strategy: str, title: str, notes: list[str], encoder_decoder: bool = False,
                    layers: list[int] | None = None, heads: list[int] | None = None) -> GenerationView:
    """The page input of a recorded generation, for a Hugging Face model or a qkv language model alike: the
    ``records`` (a decoder's self-attention ``(1, h, T - 1, T - 1)``, row ``first_row + s`` that of step ``s``),
    the token lists, and each step's token, probability and alternatives (``names(ids) -> token strings``)."""
    shown = [{"token": names([s.token_id])[0], "p": round(s.probability, 5),
              "top": [[names([i])[0], round(p, 5)] for i, p in s.top]} for s in steps]
    generation = {"steps": shown, "first_row": first_row, "encoder_decoder": encoder_decoder, "heads": heads,
                  "layers": layers, "strategy": strategy}
    return GenerationView(records, tokens, title=title, notes=notes, generation=generation)


def record_forward(model: nn.Module, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                   **inputs: Any) -> list[AttentionRecord]:
    """One forward pass of ``model`` (on qkv's backend) with the weights of ``layers`` and ``heads`` recorded (None:
    all), a few hundred query rows at a time: the records of ``capture_attention`` for the first example of the
    batch, at the memory of what is kept."""
    layers, heads = check_selection(model.config, layers, heads)
    rec = _Recorder({m: n for n, m in model.named_modules()}, None if layers is None else set(layers), heads)
    with torch.no_grad(), recording(rec):
        model(**inputs)
    return _join(rec.calls, rec.buffers, [])


def _join(calls: list[tuple[int, str, str, bool, Tensor]], buffers: dict[str, tuple[Tensor, int, int, int]],
          rows: list[int]) -> list[AttentionRecord]:
    """One record per module: a prompt's or an encoder's call (already in its buffer, with room for the steps) and
    the rows of the steps of the kept hypothesis (``rows[s]``: the beam of step ``s``), joined along the query
    axis; keys that were not there yet are 0. ``calls`` is emptied as it goes."""
    by_name: dict[str, list[tuple[int, str, bool, Tensor]]] = {}
    for step, name, kind, causal, w in calls:
        by_name.setdefault(name, []).append((step, kind, causal, w))
    calls.clear()
    out = []
    for name in list(by_name):
        items = by_name.pop(name)
        kind, causal = items[0][1], items[0][2]
        buffer = buffers[name][0] if name in buffers else None
        kept = [(step, w[:1] if step < 0 else w[rows[step]:rows[step] + 1] if w.shape[0] > rows[step] else w[:1])
                for step, _, _, w in items if w is not buffer and step < len(rows)]
        del items
        if name in buffers:  # a prompt (step 0) or an encoder: its buffer, the steps' rows written after it
            buf, prompt, keys, grow = buffers[name]
            for step, w in kept:
                buf[:, :, prompt - 1 + step, :w.shape[-1]] = w[:, :, 0]
            n = min(grow, len(rows) - 1) if grow else 0
            weights = buf[:, :, :prompt + n, :keys + n]
        elif kept:
            tk = max(w.shape[-1] for _, w in kept)
            weights = kept[0][1].new_zeros(1, kept[0][1].shape[1], sum(w.shape[-2] for _, w in kept), tk)
            at = 0
            for _, w in kept:
                weights[:, :, at:at + w.shape[-2], :w.shape[-1]] = w
                at += w.shape[-2]
        else:
            continue
        numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
        out.append(AttentionRecord(name, name.rsplit(".", 1)[-1], kind, int(numbers[0]) if numbers else None,
                                   weights, calls=1 + len(kept) if name in buffers else len(kept), causal=causal))
    return out


def _page_input_class():
    from ..viz.page import PageInput  # (the page's own module: no application is needed to show a model)

    return PageInput


def view_generation(path: str | os.PathLike | nn.Module, prompt: str, generate: int = 20, *,
                    strategy: str = "greedy", beams: int = 4, seed: int = 0, layers: Sequence[int] | None = None,
                    heads: Sequence[int] | None = None, device: str | torch.device = "cpu", top: int = 5,
                    beam: int | None = None, tokenizer: Any = None, revision: str | None = None):
    """The page input of ``qkv view DIR "prompt" --generate N``: the model saved at ``path`` generates up to
    ``generate`` tokens from ``prompt`` (see :func:`record_generation`); the page shows each step.

    ``beam`` is another name of ``beams`` (the command line's ``--beam``). ``path`` may be a hub id (at
    ``revision``), or a ``transformers`` model object with its ``tokenizer`` (run on qkv's backend for the call).

    Returns a ``PageInput`` whose ``page_kwargs()`` include ``generation`` (the steps, for the page's step view).
    The prompt (or source) is cut at the model's position limit, less the tokens to generate, with a warning and a
    note on the page. Raises ``ValueError`` (one line) for an empty prompt, ``generate < 1``, an unknown layer or
    head, or a model that cannot generate.
    """
    from .hf_load import fit_tokens, load_model, position_limit

    beams = beams if beam is None else beam
    if not isinstance(prompt, str) or not prompt.strip():
        raise OptionError(ref("generate") + " needs a prompt: the text is empty", "generate")
    if not isinstance(generate, int) or isinstance(generate, bool) or generate < 1:
        raise OptionError(ref("generate") + " must be a number of tokens >= 1, got {n}", "generate", n=generate)
    if strategy not in STRATEGIES:
        raise OptionError(ref("strategy") + " must be one of {choices}, got {given!r}", "strategy",
                          choices=", ".join(STRATEGIES), given=strategy)
    if isinstance(path, nn.Module):
        model, tok, where = path, tokenizer, "the model given"
        if tok is None or not callable(tok):
            raise ValueError("a model object generates from a text with its tokenizer: give tokenizer=")
        if not model.can_generate():
            raise ValueError(f"{type(model).__name__} has no generation head: it cannot generate")
    else:
        model, tok = load_model(path, device, generate=True, revision=revision)
        where = os.fspath(path)
    layers, heads = check_selection(model.config, layers, heads)
    enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
    ids = tok(prompt)["input_ids"]
    if not ids:
        raise OptionError(ref("generate") + " needs a prompt: the text has no tokens", "generate")
    notes = [f"{type(model).__name__} ({model.config.model_type}) from {where}, on qkv's attention "
             f"backend, generating with the KV cache"]
    limit, limit_field = position_limit(model.config)
    if enc_dec:
        dec_limit = getattr(model.config, "max_target_positions", None) or limit
        if dec_limit is not None and generate >= dec_limit:
            raise OptionError(ref("generate") + " {n}: the decoder takes at most {limit} positions", "generate",
                              n=generate, limit=dec_limit)
        ids, note = fit_tokens(ids, limit, f"the model takes {limit} positions ({limit_field})",
                               keep_last=1 if tok.eos_token_id is not None and ids[-1] == tok.eos_token_id else 0)
    else:
        if limit is not None and generate >= limit:
            raise OptionError(ref("generate") + " {n}: the model takes at most {limit} positions ({field}), prompt "
                              "and generated tokens together", "generate", n=generate, limit=limit, field=limit_field)
        room = None if limit is None else limit - generate
        ids, note = fit_tokens(ids, room, f"the model takes {limit} positions ({limit_field}), {generate} of them "
                                          "for the generated tokens")
    if note:
        notes.append(note)
    from .transformers import on_qkv

    with on_qkv(model):
        recorded = record_generation(model, torch.tensor([ids]), max_new_tokens=generate, strategy=strategy,
                                     beams=beams, seed=seed, layers=layers, heads=heads, top=top)
    names = lambda xs: tok.convert_ids_to_tokens([int(x) for x in xs])  # noqa: E731
    generated = names(recorded.generated)
    if enc_dec:
        tokens = {"source": names(ids), "target": names(recorded.sequence[:-1])}
    else:
        tokens = {"tokens": names(recorded.sequence[:-1])}
    how = {"greedy": "greedy decoding", "sample": f"sampling (seed {seed})",
           "beam": f"beam search ({beams} beams; the kept hypothesis)"}[strategy]
    notes.append(f"{how}: {len(generated)} token(s) generated" +
                 (f", stopped at the end-of-sequence token before {generate}" if len(generated) < generate else ""))
    if layers is not None or heads is not None:
        notes.append(f"recorded: layers {'all' if layers is None else ', '.join(map(str, layers))}; heads "
                     f"{'all' if heads is None else ', '.join(map(str, heads))}")
    text = tok.decode(recorded.generated if enc_dec else recorded.sequence, skip_special_tokens=True)
    return generation_page(recorded.records, tokens, recorded.steps, names, first_row=recorded.first_row,
                           strategy=strategy, title=f"{prompt} \u2192 {text}" if enc_dec else text, notes=notes,
                           encoder_decoder=enc_dec, layers=layers, heads=heads)


@dataclass
class GenerationView(_page_input_class()):  # type: ignore[misc]
    """A ``PageInput`` with the steps of a generation (``page_kwargs()`` passes them to the page)."""

    generation: dict | None = None

    def page_kwargs(self) -> dict[str, Any]:
        return {**super().page_kwargs(), "generation": self.generation}

