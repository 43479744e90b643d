"""``qkv view`` for a saved Hugging Face model: every attention of the model on one text, for the offline page.

Example::

    from qkv.integrations.transformers_view import is_hf_model_dir, view_page_input
    from qkv.viz.page import save_attention_page

    if is_hf_model_dir("my-model"):                   # save_pretrained's layout, with its tokenizer
        view = view_page_input("my-model", "the cat sat on the mat")
        save_attention_page("cat.html", view.records, **view.page_kwargs())
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..capture import capture_attention
from ..options import OptionError, ref

__all__ = ["is_hf_model_dir", "view_page_input", "load_model", "view_image_input", "is_image_model", "hf_image_model"]


def _page_input_class():
    from ..viz.page import PageInput  # (the page's own module: no application is needed to show a model)

    return PageInput


def is_hf_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by ``save_pretrained``: a ``config.json`` naming a ``model_type`` or
    ``architectures``, or a damaged ``config.json`` beside a tokenizer's or preprocessor's files (then reading it
    names the damage). A qkv run or checkpoint (``config.json`` holding ``config``) is not."""
    from .hf_load import IMAGE_FILES, TOKENIZER_FILES

    root = Path(path)
    config = root / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        return True
    if isinstance(data, dict) and ("config" in data or "task" in data):
        return False
    return any((root / f).is_file() for f in (*TOKENIZER_FILES, *IMAGE_FILES, "generation_config.json"))


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """``(model, tokenizer)`` of a ``save_pretrained`` directory, on qkv's attention backend, in eval mode on
    ``device``: :func:`qkv.integrations.hf_load.load_model` (every file checked; one-line ``ValueError``)."""
    from .hf_load import load_model as load

    return load(path, device)


