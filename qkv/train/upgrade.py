"""Checkpoint format version 1 (qkv 0.1.0) read as the current one: :func:`upgrade` is the one function that does it,
for every application, beside the checkpoint format of :mod:`qkv.train.checkpoint`.

Format 1 stored an application's model settings its own way (``{"model": KIND, "arch": {...}, "options": ...}`` for
translation and sentiment, the settings at the top level for images) and older parameter names. :func:`upgrade` maps
the configuration to format 2's ``{"model": {"name", "config"}, "options": {...}, ...}`` (option names renamed; the
loader then drops unknown ones and resets those that do not apply) and renames the weights
(:func:`upgrade_state_dict`). Applications that began with format 2 have no format-1 runs: :func:`upgrade` refuses
them with a ``ValueError``.

Parameter names:
0.1.0 had its own Transformer layers in the seq2seq model and in the text classifier, and CBAM's channel gate
kept its MLP in an ``nn.Sequential``; they are now :class:`qkv.layers.TransformerLayer` and
:class:`qkv.vision.SqueezeExcite`'s ``fc1``/``fc2``. :func:`upgrade_state_dict` renames the keys (the tensors
are the same objects); the arithmetic of every model is unchanged, so an upgraded state dict gives the outputs it
gave (the text classifier's sinusoids are now computed in float64, as the translation model's were: outputs move
by ~1e-7). Keys already in the new form, and those of models whose names did not change, pass through.

The constructor arguments changed names too (mapped by :func:`upgrade`'s per-application configuration): the
Transformer's ``d_model, heads, encoder_layers, decoder_layers`` are ``dim, num_heads, num_layers,
num_decoder_layers``; ``RNNConfig.layers`` is ``num_layers``; the RNN classifier's ``rnn`` is ``cell`` and its
``hidden_dim`` is both directions together (twice 0.1.0's); ``ff_dim`` is ``ffn_dim``; the CIFAR stem is
``stem="cifar"``.

Renames, by model name of :func:`qkv.models.create` (``N`` a layer index, ``*`` any prefix)::

    transformer             encoder.N.norm1.*        -> encoder.N.attn_norm.*
                            encoder.N.norm2.*        -> encoder.N.ffn_norm.*
                            decoder.N.norm1.*        -> decoder.N.attn_norm.*
                            decoder.N.norm2.*        -> decoder.N.cross_norm.*
                            decoder.N.norm3.*        -> decoder.N.ffn_norm.*
                            src_pos.weight           -> src_pos.table.weight      (learned positions)
                            tgt_pos.weight           -> tgt_pos.table.weight
    transformer-classifier  layers.N.norm1.*         -> layers.N.attn_norm.*
                            layers.N.attn.*          -> layers.N.self_attn.*
                            layers.N.norm2.*         -> layers.N.ffn_norm.*
                            layers.N.ff.0.*          -> layers.N.ffn.fc1.*
                            layers.N.ff.3.*          -> layers.N.ffn.fc2.*
    small-cnn, resnet*,     *.mlp.0.*                -> *.fc1.*                   (CBAM's channel gate)
    sknet50                 *.mlp.2.*                -> *.fc2.*
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..models.registry import MODELS

__all__ = ["upgrade", "upgrade_state_dict", "RENAMES"]

_CBAM = {"mlp.0": "fc1", "mlp.2": "fc2"}  # CBAM's channel gate, wherever it sits in an image model

#: by model name: ``{stack: {old submodule: new submodule}}`` renames a submodule in every layer ``stack.N``
#: (the stack ``"*"``: at any depth); ``{"": {old key: new key}}`` renames whole keys
RENAMES: dict[str, dict[str, dict[str, str]]] = {
    "transformer": {"encoder": {"norm1": "attn_norm", "norm2": "ffn_norm"},
                    "decoder": {"norm1": "attn_norm", "norm2": "cross_norm", "norm3": "ffn_norm"},
                    "": {"src_pos.weight": "src_pos.table.weight", "tgt_pos.weight": "tgt_pos.table.weight"}},
    "transformer-classifier": {"layers": {"norm1": "attn_norm", "attn": "self_attn", "norm2": "ffn_norm",
                                          "ff.0": "ffn.fc1", "ff.3": "ffn.fc2"}},
    **{name: {"*": _CBAM} for name in ("small-cnn", "resnet18", "resnet34", "resnet50", "resnet101", "sknet50")},
}


def _rules(renames: dict[str, dict[str, str]]) -> list[tuple[re.Pattern, str]]:
    rules = []
    for stack, names in renames.items():
        for old, new in names.items():
            if stack == "":
                rules.append((re.compile(f"^{re.escape(old)}$"), new))
            elif stack == "*":
                rules.append((re.compile(rf"^(.*\.)?{re.escape(old)}\."), rf"\g<1>{new}."))
            else:
                rules.append((re.compile(rf"^({re.escape(stack)}\.\d+)\.{re.escape(old)}\."), rf"\g<1>.{new}."))
    return rules


_COMPILED = {name: _rules(renames) for name, renames in RENAMES.items()}


def upgrade_state_dict(name: str, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state_dict`` of the model ``name`` (a :func:`qkv.models.create` name) as written by qkv 0.1.0, with the
    parameter names of today's modules (see the module docstring). Returns a new dict with the same tensors."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    rules = _COMPILED.get(name, ())
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        for pattern, replacement in rules:
            new, n = pattern.subn(replacement, key, count=1)
            if n:
                key = new
                break
        if key in out:
            raise ValueError(f"two keys of the state dict map to {key!r}: it mixes old and new names")
        out[key] = value
    return out


_SIZES = {"layers": "num_layers", "heads": "num_heads"}  # option names of format 1 -> now


def _renamed(options: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    return {renames.get(k, k): v for k, v in options.items()}


def _translate(config: dict[str, Any]) -> dict[str, Any]:
    kind, arch = config["model"], dict(config["arch"])
    renames = dict(_SIZES)
    if kind == "transformer":
        arch = {"src_vocab": arch["src_vocab"], "tgt_vocab": arch["tgt_vocab"], "dim": arch["d_model"],
                "num_heads": arch["heads"], "ffn_dim": arch["ffn_dim"], "num_layers": arch["encoder_layers"],
                "num_decoder_layers": arch["decoder_layers"], "dropout": arch["dropout"], "score": arch["score"]}
        renames["hidden_dim"] = "dim"
    else:
        arch["num_layers"] = arch.pop("layers")
    return {"model": {"name": kind, "config": arch}, "options": _renamed(config["options"], renames)}


def _sentiment(config: dict[str, Any]) -> dict[str, Any]:
    """(The RNN's ``hidden_dim`` was per direction in format 1; it is both directions together now.)"""
    old, kind, arch = dict(config["options"]), config["model"], dict(config["arch"])
    renames = dict(_SIZES)
    if kind == "transformer":
        renames["hidden_dim"] = "dim"
    else:
        old["hidden_dim"] = 2 * old["hidden_dim"]
        arch["hidden_dim"] = 2 * arch["hidden_dim"]
        arch["attn_dim"] = arch.get("attn_dim") or config["arch"]["hidden_dim"]
    old["header"] = not old.pop("no_header", False)
    name = "transformer-classifier" if kind == "transformer" else f"{kind}-classifier"
    spec = {"name": name, "config": {"vocab_size": config["vocab_size"], "num_classes": config["num_classes"], **arch}}
    return {"model": spec, "label_names": config["label_names"], "regression": config["regression"],
            "options": _renamed(old, renames)}


def _images(config: dict[str, Any]) -> dict[str, Any]:
    arch = config["arch"]
    model: dict[str, Any] = {"num_classes": config["num_classes"], "in_channels": config["in_channels"],
                             "attn": config.get("attn"), "attn_kwargs": config.get("attn_kwargs") or None}
    if arch == "small-cnn":
        model.update(widths=list(config["widths"]), dropout=config["dropout"])
    else:
        model["stem"] = config.get("stem", "imagenet")
    return {"model": {"name": arch, "config": model}, "options": dict(config["options"]),
            **{k: config[k] for k in ("image_size", "mean", "std", "class_names")}}


_CONFIGS = {"translate": _translate, "sentiment": _sentiment, "images": _images}


def upgrade(task: str, config: dict[str, Any], state_dict: Mapping[str, Tensor]) -> tuple[dict[str, Any], dict]:
    """A format-version-1 run of application ``task``: its configuration and weights in the current format.
    ``ValueError`` for an application that has no format-1 runs; ``KeyError``/``TypeError`` for a damaged
    configuration (the loader names the file)."""
    if task not in _CONFIGS:
        raise ValueError(f"{task} runs exist only in checkpoint format 2 and later")
    new = _CONFIGS[task](config)
    return new, upgrade_state_dict(new["model"]["name"], state_dict)
