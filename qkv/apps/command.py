"""What every command of every application shares, written once: the options (small dataclasses that a command's
options inherit, checked in one place: :func:`check_shared`, called for every command when its options are read)
and the way a command predicts and evaluates (:func:`load`, :func:`read_inputs`, :func:`input_paths`,
:func:`inputs_of`, :func:`finish`, :func:`evaluation`).

- :class:`RunArgument`: the run (or checkpoint) directory, the first positional argument;
- :class:`DeviceOption`: ``--device``, checked against this machine before anything is loaded (:func:`check_device`);
- :class:`FileOption`: ``--file``, inputs one per line (:func:`qkv.apps.console.read_lines`);
- :class:`JsonOption`: ``--json``, written by :func:`qkv.apps.console.write_json` (never ``NaN``);
- :class:`PlotOption`: ``--plot``, a picture or a folder of pictures, settled before any work;
- :class:`LimitOption`: ``--max-examples``, how many examples an evaluation reads;
- :class:`LMFusionOption`: ``--lm``, ``--lm-weight``, ``--length-reward``, a language model fused into a beam.

A command says what a shared flag means for it with ``FLAG_HELP`` (:func:`qkv.cli.options.add_options`).

A predicting command loads the predictor once (:func:`load`), reads the inputs (:func:`read_inputs`,
:func:`inputs_of`), predicts, then :func:`finish`: what was cut said on stderr and the rows written by ``--json``.
An input is what the application reads, written as a string (the predictor's ``inputs_from_strings``); a result is
one JSON row (:func:`row_of`): ``input``, then the predictor's ``result_row``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..options import option
from .console import input_files, read_lines, safe, warn, write_json
from .fingerprint import data_note
from .option_groups import LMFusionSettings

__all__ = ["RunArgument", "DeviceOption", "FileOption", "JsonOption", "RunInputs", "PlotOption", "LimitOption",
           "LMFusionOption", "check_shared", "check_device", "plot_folder", "plot_file", "load", "read_inputs",
           "input_paths", "inputs_of", "settings_of", "write_outputs", "row_of", "finish", "evaluation"]


@dataclass
class RunArgument:
    run: str = option(positional=True, help="run directory or checkpoint directory")


@dataclass
class DeviceOption:
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda, cuda:N or mps")


@dataclass
class FileOption:
    file: str | None = option(None, help="a file of inputs, one per line (a blank line is an error: outputs line up "
                                         "with the lines)")


@dataclass
class JsonOption:
    json: str | None = option(None, help="write the results as JSON (a NaN or infinite figure is written null)")


@dataclass
class RunInputs(JsonOption, DeviceOption, FileOption, RunArgument):
    """What every command that predicts on a run's inputs takes: the run, ``--file``, ``--device`` and ``--json``."""


@dataclass
class PlotOption:
    plot: str | None = option(None, help="write pictures here")


@dataclass
class LimitOption:
    limit: int | None = option(None, low=1, flag="--max-examples", metavar="N", requires=("evaluate",),
                               help="evaluate at most this many examples")


@dataclass
class LMFusionOption(LMFusionSettings):
    """``--lm``, ``--lm-weight``, ``--length-reward``: the settings of :class:`~qkv.apps.option_groups.LMFusionSettings`
    as flags, the run of ``--lm`` loaded by :meth:`fusion`."""

    def fusion(self, predictor) -> dict:
        """``predictor``'s ``lm`` (the run of ``--lm`` loaded, or an error naming the flag), ``lm_weight`` and
        ``length_reward``; nothing without ``--lm``."""
        if not self.lm:
            return {}
        try:
            lm = predictor.language_model(self.lm)
        except (ValueError, OSError) as e:
            raise ValueError(f"--lm {self.lm}: {e}") from None
        return {"lm": lm, "lm_weight": self.lm_weight, "length_reward": self.length_reward}


