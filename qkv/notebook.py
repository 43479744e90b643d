"""The attention page in a notebook: an object that Jupyter (and VS Code) shows inline, and that saves as a file.

:func:`show` returns the page of a trained run, a saved Hugging Face model, or any model of your own on an input,
as an :class:`AttentionPage`. It is the page ``qkv view`` writes (the same :func:`qkv.viz.page.attention_page`),
self-contained: its script, style and data are inline, nothing is fetched, so it works offline. In a notebook it is
shown in an ``<iframe srcdoc=...>``, which keeps the page's script and style apart from the notebook's own.

Example (a model of your own; a run is ``show("runs/demo", "7 mars 2019")``)::

    import torch
    import qkv
    from qkv.notebook import show

    model = qkv.MultiHeadAttention(16, num_heads=4).eval()
    page = show(model, torch.randn(1, 6, 16), tokens="a b c d e f".split())
    page            # the last expression of a cell: drawn inline
    page.save("attention.html")
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .capture import capture_attention
from .viz.page import attention_page

__all__ = ["AttentionPage", "show", "page_of_records"]

log = logging.getLogger(__name__)


class AttentionPage:
    """One attention page: its HTML, drawn inline by Jupyter (``_repr_html_``) and written by :meth:`save`.

    Args:
        page: the HTML of the whole page (from :func:`qkv.viz.page.attention_page`).
        height: of the inline frame, in pixels.
    """

    def __init__(self, page: str, *, height: int = 720):
        if not isinstance(page, str) or "<html" not in page[:200]:
            raise ValueError("AttentionPage needs the HTML of a page (qkv.viz.page.attention_page)")
        if height < 100:
            raise ValueError(f"height must be at least 100 pixels, got {height}")
        self.html = page
        self.height = height

    def _repr_html_(self) -> str:
        """An ``<iframe>`` whose ``srcdoc`` is the page: its script runs inside the frame only (``sandbox`` allows
        scripts and the page's own SVG/PNG downloads, nothing of the notebook's origin)."""
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" sandbox="allow-scripts allow-downloads" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd" '
                f'title="qkv attention page"></iframe>')

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page to ``path`` (``.html`` added when it has no extension; atomically). Returns the path."""
        from .viz.files import page_path, write_atomic

        path = page_path(path)
        return write_atomic(path, self.html)

    def __repr__(self) -> str:
        return f"AttentionPage({len(self.html) / 1e6:.2f} MB)"


def page_of_records(records: Sequence, *, height: int = 720, **kwargs: Any) -> AttentionPage:
    """The page of records captured by :func:`qkv.capture_attention`; ``kwargs`` are those of
    :func:`qkv.viz.page.attention_page` (``tokens``, ``image``, ``title``, ``rollout``...)."""
    return AttentionPage(attention_page(records, **kwargs), height=height)


def _hf_model_dir(path: str | os.PathLike) -> bool:
    try:
        from .integrations.transformers_view import is_hf_model_dir
    except ImportError:  # transformers is not installed: no directory can be one
        return False
    return is_hf_model_dir(path)


