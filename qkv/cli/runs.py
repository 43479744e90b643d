"""The runs a command line names, read before its flags are made: a command that takes the settings of the runs'
applications (``qkv predict RUN --beam 4``, ``qkv evaluate RUN... --max-len 50``) gets their flags from the
settings dataclass each application declares (:attr:`qkv.apps.predictor.Predictor.settings`), and the runs it
read are handed to the command, so that each run's folder is resolved and its files read once."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..options import option_fields

__all__ = ["runs_named", "with_settings", "settings_given"]


def runs_named(words: list[str]) -> dict[str, Any]:
    """``{word: Checkpoint}`` for the words of a command line that are run (or checkpoint) folders, each read once
    (:func:`qkv.train.checkpoint.load_checkpoint`); other words, and folders that hold no run, are left alone (the
    command says what is wrong with them)."""
    from ..train.checkpoint import load_checkpoint

    found: dict[str, Any] = {}
    for word in words:
        if word.startswith("-") or word in found or not os.path.isdir(word):
            continue
        try:
            found[word] = load_checkpoint(word)
        except (OSError, ValueError):
            continue
    return found


def with_settings(options_cls: type, checkpoints: dict[str, Any]) -> tuple[type, tuple[type, ...]]:
    """``options_cls`` extended with the settings dataclasses of the applications of ``checkpoints`` (their flags
    then belong to the command), and those dataclasses."""
    from ..apps import application, catalogue

    settings: list[type] = []
    for ckpt in checkpoints.values():
        cls = application(ckpt.task).predictor.settings if ckpt.task in catalogue() else None
        if cls is not None and cls not in settings:
            settings.append(cls)
    if not settings:
        return options_cls, ()
    combined = dataclasses.make_dataclass(options_cls.__name__, [], bases=(*settings, options_cls))
    combined.FLAG_HELP = getattr(options_cls, "FLAG_HELP", {})
    return combined, tuple(settings)


def settings_given(args, settings: tuple[type, ...]) -> dict[str, Any]:
    """The settings given on the command line (those of the ``settings`` dataclasses), with their values."""
    from .options import given

    names = {f.name for cls in settings for f, _ in option_fields(cls)}
    return {k: v for cls in settings for k, v in given(args, cls).items() if k in names}
