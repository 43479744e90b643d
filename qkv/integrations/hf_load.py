"""Reading a saved Hugging Face model directory with checks that name the file: what ``qkv view DIR`` loads.

A directory written by ``save_pretrained`` holds ``config.json``, the weights (``model.safetensors`` or shards
listed in ``model.safetensors.index.json``) and, for text models, the tokenizer's files. Each is checked before
``transformers`` sees it, so that a bad directory is one ``ValueError`` naming the file, never a traceback or a
page of ``[UNK]``:

- ``config.json``: readable JSON with a ``model_type`` that this ``transformers`` knows, whose values build a model;
- the weights: safetensors only (qkv never unpickles), every file's header readable and every tensor inside the
  file (a truncated download is caught here), every tensor of the right shape for the config;
- the tokenizer: one of its files present, and a vocabulary of more than its special tokens.

The model is loaded as the class it was saved as (``config.architectures``), so a ``...ForCausalLM`` keeps its head
and ``transformers`` has nothing to report; its load report is never printed: what it would say is checked here.

Example::

    from qkv.integrations.hf_load import load_model, position_limit
    model, tokenizer = load_model("my-gpt2", generate=True)
    position_limit(model.config)          # (1024, "n_positions")
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch

from ..options import OptionError, ref

__all__ = ["load_model", "read_config", "check_weights", "check_tokenizer_files", "check_vocabulary", "position_limit",
           "fit_tokens"]

log = logging.getLogger(__name__)

#: files any of which holds a tokenizer's vocabulary
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "source.spm", "vocab.model", "merges.txt")
#: files of an image model's preprocessing (an image model needs no tokenizer)
IMAGE_FILES = ("preprocessor_config.json", "image_processor_config.json")

#: model types whose learned positions start after the padding index (usable: max_position_embeddings - pad - 1)
PADDED_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "ibert", "xmod",
                    "roberta-prelayernorm", "mpnet", "esm")


def _require_transformers(path: str):
    try:
        import transformers
    except ImportError as e:  # a ValueError: qkv's command line reports it in one line
        raise ValueError(f"{path} is a Hugging Face model; reading it needs transformers: pip install 'qkv[hf]'") \
            from e
    return transformers


@contextlib.contextmanager
def _quiet():
    """``transformers``' warnings, load report and progress bars off (its checks are made here instead)."""
    from transformers.utils import logging as tf_logging

    level = tf_logging.get_verbosity()
    bars = tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tf_logging.set_verbosity(level)
        if bars:
            tf_logging.enable_progress_bar()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def read_config(path: str | os.PathLike):
    """The ``transformers`` config of the directory ``path``; a ``ValueError`` naming ``config.json`` if it cannot
    be read, names a ``model_type`` that ``transformers`` does not know, or holds values that build no model."""
    transformers = _require_transformers(os.fspath(path))
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: not a readable JSON config ({_first_line(e)})") from e
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ValueError(f"{file}: no model_type (a config.json written by save_pretrained names one)")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if data["model_type"] not in CONFIG_MAPPING:
        raise ValueError(f"{file}: unknown model_type {data['model_type']!r} (transformers "
                         f"{transformers.__version__} does not know it)")
    try:
        with _quiet():
            return transformers.AutoConfig.from_pretrained(os.fspath(path))
    except Exception as e:  # transformers' own validation: ValueError, TypeError, KeyError...
        raise ValueError(f"{file}: {_first_line(e)}") from e


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: not a readable safetensors index ({_first_line(e)})") from e
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ValueError(f"{index}: names {missing[0]}, which is missing ({len(missing)} of {len(shards)} "
                             "shards missing)")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors weights (qkv does not read pickled pytorch_model.bin); "
                         "re-save the model with save_pretrained(..., safe_serialization=True)")
    return files


