"""What the commands share: reading inputs, printing results, writing JSON, terminal-safe text, colours and output
paths."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_command", "print_result", "safe", "use_color", "numbered_paths", "unique_names", "command_line",
           "is_main", "read_lines", "input_files", "finite", "write_json", "warn"]

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


def read_lines(path: str, flag: str = "--file") -> list[str]:
    """Every line of a UTF-8 text file, one input each (the newline that ends the file is not a line): a blank line
    is an error naming ``file:line`` (dropping it would shift every output after it against its input), as is a
    line that is not UTF-8; a folder is "is a directory"."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{path} is a directory, not a text file ({flag})")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file ({flag})") from None
    parts = raw.split(b"\n")
    if parts and parts[-1] in (b"", b"\r"):
        parts.pop()
    lines = []
    for n, line in enumerate(parts, 1):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start}) ({flag})") from None
        if not text:
            raise ValueError(f"{path}:{n}: a blank line ({flag} takes one input a line, so that outputs line up "
                             "with lines): remove it or write something there")
        lines.append(text)
    if not lines:
        raise ValueError(f"{path}: no line to read ({flag})")
    return lines


def input_files(paths: list[str], what: str = "file") -> list[str]:
    """``paths``, each an existing file: a folder is "is a directory", a missing one "no such file"."""
    for path in paths:
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"{path} is a directory, not an {what}" if what[0] in "aeiou" else
                             f"{path} is a directory, not a {what}")
        if not p.exists():
            raise ValueError(f"no {what} {path}: no such file")
    return paths


def finite(value: Any) -> tuple[Any, list[str]]:
    """``value`` (numbers, strings, lists and dicts) with every NaN or infinite float made ``None``, and the keys
    (``a.b[2]``) where that happened."""
    changed: list[str] = []

    def walk(v: Any, where: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            changed.append(where or "(the value)")
            return None
        if isinstance(v, dict):
            return {k: walk(x, f"{where}.{k}" if where else str(k)) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, f"{where}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(value, ""), changed


def write_json(path: str, value: Any, flag: str = "--json") -> Path:
    """``value`` written to ``path`` as JSON (atomically), a NaN or infinite number as ``null`` (JSON has neither),
    said on stderr; the path written is printed."""
    from ..viz.files import write_atomic

    clean, changed = finite(value)
    written = write_atomic(path, json.dumps(clean, indent=2, ensure_ascii=False, allow_nan=False) + "\n",
                           option=flag)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        print(f"qkv: note: {written}: not a number, written as null: {shown}", file=sys.stderr)
    print(f"wrote {written}")
    return written


def add_command(commands, name: str, help: str, options_cls: type, func) -> None:
    """``qkv NAME``, its flags generated from the dataclass ``options_cls``, run by ``func(args)``."""
    from .options import add_options

    p = commands.add_parser(name, help=help)
    add_options(p, options_cls)
    p.set_defaults(func=func)


def warn(message: str) -> None:
    """A note for the user on stderr (something cut or skipped): the result is printed all the same."""
    print(f"qkv: warning: {message}", file=sys.stderr)
