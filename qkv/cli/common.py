"""What the commands share: printing results, terminal-safe text, colours and output paths."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_command", "add_train_command", "read_train_options", "print_result", "safe", "use_color",
           "numbered_paths", "unique_names", "command_line", "is_main", "read_lines",
           "input_texts"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(text: str) -> str:
    """``text`` fit for a terminal: control characters and escape sequences from the input are shown as
    ``\\xNN`` instead of being sent to the terminal (where they could move the cursor or change colours)."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def is_main() -> bool:
    """True on the process that prints (rank 0 under ``torchrun``)."""
    return int(os.environ.get("RANK", "0")) == 0


def command_line() -> str:
    return " ".join(sys.argv)


def print_result(result: Any, head: str = "") -> None:
    """How a :class:`qkv.train.TrainResult` ended and its final metrics, one split per line (rank 0 only)."""
    if not is_main():
        return
    print(f"{head}stopped: {result.stopped} after {result.state.global_step} steps ({result.state.elapsed:.1f} s)")
    for split, metrics in result.metrics.items():
        print(f"{head}{split}: " + ", ".join(f"{name} {v:.4f}" for name, v in metrics.items()))
    if result.out and not head:
        print(f"checkpoint: {result.out}")


def use_color(choice: str) -> bool:
    """``always``/``never``, or ``auto``: when stdout is a terminal and ``NO_COLOR`` is not set."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


def numbered_paths(path: str, n: int) -> list[Path]:
    """``path`` itself for one output, else ``stem-0.ext``, ``stem-1.ext``... (one file per item, never reused)."""
    p = Path(path)
    return [p] if n == 1 else [p.with_name(f"{p.stem}-{i}{p.suffix}") for i in range(n)]


def unique_names(names: list[str]) -> list[str]:
    """``names`` with repeats numbered (``shirt``, ``shirt-2``...), so that no output overwrites another."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        candidate = name if seen[name] == 1 else f"{name}-{seen[name]}"
        while candidate in seen and candidate != name:
            seen[name] += 1
            candidate = f"{name}-{seen[name]}"
        seen.setdefault(candidate, 1)
        out.append(candidate)
    return out


def input_texts(texts: list[str], file: str | None, what: str) -> list[str]:
    """The texts given as arguments, then the lines of ``--file``; none at all is an error."""
    out = list(texts) + (read_lines(file) if file else [])
    if not out:
        raise ValueError(f"give {what}, or --file")
    return out


def read_lines(path: str) -> list[str]:
    """The non-empty lines of a UTF-8 text file; a decoding error names the file and line."""
    try:
        raw = Path(path).read_bytes()
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a text file (--file)") from None
    lines = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start}) (--file)") from None
        if text:
            lines.append(text)
    return lines


def add_command(commands, name: str, help: str, options_cls: type, func) -> None:
    """``qkv NAME``, its flags generated from the dataclass ``options_cls``, run by ``func(args)``."""
    from .options import add_options

    p = commands.add_parser(name, help=help)
    add_options(p, options_cls)
    p.set_defaults(func=func)


def add_train_command(train_commands, name: str, help: str, options_cls: type, train_defaults, func):
    """``qkv train NAME``: the application's options, then the trainer's (with the application's defaults)."""
    from ..train import TrainConfig
    from .options import add_options

    p = train_commands.add_parser(name, help=help)
    add_options(p, options_cls, title="data and model")
    add_options(p, TrainConfig, defaults=train_defaults(options_cls()), title="training")
    p.set_defaults(func=func)


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
        return options_from_args(args, TrainConfig, defaults=train_defaults(options), extra={"command": command_line()})

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