def check_weights(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{tensor name: shape}`` of the safetensors weights in ``path``; a ``ValueError`` naming the file when one is
    damaged or truncated (a header that does not parse, or tensors that reach past the end of the file)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in _weight_files(Path(path)):
        size = file.stat().st_size
        try:
            with open(file, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError("shorter than a safetensors header")
                n = int.from_bytes(head, "little")
                if n > size - 8:
                    raise ValueError(f"its header promises {n} bytes, the file has {size - 8}")
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end > size:
                raise ValueError(f"truncated: its tensors need {8 + n + end} bytes, the file has {size}")
            with safe_open(os.fspath(file), framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 (a safe_open handle)
                    shapes[k] = tuple(f.get_slice(k).get_shape())
        except Exception as e:  # safetensors' own errors, JSON, KeyError, TypeError: one line naming the file
            raise ValueError(f"{file}: damaged or truncated safetensors file ({_first_line(e)})") from e
    return shapes


def check_tokenizer_files(path: str | os.PathLike) -> None:
    """A ``ValueError`` when the directory holds none of a tokenizer's files (``transformers`` would build an empty
    tokenizer and every word would be unknown)."""
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{path} holds no tokenizer files (one of {', '.join(TOKENIZER_FILES[:4])}...): save the "
                         "model's tokenizer there too, with tokenizer.save_pretrained(DIR)")


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved in ``path`` (checked: its files exist and its vocabulary is more than special tokens)."""
    check_tokenizer_files(path)
    from transformers import AutoTokenizer

    try:
        with _quiet():
            tok = AutoTokenizer.from_pretrained(os.fspath(path))
    except Exception as e:
        raise ValueError(f"{path}: the tokenizer files cannot be read ({_first_line(e)})") from e
    specials = set(getattr(tok, "all_special_tokens", []) or [])
    if len(tok) <= len(specials) + 1:
        raise ValueError(f"{path}: the tokenizer's vocabulary is empty ({len(tok)} entries): its files are "
                         "incomplete; save the model's tokenizer there with tokenizer.save_pretrained(DIR)")
    return tok


def _model_class(config, generate: bool, image: bool = False):
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    if image:
        return transformers.AutoModelForImageClassification
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModelForCausalLM if generate else transformers.AutoModel


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", *, generate: bool = False,
               tokenizer: bool = True, attn_implementation: str | None = None, revision: str | None = None):
    """``(model, tokenizer)`` of a ``save_pretrained`` directory, on qkv's attention backend (or
    ``attn_implementation``), in eval mode on ``device`` (``auto``: CUDA when there is one).

    The model is the class it was saved as (``config.architectures``; else an encoder-decoder with its language
    head, a decoder with its head when ``generate``, any other without). ``generate``: the model must be able to
    generate (a ``ValueError`` otherwise). ``tokenizer=False`` (image models): None instead of a tokenizer.
    Every check of this module's docstring is made first; any failure is a one-line ``ValueError`` naming the file.
    ``path`` may be a hub id (at ``revision``), read from the Hugging Face cache or fetched
    (:func:`qkv.integrations.hub.resolve_model`); the snapshot gets the same checks. A tokenizer whose ids reach
    past the model's embedding table is refused, naming both sizes.
    """
    from .hub import resolve_model
    from .transformers import register

    _require_transformers(os.fspath(path))
    path = resolve_model(path, revision)
    if not Path(path).is_dir():
        raise ValueError(f"{path}: not a directory (a saved Hugging Face model is a directory)")
    config = read_config(path)
    shapes = check_weights(path)
    tok = load_tokenizer(path) if tokenizer else None
    name = attn_implementation or register()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cls = _model_class(config, generate, image=not tokenizer)
    try:
        with _quiet():
            model, info = cls.from_pretrained(path, config=config, attn_implementation=name, use_safetensors=True,
                                              output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as e:
        raise ValueError(f"{Path(path) / 'config.json'} does not fit the weights in {path} ({_first_line(e)})") \
            from e
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        first = mismatched[0]
        key = first[0] if isinstance(first, (tuple, list)) else first
        got = next((v for k, v in shapes.items() if k == key or k.endswith("." + key) or key.endswith("." + k)), None)
        want = dict(model.named_parameters()).get(key)
        detail = f": {key} is {list(got) if got else '?'} in the weights, " \
                 f"{list(want.shape) if want is not None else '?'} by the config" if got or want is not None else ""
        raise ValueError(f"{Path(path) / 'config.json'} does not fit the weights{detail} "
                         f"({len(mismatched)} tensor(s) of another shape)")
    missing = [k for k in info.get("missing_keys") or [] if not _tied_or_buffer(model, k)]
    if missing:
        head = all(k.split(".")[0] in ("lm_head", "classifier", "cls", "score", "qa_outputs") for k in missing)
        if head and (generate or not tokenizer):
            raise ValueError(f"{path}: the weights have no {'generation' if generate else 'classification'} head "
                             f"({missing[0]} is missing): a model saved without its head cannot "
                             f"{'generate' if generate else 'classify'}")
        if not head:
            raise ValueError(f"{Path(path) / 'config.json'} does not fit the weights in {path}: {missing[0]} is "
                             f"missing ({len(missing)} tensor(s) missing)")
        log.info("%s: %d tensor(s) of the head are not in the weights (%s)", path, len(missing), missing[0])
    if generate and not model.can_generate():
        raise OptionError("{path}: {kind} has no generation head (" + ref("generate") + " needs a ...ForCausalLM or "
                          "...ForConditionalGeneration model)", "generate", path=path, kind=type(model).__name__)
    if tok is not None:
        check_vocabulary(tok, model, path)
    return model.to(device).eval(), tok


def check_vocabulary(tok, model, path: str | os.PathLike) -> None:
    """A ``ValueError`` naming both sizes when the tokenizer can give ids past the model's embedding table (each
    would be an ``IndexError`` inside the model)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int) and len(tok) > rows:
        raise ValueError(f"{path}: the tokenizer has {len(tok)} ids but the model's embedding table has {rows} rows "
                         f"(ids {rows}-{len(tok) - 1} would index past it): the tokenizer is not this model's")


