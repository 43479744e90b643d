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

import torch

from ..capture import capture_attention

__all__ = ["is_hf_model_dir", "view_page_input", "load_model"]


def _page_input_class():
    try:
        from ..viz.page import PageInput
    except ImportError:
        from ..tasks.base import PageInput
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
def view_page_input(path: str | os.PathLike, text: str, device: str | torch.device = "cpu", *,
                    max_new_tokens: int = 20, layers: list[int] | None = None, heads: list[int] | None = None):
    """Every attention of the model saved at ``path`` on ``text``, as the ``PageInput`` of ``qkv view``.

    An encoder or a decoder-only model runs once on the text (token list ``tokens``). A sequence-to-sequence model
    generates greedily (at most ``max_new_tokens``) with its attention recorded as it goes
    (:func:`qkv.integrations.generation.view_generation`: encoder self-, decoder self- and cross-attention,
    token lists ``source`` and ``target``). A text longer than the model's positions (``max_position_embeddings``,
    ``n_positions``) is cut there, with a warning and a note on the page; a model with relative positions takes
    it whole. ``layers``, ``heads``: only these are shown (None: all). Raises ``ValueError`` for an empty text,
    an unknown layer or head, and for a directory that cannot be read (naming the file).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a Hugging Face model needs a text to look at")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    from .hf_load import fit_tokens, load_model, position_limit, read_config

    if getattr(read_config(path), "is_encoder_decoder", False):
        from .generation import view_generation

        return view_generation(path, text, max_new_tokens, device=device, layers=layers, heads=heads)
    from .generation import check_selection

    PageInput = _page_input_class()
    model, tok = load_model(path, device)
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
    notes = [f"{type(model).__name__} ({model.config.model_type}) from {os.fspath(path)}, on qkv's attention backend"]
    if note:
        notes.append(note)
    with capture_attention(model) as records:
        model(**x)
    if layers is not None or heads is not None:
        records = [dataclasses.replace(r, weights=r.weights if heads is None else r.weights[:, heads])
                   for r in records if layers is None or _first_number(r.name) in layers]
        notes.append(f"shown: layers {'all' if layers is None else ', '.join(map(str, layers))}; heads "
                     f"{'all' if heads is None else ', '.join(map(str, heads))}")
    return PageInput(records, source, title=text, notes=notes)


def _first_number(name: str) -> int | None:
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[0]) if numbers else None
