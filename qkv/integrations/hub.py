"""A Hugging Face model by its hub id: :func:`resolve_model` turns a name or a folder into a local folder.

``qkv view openai-community/gpt2 "text"`` (and ``--revision``, the notebook's :func:`qkv.notebook.show`,
:func:`qkv.integrations.hf_load.load_model`) takes either a directory written by ``save_pretrained`` or a hub id
``org/name`` (or a legacy ``name``). A hub id is resolved through ``huggingface_hub``: its cache (``HF_HUB_CACHE``,
else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) first, the hub when it is missing there and the network is
allowed (``HF_HUB_OFFLINE=1`` forbids it). Only what qkv reads is fetched: safetensors weights (and their index),
``config.json``, ``generation_config.json`` and the tokenizer's or image processor's files; never a repository's
code or pickled weights (``trust_remote_code`` stays off: a model that needs its own code is refused, saying so).
The snapshot folder then gets every check a local folder gets (:mod:`qkv.integrations.hf_load`).

Every failure is one ``ValueError`` line: a name that is not a hub id, an unknown repository or revision, a model
missing from the cache while offline (with the command that fetches it).

Example::

    from qkv.integrations.hub import resolve_model
    folder = resolve_model("openai-community/gpt2")            # .../models--openai-community--gpt2/snapshots/<hash>
    folder = resolve_model("my-saved-model")                    # a local folder is returned as it is
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from ..options import OptionError, ref

__all__ = ["resolve_model", "is_hub_id", "cache_dir", "offline", "ALLOW_PATTERNS"]

log = logging.getLogger(__name__)

#: the files fetched from the hub: weights in safetensors, the configs, the tokenizer's and image processor's files
ALLOW_PATTERNS = ["*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                  "tokenizer.model", "source.spm", "target.spm", "vocab.model", "preprocessor_config.json",
                  "image_processor_config.json"]

#: a hub id: ``name`` or ``org/name``, letters, digits, ``-``, ``_`` and ``.`` (no ``..``, no leading or trailing
#: ``-``/``.``), at most 96 characters a part
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?:{_PART}/)?{_PART}$")


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a hub id (``org/name`` or ``name``), which a local path like ``./x``,
    ``/abs/x`` or ``a/b/c`` does not."""
    return isinstance(name, str) and bool(_HUB_ID.match(name)) and ".." not in name


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids the network, read when called."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_dir() -> Path:
    """The hub cache ``huggingface_hub`` uses, read from the environment when called: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def _fetch_hint(name: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    include = " ".join(f"'{p}'" for p in ("*.safetensors", "*.json", "*.txt", "*.model"))
    return f"hf download {name}{rev} --include {include}"


def resolve_model(name_or_dir: str | os.PathLike, revision: str | None = None) -> str:
    """The local folder of ``name_or_dir``: an existing directory as it is; a hub id (at ``revision``: a branch, a
    tag or a commit hash; default ``main``) as its snapshot folder in the hub cache, fetched first when it is not
    there and the network is allowed (only the files of :data:`ALLOW_PATTERNS`).

    Raises ``ValueError`` (one line): ``revision`` given with a directory; a name that is neither a directory nor
    a hub id; an unknown repository, revision or a gated one; offline and not cached (saying how to fetch it); a
    model whose ``config.json`` asks for its own code (``auto_map`` with a ``model_type`` transformers does not
    know: qkv never runs a repository's code).
    """
    path = os.fspath(name_or_dir)
    if Path(path).is_dir():
        if revision is not None:
            raise OptionError(ref("revision") + " {rev}: {path} is a local directory (a revision names a version of a "
                              "model on the Hugging Face hub)", "revision", rev=revision, path=path)
        return path
    if not is_hub_id(path):
        raise ValueError(f"{path}: no such directory, and not a Hugging Face hub id (org/name)")
    if revision is not None and (not isinstance(revision, str) or not revision.strip() or "\n" in revision):
        raise OptionError(ref("revision") + " must be a branch, a tag or a commit hash, got {rev!r}", "revision",
                          rev=revision)
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError as e:
        raise ValueError(f"{path}: not a directory; reading a model from the Hugging Face hub needs "
                         "huggingface_hub: pip install 'qkv[hf]'") from e
    local_only = offline()
    at = f" at revision {revision}" if revision else ""
    try:
        folder = huggingface_hub.snapshot_download(path, revision=revision, cache_dir=cache_dir(),
                                                   allow_patterns=ALLOW_PATTERNS, local_files_only=local_only)
    except errors.RevisionNotFoundError as e:
        raise ValueError(f"{path}: no revision {revision!r} on the Hugging Face hub") from e
    except errors.GatedRepoError as e:
        raise ValueError(f"{path} is gated on the Hugging Face hub: accept its terms there and log in "
                         "(hf auth login), then run again") from e
    except errors.RepositoryNotFoundError as e:
        raise ValueError(f"{path}: no such directory, and no model of that name on the Hugging Face hub") from e
    except (errors.LocalEntryNotFoundError, errors.CachedRepoTreeNotFoundError) as e:
        where = cache_dir()
        if local_only:
            raise ValueError(f"{path}{at} is not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE=1 forbids "
                             f"fetching it: fetch it once with network ({_fetch_hint(path, revision)})") from e
        raise ValueError(f"{path}{at}: not in the Hugging Face cache ({where}) and the hub cannot be reached: "
                         f"fetch it with network ({_fetch_hint(path, revision)})") from e
    except errors.HfHubHTTPError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}{at}: the Hugging Face hub answered: {first}") from e
    except (OSError, ValueError) as e:  # a damaged cache entry, a bad revision string...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}{at}: cannot be read from the Hugging Face cache ({first})") from e
    _refuse_remote_code(path, Path(folder))
    log.info("%s%s: snapshot %s", path, at, folder)
    return os.fspath(folder)


def _refuse_remote_code(name: str, folder: Path) -> None:
    """A ``ValueError`` when the snapshot's model needs code from its repository (``trust_remote_code`` is off);
    a model that names code but also has a type transformers knows is read without that code, and said so."""
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{name}: the snapshot {folder} has no config.json (not a transformers model)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # hf_load names the damage
    if not isinstance(data, dict) or "auto_map" not in data:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if data.get("model_type") not in CONFIG_MAPPING:
        raise ValueError(f"{name} needs its own code (auto_map in config.json, model_type "
                         f"{data.get('model_type')!r}); qkv never runs a repository's code (trust_remote_code is off)")
    log.warning("%s names its own code (auto_map); qkv reads it as transformers' %s without running that code "
                "(trust_remote_code is off)", name, data["model_type"])