def _tied_or_buffer(model, key: str) -> bool:
    """Whether a missing key is a weight tied to another (an output embedding) or a buffer the model makes itself."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    names = tied.keys() if isinstance(tied, dict) else tied
    if any(key == t or key.endswith(t) for t in names):
        return True
    params = dict(model.named_parameters(remove_duplicate=False))
    return key not in params


def position_limit(config) -> tuple[int | None, str | None]:
    """``(positions, field)``: the most tokens the model takes, from ``max_position_embeddings`` or
    ``n_positions`` (less the padding offset of RoBERTa-like models); ``(None, None)`` for relative positions."""
    saved = config.to_dict()  # the names in config.json (GPT-2's n_positions is also max_position_embeddings)
    fields = ("max_position_embeddings", "n_positions", "max_target_positions", "n_ctx")
    for field in sorted(fields, key=lambda f: f not in saved):
        value = saved.get(field, getattr(config, field, None))
        if isinstance(value, int) and value > 0:
            if getattr(config, "model_type", "") in PADDED_POSITIONS:
                value -= (getattr(config, "pad_token_id", None) or 0) + 1
            return value, field
    return None, None


def fit_tokens(ids: list[int], limit: int | None, what: str, *, keep_last: int = 0) -> tuple[list[int], str | None]:
    """``ids`` cut to ``limit`` tokens (keeping the last ``keep_last``, e.g. a closing special token) and the note
    that says so (logged as a warning), or ``ids`` and None when they fit."""
    if limit is None or len(ids) <= limit:
        return ids, None
    cut = ids[:limit - keep_last] + (ids[len(ids) - keep_last:] if keep_last else [])
    note = f"the text has {len(ids):,} tokens; {what}: cut to the first {len(cut):,}"
    log.warning("warning: %s", note)
    return cut, note