def check_device(device: str, flag: str = "--device") -> None:
    """A ``ValueError`` naming ``flag`` unless ``device`` can be used on this machine: ``auto``, ``cpu``, ``cuda``
    or ``cuda:N`` with CUDA and an N-th GPU, ``mps`` where Metal is."""
    import torch

    m = re.fullmatch(r"auto|cpu|mps|cuda(?::(\d+))?", device)
    if not m:
        raise ValueError(f"{flag} {device}: not a device qkv knows; use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{flag} {device}: CUDA is not available here (torch {torch.__version__} sees no GPU); "
                             f"use {flag} cpu or auto")
        count = torch.cuda.device_count()
        if m.group(1) is not None and int(m.group(1)) >= count:
            raise ValueError(f"{flag} {device}: this machine has {count} GPU{'s' if count != 1 else ''} "
                             f"(cuda:0 to cuda:{count - 1})")
    mps = getattr(torch.backends, "mps", None)
    if device == "mps" and not (mps is not None and mps.is_available()):
        raise ValueError(f"{flag} mps: Metal (MPS) is not available here; use {flag} cpu or auto")


def plot_file(path: str, flag: str = "--plot") -> Path:
    """``path`` as the picture that will be written (:func:`qkv.viz.files.picture_path`: ``.png`` added when it has
    no extension) in a folder that can be written; else a ``ValueError`` naming ``flag`` and the path."""
    from ..viz.files import picture_path

    p = picture_path(path, option=flag)
    _writable_folder(p.parent, flag, path)
    return p


def _writable_folder(folder: Path, flag: str, given: str) -> None:
    """A ``ValueError`` naming ``flag`` and ``given`` unless ``folder`` is, or can be made as, a folder that can be
    written into (nothing is made here: a command that fails later leaves nothing behind)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {given}: cannot make the folder {folder}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {given}: cannot write into the folder {existing} (permission denied)")


def plot_folder(path: str, flag: str = "--plot") -> Path:
    """``path`` as a folder that pictures can be written into (made when the first is written); a file in the way
    or a folder that cannot be written is a ``ValueError`` naming ``flag`` and the path."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {path} is a file: give a folder for the pictures (one PNG per input)")
    _writable_folder(p, flag, path)
    return p


def check_shared(o) -> None:
    """The checks of the shared options of a command's options ``o``, before any work (``ValueError``)."""
    if isinstance(o, DeviceOption):
        check_device(o.device)
    if isinstance(o, JsonOption) and o.json is not None:
        check_output_file(o.json, "--json")


def check_output_file(path: str, flag: str) -> None:
    """A ``ValueError`` naming ``flag`` when a file cannot be written at ``path`` (it is a folder, or under a file,
    or under a folder that cannot be written), before the work whose result it would hold."""
    p = Path(path)
    if not path.strip():
        raise ValueError(f"{flag} is empty: give a file name such as results.json")
    if path.endswith(("/", os.sep)) or p.is_dir():
        raise ValueError(f"{flag} {path} is a folder: give a file name such as {p / 'results.json'}")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder")
    if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder {parent} cannot be written")


def load(run: str, device: str = "auto", name: str | None = None):
    """The predictor of ``run`` (of application ``name``, or whichever the run is), read once."""
    from . import load_predictor

    return load_predictor(run, device, name)


def read_inputs(given: Sequence[str], file: str | None, what: str) -> list[str]:
    """The inputs given as arguments, then the lines of ``--file`` (a blank line is an error: outputs line up with
    lines); none at all is an error."""
    out = list(given) + (read_lines(file) if file else [])
    if not out:
        raise ValueError(f"give {what}, or --file")
    return out


def input_paths(o, given: Sequence[str], what: str, others: str = "") -> list[str]:
    """The files a command predicts on: ``given`` then the lines of ``o.file``, each an existing ``what``; none
    (and no ``others``, e.g. ``--index``) is an error. A command's ``--evaluate`` reads its own data: with it, files,
    ``--file``, ``--index`` and ``--plot`` are refused (they would be ignored)."""
    evaluate = getattr(o, "evaluate", None)
    index = getattr(o, "index", None)
    if evaluate and (given or o.file or index or getattr(o, "plot", None)):
        raise ValueError(f"--evaluate reads its examples from its data: leave out the {what}s, --file"
                         f"{', --index' if hasattr(o, 'index') else ''} and --plot")
    if not (given or o.file or index or evaluate):
        raise ValueError(f"give {what}s{others}" + (" or --evaluate" if hasattr(o, "evaluate") else ""))
    return input_files(read_inputs(given, o.file, f"{what}s"), what) if given or o.file else []


