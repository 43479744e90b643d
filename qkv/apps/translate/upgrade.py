"""The translation runs of checkpoint format 1 (qkv 0.1.0) read as format 2: :func:`upgrade_config`, the application's
``upgrade`` hook (:func:`qkv.apps.run.load_run` calls it; the weights are renamed by
:func:`qkv.train.upgrade.upgrade_state_dict`)."""

from __future__ import annotations

from typing import Any

from ...train.upgrade import SIZES, renamed

__all__ = ["upgrade_config"]


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A format-1 configuration in format 2 (``ValueError``-free: a damaged one raises ``KeyError`` or
    ``TypeError``, which the loader names)."""
    kind, arch = config["model"], dict(config["arch"])
    renames = dict(SIZES)
    if kind == "transformer":
        arch = {"src_vocab": arch["src_vocab"], "tgt_vocab": arch["tgt_vocab"], "dim": arch["d_model"],
                "num_heads": arch["heads"], "ffn_dim": arch["ffn_dim"], "num_layers": arch["encoder_layers"],
                "num_decoder_layers": arch["decoder_layers"], "dropout": arch["dropout"], "score": arch["score"]}
        renames["hidden_dim"] = "dim"
    else:
        arch["num_layers"] = arch.pop("layers")
    return {"model": {"name": kind, "config": arch}, "options": renamed(config["options"], renames)}
