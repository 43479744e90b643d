"""``qkv train NAME``: every application of the registry (:mod:`qkv.apps`), its options then the trainer's, the
options' defaults sized to the run's budget."""

from __future__ import annotations

import math
from pathlib import Path

from ..apps.command import check_device
from ..apps.console import command_line, print_result

__all__ = ["COMMAND", "add_train_command", "read_train_options"]


def _train(app):
    def train(args) -> int:
        options, config = read_train_options(args, app.options, app.train_defaults, app.budget_defaults)
        results = app.run_training(options, config)
        many = len(results) > 1
        for k, result in enumerate(results):
            print_result(result, head=f"fold {k + 1}: " if many else "")
        if many:
            metric = config.monitor or "loss"
            values = [r.metrics.get("test", {}).get(metric, math.nan) for r in results]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            print(f"{len(results)}-fold test {metric}: {mean:.4f} +- {std:.4f}")
            if config.out:
                print(f"run directory: {config.out}")
        return 0
    return train


def add_train_command(train_commands, name: str, help: str, app=None) -> None:
    """``qkv train NAME``: the application's options, then the trainer's (with the application's defaults); with
    ``app`` ``None`` it is only listed."""
    from ..train import TrainConfig
    from .options import add_options

    p = train_commands.add_parser(name, help=help)
    if app is None:
        return
    add_options(p, app.options, title="data and model")
    add_options(p, TrainConfig, defaults=app.train_defaults(app.options()), title="training")
    p.set_defaults(func=_train(app))


def _stored_options(config) -> dict | None:
    """The options a run directory's checkpoint was written with (``None``: no readable checkpoint there); only its
    ``config.json`` is read (no weights)."""
    import json

    try:
        return json.loads((Path(config.out) / "checkpoint" / "config.json").read_text())["config"]["options"]
    except (OSError, TypeError, ValueError, KeyError):
        return None


def read_train_options(args, options_cls: type, train_defaults, budget_defaults=None):
    """``(options, TrainConfig)`` of a ``qkv train NAME`` command line (the command stored with the run).

    ``budget_defaults(options, config) -> {field: value}`` (an application's, optional) sizes the defaults to the
    run's budget (``config.max_minutes``, ``config.max_steps``; called with a bare ``TrainConfig()`` it names every
    field it may set); the flags given win over it, a resumed run keeps the values it was started with, and what it
    changed is printed."""
    import dataclasses

    from ..train import TrainConfig
    from .options import given, options_from_args

    def config_of(options):
        return options_from_args(args, TrainConfig, defaults=train_defaults(options), extra={"command": command_line()},
                                 threads=getattr(args, "threads", None))  # the global --threads fixes the count

    if hasattr(args, "device"):  # the one device check of every command, before the trainer's own
        check_device(args.device)
    options = options_from_args(args, options_cls)
    config = config_of(options)
    if budget_defaults is None:
        return options, config
    chosen = given(args, options_cls)
    preset = budget_defaults(options, config)
    stored = _stored_options(config) if config.resume else None
    if stored is not None:  # a resumed run keeps the sizes it was started with, whatever budget it goes on with
        preset = {k: stored[k] for k in budget_defaults(options, TrainConfig()) if k in stored}
    preset = {k: v for k, v in preset.items() if k not in chosen and getattr(options, k) != v}
    if not preset:
        return options, config
    budget = ("no budget" if config.max_minutes is None and config.max_steps is None else
              f"a {config.max_minutes:g}-minute budget" if config.max_minutes is not None else
              f"a budget of {config.max_steps} steps")
    print(f"defaults for {budget}: {', '.join(f'{k}={v}' for k, v in preset.items())} (flags given win)",
          flush=True)
    options = options_from_args(args, options_cls, defaults=dataclasses.replace(options, **preset))
    return options, config_of(options)


#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it; the flags
#: are the application's, ``qkv train APPLICATION --help``)
COMMAND = ("train", "train a model for one of the applications", None, None)
