"""``qkv view`` for a saved Hugging Face model: every attention of the model on one text, for the offline page.

Example::

    from qkv.integrations.transformers_view import is_hf_model_dir, view_page_input
    from qkv.viz.page import save_attention_page

    if is_hf_model_dir("my-model"):                   # save_pretrained's layout, with its tokenizer
        view = view_page_input("my-model", "the cat sat on the mat")
        save_attention_page("cat.html", view.records, **view.page_kwargs())
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..capture import capture_attention

__all__ = ["is_hf_model_dir", "view_page_input", "load_model"]

#: the longest input read (tokens); the page of a long text is large and slow to draw
MAX_TOKENS = 512


def _page_input_class():
    try:
        from ..viz.page import PageInput
    except ImportError:
        from ..tasks.base import PageInput
    return PageInput


def is_hf_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by ``save_pretrained``: a ``config.json`` naming a ``model_type``
    (a qkv run has a ``checkpoint/`` directory and no such file)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("model_type"), str)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """``(model, tokenizer)`` of a ``save_pretrained`` directory (or a hub name), on qkv's attention backend, in eval
    mode on ``device`` (``auto``: CUDA when there is one): a sequence-to-sequence model with its language-model head
    (to generate), any other without its head.

    Weights are read from safetensors only (qkv never unpickles); a directory with only ``pytorch_model.bin``, or
    no ``transformers`` installed, is a ``ValueError``.
    """
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
    except ImportError as e:  # a ValueError: qkv's command line reports it in one line
        raise ValueError(f"{os.fspath(path)} is a Hugging Face model; reading it needs transformers: "
                         "pip install 'qkv[hf]'") from e

    from .transformers import register

    name = register()
    path = os.fspath(path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AutoConfig.from_pretrained(path)
    cls = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModel
    if Path(path).is_dir() and not any(Path(path).glob("*.safetensors")):
        raise ValueError(f"{path} holds no .safetensors weights (qkv does not read pickled pytorch_model.bin); "
                         "re-save the model with save_pretrained(..., safe_serialization=True)")
    model = cls.from_pretrained(path, attn_implementation=name, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.to(device).eval(), tokenizer


@torch.no_grad()
def view_page_input(path: str | os.PathLike, text: str, device: str | torch.device = "cpu", *,
                    max_new_tokens: int = 20):
    """Every attention of the model saved at ``path`` on ``text``, as the ``PageInput`` of ``qkv view``.

    An encoder or a decoder-only model runs once on the text (token list ``tokens``). A sequence-to-sequence model
    first generates greedily (at most ``max_new_tokens``), then runs once on the text and what it produced, so the
    page has the encoder's self-attention, the decoder's self-attention and the cross-attention (token lists
    ``source`` and ``target``; the target rows are the produced tokens). Inputs longer than :data:`MAX_TOKENS`
    tokens are cut. Raises ``ValueError`` for an empty text.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a Hugging Face model needs a text to look at")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    PageInput = _page_input_class()
    model, tok = load_model(path, device)
    device = model.device
    enc = tok(text, return_tensors="pt", truncation=True, max_length=MAX_TOKENS)
    enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    source = tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    kind = type(model).__name__
    notes = [f"{kind} ({model.config.model_type}) from {os.fspath(path)}, on qkv's attention backend"]
    if getattr(model.config, "is_encoder_decoder", False):
        produced = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
        decoder_in = produced[:, :-1] if produced.shape[1] > 1 else produced
        with capture_attention(model) as records:
            model(**enc, decoder_input_ids=decoder_in)
        target = tok.convert_ids_to_tokens(produced[0, 1:].tolist() or produced[0].tolist())
        output = tok.decode(produced[0], skip_special_tokens=True)
        notes.append("greedy decoding; target rows are the tokens it produced")
        return PageInput(records, {"source": source, "target": target}, title=f"{text} \u2192 {output}", notes=notes)
    with capture_attention(model) as records:
        model(**enc)
    return PageInput(records, source, title=text, notes=notes)
