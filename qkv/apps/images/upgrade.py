"""The image classification runs of checkpoint format 1 (qkv 0.1.0) read as format 2: :func:`upgrade_config`, the
application's ``upgrade`` hook (:func:`qkv.apps.run.load_run` calls it; the weights are renamed by
:func:`qkv.train.upgrade.upgrade_state_dict`)."""

from __future__ import annotations

from typing import Any

__all__ = ["upgrade_config"]


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A format-1 configuration in format 2 (``ValueError``-free: a damaged one raises ``KeyError`` or
    ``TypeError``, which the loader names)."""
    arch = config["arch"]
    model: dict[str, Any] = {"num_classes": config["num_classes"], "in_channels": config["in_channels"],
                             "attn": config.get("attn"), "attn_kwargs": config.get("attn_kwargs") or None}
    if arch == "small-cnn":
        model.update(widths=list(config["widths"]), dropout=config["dropout"])
    else:
        model["stem"] = config.get("stem", "imagenet")
    return {"model": {"name": arch, "config": model}, "options": dict(config["options"]),
            **{k: config[k] for k in ("image_size", "mean", "std", "class_names")}}