def inputs_of(predictor, strings: Sequence[str], **given: Any) -> Any:
    """What ``predictor.predict`` takes, from inputs written as strings: files are checked first (a folder is "is a
    directory", a missing file named), then the application's own ``inputs_from_strings``."""
    kind = getattr(predictor, "input_kind", "text")
    if kind.endswith(" file"):
        input_files(list(strings), kind)
    return predictor.inputs_from_strings(list(strings), **given)


def settings_of(o, predictor, method: str = "predict", **more: Any) -> dict[str, Any]:
    """The settings of ``predictor``'s application (its :attr:`~qkv.apps.predictor.Predictor.settings`) that a
    command's options ``o`` hold (its dataclass inherits them: the flags and the library's settings are one
    declaration), with ``more`` (settings a command names otherwise, a language model loaded...) over them, for
    ``method`` (``"predict"`` or ``"evaluate"``): one left at ``None`` is the method's own default, and one the
    method does not take is refused unless left at its default (``check_settings``'s one message)."""
    import dataclasses
    import inspect

    from ..options import default_of, option_fields

    takes = inspect.signature(getattr(predictor, method)).parameters
    own = {f.name: f for f in dataclasses.fields(o)}  # a command may give a setting its own default
    values = {}
    for f, _ in option_fields(predictor.settings) if predictor.settings is not None else ():
        if f.name in own and (f.name in takes or getattr(o, f.name) != default_of(own[f.name])):
            values[f.name] = getattr(o, f.name)
    values.update(more)
    return predictor.check_settings({k: v for k, v in values.items() if v is not None}, method)


def write_outputs(path: str, texts: Sequence[str], what: str) -> None:
    """``texts`` one per line into ``path`` (a command's ``--output``, written atomically), and how many on stdout."""
    from ..viz.files import write_atomic

    written = write_atomic(path, "\n".join(texts) + "\n", option="--output")
    print(f"wrote {len(texts)} {what} to {written}")


def row_of(predictor, given: str, result: Any) -> dict[str, Any]:
    """One JSON row of a result: ``input`` (as given), then the application's ``result_row`` (``output`` first)."""
    return {"input": given, **predictor.result_row(result)}


def finish(predictor, given: Sequence[str], results: Sequence[Any], json_path: str | None,
           **settings: Any) -> list[dict[str, Any]]:
    """After a prediction: what each result left out (the predictor's ``note``) said on stderr and in its row
    (``note``), the rows written to ``json_path``."""
    rows = []
    for s, r in zip(given, results, strict=True):
        row = row_of(predictor, s, r)
        note = predictor.note(r, settings)
        if note:
            warn(f"{safe(s[:60])}: {note}")
            row["note"] = note
        rows.append(row)
    if json_path:
        write_json(json_path, rows)
    return rows


def evaluation(predictor, data: str | None = None, *, split: str = "test", limit: int | None = None,
               name: str = "", report: Callable[[dict[str, float]], None] | None = None, json_path: str | None = None,
               **settings: Any) -> dict[str, float]:
    """``predictor.evaluate`` with the settings given (``None``: the application's default; one the application
    does not take is a ``ValueError`` naming it); the examples it skipped are said on stderr, ``report`` prints the
    figures, and they are written to ``json_path``."""
    given = predictor.check_settings({k: v for k, v in settings.items() if v is not None}, "evaluate")
    changed = data_note(getattr(predictor, "config", {}), predictor.options, data, split)
    figures = predictor.evaluate(data, split=split, limit=limit, **given)
    if changed:  # said with the figures (an error reading the data stays one line): another file, or changed data
        warn(safe(changed))
    skipped = int(figures.get("skipped") or 0)
    if skipped:
        warn(f"{safe(name or data or predictor.application)}: {skipped} bad example(s) skipped and not scored")
    if report is not None:
        report(figures)
    if json_path:
        write_json(json_path, figures)
    return figures
