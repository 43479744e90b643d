"""Checkpoint format version 1 (qkv 0.1.0) read as the current one, beside the checkpoint format of
:mod:`qkv.train.checkpoint`.

Format 1 stored an application's model settings its own way (``{"model": KIND, "arch": {...}, "options": ...}`` for
translation and sentiment, the settings at the top level for images) and older parameter names. Upgrading maps
the configuration to format 2's ``{"model": {"name", "config"}, "options": {...}, ...}`` (option names renamed; the
loader then drops unknown ones and resets those that do not apply) and renames the weights
(:func:`upgrade_state_dict`). Each application that had format-1 runs maps its configuration itself (its
``upgrade`` hook, in ``qkv/apps/NAME/upgrade.py``); those that began with format 2 have no format-1 runs, and
:func:`qkv.apps.run.load_run` refuses them with a ``ValueError``.

Parameter names:
0.1.0 had its own Transformer layers in the seq2seq model and in the text classifier, and CBAM's channel gate
kept its MLP in an ``nn.Sequential``; they are now :class:`qkv.layers.TransformerLayer` and
:class:`qkv.vision.SqueezeExcite`'s ``fc1``/``fc2``. :func:`upgrade_state_dict` renames the keys (the tensors
are the same objects); the arithmetic of every model is unchanged, so an upgraded state dict gives the outputs it
gave (the text classifier's sinusoids are now computed in float64, as the translation model's were: outputs move
by ~1e-7). Keys already in the new form, and those of models whose names did not change, pass through.

The constructor arguments changed names too (mapped by each application's ``upgrade`` hook): the
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

__all__ = ["upgrade_state_dict", "RENAMES", "SIZES", "renamed"]

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


#: option names of format 1 -> now, shared by the applications' format-1 upgrades
SIZES = {"layers": "num_layers", "heads": "num_heads"}


def renamed(options: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``options`` with the keys of ``renames`` renamed (old -> new)."""
    return {renames.get(k, k): v for k, v in options.items()}
