"""The sentiment runs of checkpoint format 1 (qkv 0.1.0) read as format 2: :func:`upgrade_config`, the application's
``upgrade`` hook (:func:`qkv.apps.run.load_run` calls it; the weights are renamed by
:func:`qkv.train.upgrade.upgrade_state_dict`)."""

from __future__ import annotations

from typing import Any

from ...train.upgrade import SIZES, renamed

__all__ = ["upgrade_config"]


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """(The RNN's ``hidden_dim`` was per direction in format 1; it is both directions together now.)"""
    old, kind, arch = dict(config["options"]), config["model"], dict(config["arch"])
    renames = dict(SIZES)
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
            "options": renamed(old, renames)}