@torch.no_grad()
def view_page_input(path: str | os.PathLike | Any, text: str, device: str | torch.device = "cpu", *,
                    max_new_tokens: int = 20, layers: list[int] | None = None, heads: list[int] | None = None,
                    tokenizer: Any = None, revision: str | None = None, importance: bool = False,
                    value_weighted: bool = False, gradient: bool = False):
    """Every attention of the model saved at ``path`` on ``text``, as the ``PageInput`` of ``qkv view``.

    An encoder or a decoder-only model runs once on the text (token list ``tokens``). A sequence-to-sequence model
    generates greedily (at most ``max_new_tokens``) with its attention recorded as it goes
    (:func:`qkv.integrations.generation.view_generation`: encoder self-, decoder self- and cross-attention,
    token lists ``source`` and ``target``). A text longer than the model's positions (``max_position_embeddings``,
    ``n_positions``) is cut there, with a warning and a note on the page; a model with relative positions takes
    it whole. ``layers``, ``heads``: only these are shown (None: all). ``path`` may also be a hub id (at
    ``revision``) or a ``transformers`` model object with its ``tokenizer`` (on qkv's backend for the call).
    ``importance``: each head's :func:`qkv.integrations.importance.head_importance` on the text, for the page's
    head grid and table (a model with a language-model or classification head). ``value_weighted``: beside every
    map its value-weighted view. ``gradient``: beside every self-attention map, attention x gradient for the
    token the model predicts at the last position (its positive part, rows rescaled to 1). Raises ``ValueError``
    for an empty text, an unknown layer or head, and for a directory that cannot be read (naming the file).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a Hugging Face model needs a text to look at")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    from torch import nn

    from .hf_load import fit_tokens, load_model, position_limit, read_config
    from .hub import resolve_model

    given = isinstance(path, nn.Module)
    if given and (tokenizer is None or not callable(tokenizer)):
        raise ValueError("a model object reads a text with its tokenizer: give tokenizer=")
    path = path if given else resolve_model(path, revision)
    config = path.config if given else read_config(path)
    if getattr(config, "is_encoder_decoder", False):
        from .generation import view_generation

        return view_generation(path, text, max_new_tokens, device=device, layers=layers, heads=heads,
                               tokenizer=tokenizer)
    from .generation import check_selection, record_forward

    PageInput = _page_input_class()
    model, tok = (path, tokenizer) if given else load_model(path, device)
    layers, heads = check_selection(model.config, layers, heads)
    device = model.device
    enc = tok(text)
    ids = enc["input_ids"]
    limit, field = position_limit(model.config)
    closing = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    ids, note = fit_tokens(ids, limit, f"{type(model).__name__} takes {limit} positions ({field})",
                           keep_last=1 if closing is not None and ids and ids[-1] == closing else 0)
    x = {"input_ids": torch.tensor([ids], device=device)}
    if "token_type_ids" in enc:
        x["token_type_ids"] = torch.zeros_like(x["input_ids"])
    source = tok.convert_ids_to_tokens(ids)
    where = "the model given" if given else os.fspath(path)
    notes = [f"{type(model).__name__} ({model.config.model_type}) from {where}, on qkv's attention backend"]
    if note:
        notes.append(note)
    from .transformers import on_qkv

    with on_qkv(model):
        records = record_forward(model, layers, heads, **x)
    extra = _measures(model, x, records, importance, value_weighted, notes, getattr(tok, "mask_token_id", None),
                      heads, gradient)
    if layers is not None or heads is not None:
        notes.append(f"shown: layers {'all' if layers is None else ', '.join(map(str, layers))}; heads "
                     f"{'all' if heads is None else ', '.join(map(str, heads))}")
    return PageInput(records + extra.get("records", []), source, title=text, notes=notes,
                     importance=extra.get("importance"))


def _measures(model, x: dict, records: list, importance: bool, value_weighted: bool, notes: list[str],
              mask_id: int | None, heads: list[int] | None, gradient: bool = False) -> dict:
    """The page's measures beside the weights: ``importance`` ({record name: per-head nats}) and value-weighted
    records (``records``), for the layers and heads of ``records``."""
    out: dict[str, Any] = {}
    if importance:
        from .importance import head_importance

        scores = head_importance(model, x["input_ids"], mask_token_id=mask_id)
        scores = scores if heads is None else scores[:, heads]
        out["importance"] = {r.name: scores[r.layer].tolist() for r in records
                             if r.layer is not None and r.layer < len(scores) and r.kind == "self"}
        notes.append("head importance: increase of the mean loss (nats) with one head's output zeroed")
    if value_weighted:
        from .importance import value_weighted_records

        names = {r.name for r in records}
        _, weighted = value_weighted_records(model, **x)
        out["records"] = [w for w in weighted if w.name.removeprefix("value-weighted ") in names]
    if gradient:
        from .importance import attention_gradient
        from .importance import value_weighted as rescale

        maps, token = attention_gradient(model, x["input_ids"])
        selfs = sorted((r for r in records if r.kind == "self" and r.layer is not None), key=lambda r: r.layer)
        for r in selfs:
            g = maps[r.layer].clamp_min(0)[None]
            g = g if heads is None else g[:, heads]
            ones = torch.ones(g.shape[:-2] + g.shape[-1:])
            out.setdefault("records", []).append(dataclasses.replace(r, name=f"attention x gradient {r.name}",
                                                                     weights=rescale(g, ones)))
        notes.append(f"attention x gradient: for token id {token} predicted at the last position")
    return out



def _first_number(name: str) -> int | None:
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[0]) if numbers else None


def is_image_model(config) -> bool:
    """Whether a ``transformers`` config is that of a vision transformer over patches (ViT, DeiT, BEiT...)."""
    return hasattr(config, "patch_size") and hasattr(config, "image_size") and not hasattr(config, "vocab_size")


def _pixels(path: str | os.PathLike | None, image: Any, config, processor: Any = None) -> tuple[torch.Tensor, Any]:
    """``(pixel_values (1, C, H, W), PIL image shown)``: the directory's image processor when it has one, else
    the image resized to the model's size and normalised to mean 0.5, std 0.5 (ViT's default)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as im:
                im.load()
                pil = im.convert("RGB" if getattr(config, "num_channels", 3) == 3 else "L")
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise ValueError(f"{image}: not an image that can be read ({str(e).splitlines()[0] if str(e) else e})") \
                from e
    else:
        pil = image
    if processor is not None:
        return processor(images=pil, return_tensors="pt")["pixel_values"], pil
    if path is not None and (Path(path) / "preprocessor_config.json").is_file():
        from transformers import AutoImageProcessor

        from .hf_load import _first_line, _quiet

        try:
            with _quiet():
                processor = AutoImageProcessor.from_pretrained(os.fspath(path), use_fast=False)
            return processor(images=pil, return_tensors="pt")["pixel_values"], pil
        except Exception as e:
            raise ValueError(f"{Path(path) / 'preprocessor_config.json'}: {_first_line(e)}") from e
    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    import numpy as np

    x = torch.from_numpy(np.asarray(pil.resize((size, size), Image.BILINEAR), dtype=np.float32).copy()) / 255
    x = (x[..., None] if x.dim() == 2 else x).permute(2, 0, 1)
    return ((x - 0.5) / 0.5)[None], pil