def show(source: Any, *inputs: Any, tokens: Any = None, image: Any = None, index: int | None = None,
         question: str | None = None, title: str | None = None, rollout: bool = True, device: str = "cpu",
         height: int = 720, generate: int | None = None, revision: str | None = None, importance: bool = False,
         **model_kwargs: Any) -> AttentionPage:
    """The attention page of ``source`` on one input, as an :class:`AttentionPage`.

    Args:
        source: one of
            - a run directory of any qkv application (what ``qkv train`` wrote): ``inputs`` is one text, or give
              ``image=``/``index=`` (image applications) and ``question=`` (question answering);
            - a saved Hugging Face model directory (``save_pretrained``'s layout with its tokenizer) or a hub id
              (``org/name``, at ``revision``; from the Hugging Face cache, else fetched): one text;
            - a ``transformers`` model object and its tokenizer, ``show(model, tokenizer, "text")``, or an image
              model and an image, ``show(vit, image=img)`` (its image processor may come first): the model runs on
              qkv's attention backend for the call and is put back on its own afterwards;
            - any other ``torch.nn.Module`` (a model of your own, or a Hugging Face model on qkv's backend):
              ``inputs`` and ``model_kwargs`` are passed to it as they are, once, inside
              :func:`qkv.capture_attention`, and ``tokens`` labels the sequence axes (a list, or named lists
              ``{"source": ..., "target": ...}``).
        generate: a Hugging Face text model (a directory, a hub id or an object with its tokenizer) generates up to
            this many tokens from the text, its attention recorded at every step.
        importance: a Hugging Face text model with a language-model or classification head: each head's importance
            (:func:`qkv.integrations.importance.head_importance`) colours the head grid and joins the table.
        title: of the page (default: the application's, or the model's class name).
        rollout: add attention rollout for each stack of self-attention layers.
        device: where a run or a saved model is loaded.
        height: of the frame in the notebook, in pixels.

    Raises ``ValueError`` for a source that is none of these, an input that does not fit it, or a model that ran
    no qkv attention.
    """
    if isinstance(source, nn.Module) and _hf_object(source, inputs, image):
        given = _show_hf_object(source, inputs, image=image, generate=generate, importance=importance)
        kwargs = given.page_kwargs()
        if title is not None:
            kwargs["title"] = title
        return page_of_records(given.records, rollout=rollout, height=height, **kwargs)
    if generate is not None and not isinstance(source, (str, os.PathLike)):
        raise ValueError("generate= needs a Hugging Face text model: a directory, a hub id, or a model object "
                         "with its tokenizer")
    if isinstance(source, nn.Module):
        return _show_module(source, inputs, model_kwargs, tokens=tokens, image=image, title=title,
                            rollout=rollout, height=height)
    if model_kwargs:
        raise ValueError(f"{', '.join(sorted(model_kwargs))}: keyword arguments go to a model object only")
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"show needs a run directory, a saved Hugging Face model directory or a torch.nn.Module, "
                         f"got {type(source).__name__}")
    if not Path(source).is_dir() or revision is not None:
        from .integrations.hub import is_hub_id, resolve_model

        if revision is None and not is_hub_id(os.fspath(source)):
            raise ValueError(f"{os.fspath(source)}: no such run or model directory")
        source = resolve_model(source, revision)
    if len(inputs) > 1:
        raise ValueError(f"show draws one input at a time, got {len(inputs)}")
    text = inputs[0] if inputs else None
    if text is not None and not isinstance(text, str):
        raise ValueError(f"the input of a run or a saved model is a text, got {type(text).__name__}")
    if _hf_model_dir(source):
        from .integrations.transformers_view import view_page_input

        if image is not None or index is not None or question is not None:
            raise ValueError("a Hugging Face model directory takes a text only (no image, index or question)")
        if text is None:
            raise ValueError("a Hugging Face model needs a text to look at")
        if generate is not None:
            from .integrations.generation import view_generation

            given = view_generation(source, text, generate, device=device)
        else:
            given = view_page_input(source, text, device=device, importance=importance)
    else:
        if generate is not None or importance:
            raise ValueError("generate= and importance= apply to Hugging Face models")
        from .apps import ViewInput, load_predictor

        if text is None and image is None and index is None:
            raise ValueError("give the input to look at: a text, image= or index=")
        given = load_predictor(source, device).view(ViewInput(text=text, image=image, index=index,
                                                              question=question))
    kwargs = given.page_kwargs()
    if title is not None:
        kwargs["title"] = title
    return page_of_records(given.records, rollout=rollout, height=height, **kwargs)


def _hf_object(model: nn.Module, inputs: tuple, image: Any) -> bool:
    """Whether ``show(model, ...)`` is a ``transformers`` model with its tokenizer (or an image model and an
    image), rather than a model called on its inputs as they are."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        return False
    if inputs and hasattr(inputs[0], "convert_ids_to_tokens") and callable(inputs[0]):
        return True
    from .integrations.transformers_view import is_image_model

    return is_image_model(model.config) and (image is not None or (inputs and not isinstance(inputs[-1], Tensor)))


def _show_hf_object(model: nn.Module, inputs: tuple, *, image: Any, generate: int | None, importance: bool):
    from .integrations import transformers_view as view

    if view.is_image_model(model.config):
        processor = inputs[0] if len(inputs) > 1 or (inputs and image is not None) else None
        picture = image if image is not None else inputs[-1]
        if generate is not None or importance:
            raise ValueError("an image model shows its attention on one image (no generate= or importance=)")
        return view.view_image_input(model, picture, processor=processor)
    tokenizer, rest = inputs[0], inputs[1:]
    if len(rest) != 1 or not isinstance(rest[0], str):
        raise ValueError("show(model, tokenizer, text): give one text after the tokenizer")
    if generate is not None:
        from .integrations.generation import view_generation

        if importance:
            raise ValueError("importance= measures a text as it is (no generate=)")
        return view_generation(model, rest[0], generate, tokenizer=tokenizer)
    return view.view_page_input(model, rest[0], tokenizer=tokenizer, importance=importance)


def _show_module(model: nn.Module, inputs: tuple, model_kwargs: dict, *, tokens: Any, image: Any,
                 title: str | None, rollout: bool, height: int) -> AttentionPage:
    if not inputs and not model_kwargs:
        raise ValueError("give the model's inputs: show(model, *inputs, **kwargs) calls model(*inputs, **kwargs)")
    with torch.no_grad(), capture_attention(model) as records:
        model(*inputs, **model_kwargs)
    if not records:
        raise ValueError(f"{type(model).__name__} ran no qkv attention: build it from qkv's layers, or load a "
                         "Hugging Face model with attn_implementation set to qkv's backend")
    return page_of_records(records, tokens=tokens, image=image, title=title or type(model).__name__,
                           rollout=rollout, height=height)