@torch.no_grad()
def view_image_input(path: str | os.PathLike | Any, image: Any, device: str | torch.device = "cpu", *,
                     layers: list[int] | None = None, heads: list[int] | None = None, processor: Any = None,
                     revision: str | None = None):
    """Every attention of the image classifier saved at ``path`` (a ViT-style model over patches) on ``image``
    (a path or a PIL image), as the ``PageInput`` of ``qkv view DIR --image FILE``: each layer's self-attention,
    the attention of the class token over the patches of each layer and of the rollout (drawn on the image), and
    the predicted class in the title. ``path`` may also be a hub id (at ``revision``) or a ``transformers``
    model object (on qkv's backend for the call; ``processor``: its image processor, else ViT's default
    normalisation)."""
    from torch import nn

    from ..capture import AttentionRecord, attention_rollout
    from .generation import check_selection
    from .hf_load import load_model, read_config
    from .hub import resolve_model
    from .transformers import on_qkv

    given = isinstance(path, nn.Module)
    path = path if given else resolve_model(path, revision)
    config = path.config if given else read_config(path)
    where = "the model given" if given else os.fspath(path)
    if not is_image_model(config):
        raise OptionError("{where}: {kind} is not an image model over patches (" + ref("image") + " needs one)",
                          "image", where=where, kind=config.model_type)
    model = path if given else load_model(path, device, tokenizer=False)[0]
    layers, heads = check_selection(model.config, layers, heads)
    pixels, pil = _pixels(None if given else path, image, model.config, processor)
    with on_qkv(model), capture_attention(model) as records:
        logits = model(pixel_values=pixels.to(model.device)).logits[0].float().cpu()
    size = model.config.image_size if isinstance(model.config.image_size, int) else model.config.image_size[0]
    patch = model.config.patch_size if isinstance(model.config.patch_size, int) else model.config.patch_size[0]
    side = size // patch
    selfs = [r for r in records if r.kind == "self"]
    if not selfs:
        raise ValueError(f"{where}: {type(model).__name__} ran no attention through qkv's backend")
    specials = selfs[0].weights.shape[-1] - side * side
    grid = ((1, 1), (side, side))
    notes = [f"{type(model).__name__} ({model.config.model_type}) from {where}, on qkv's attention backend",
             f"{side} x {side} patches of {patch} pixels; class token: position 0"
             + (f" ({specials} special tokens before the patches)" if specials > 1 else "")]
    shown = [r for r in selfs if layers is None or _first_number(r.name) in layers]
    out = [dataclasses.replace(r, weights=r.weights if heads is None else r.weights[:, heads]) for r in shown]
    out += [AttentionRecord(f"class token of {r.name}", r.module, "pooling", r.layer,
                            r.weights[:, :, :1, specials:], grid=grid) for r in out]
    rolled = attention_rollout([r.weights for r in selfs])  # (1, T, T), every layer and head
    out.append(AttentionRecord("class token of the rollout", "rollout", "pooling", None,
                               rolled[:, None, :1, specials:], grid=grid))
    p = logits.softmax(-1)
    best = int(p.argmax())
    label = (getattr(model.config, "id2label", None) or {}).get(best, str(best))
    title = f"{Path(image).name if isinstance(image, (str, os.PathLike)) else 'image'}: {label} ({float(p[best]):.2f})"
    if layers is not None or heads is not None:
        notes.append(f"shown: layers {'all' if layers is None else ', '.join(map(str, layers))}; heads "
                     f"{'all' if heads is None else ', '.join(map(str, heads))}")
    return _page_input_class()(out, None, image=pil, title=title, notes=notes)


def hf_image_model(path: str | os.PathLike) -> bool:
    """Whether the Hugging Face directory ``path`` holds an image model over patches (its config read and checked:
    a bad one is a ``ValueError`` naming it)."""
    from .hf_load import read_config

    return is_image_model(read_config(path))
