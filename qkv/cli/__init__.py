"""The ``qkv`` command line, built from declarations: qkv's own commands (one module each, named after it, stating
``COMMAND = (name, help, options dataclass, function)``: :mod:`.explain`, :mod:`.train` for ``qkv train NAME``,
:mod:`.predict`, :mod:`.evaluate`, :mod:`.view`, :mod:`.export`) and each application's own commands (``qkv
translate``, ``qkv transcribe``...: :attr:`qkv.apps.Application.commands`), every flag generated from an options
dataclass (:mod:`.options`). No module here names an application: they are listed by :func:`qkv.apps.catalogue`
without being imported, and only the one a command uses is imported (``qkv --help`` loads none).

Every failure a user can cause ends in one line on stderr, ``qkv: error: ...``, with exit code 2 (130 after
Ctrl-C); ``-v`` adds the traceback. An error never advises a flag the command does not have.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import sys
import traceback
import zlib
from dataclasses import dataclass

from .. import __version__
from ..memory import keep_freed_memory
from ..options import NamesOptions, option
from .options import ArgumentParser, add_command, add_options, command_fields, options_from_args

__all__ = ["main", "build_parser", "COMMAND_MODULES", "GlobalOptions"]

#: qkv's own commands, each a module of this package, in the order ``qkv --help`` lists them (the applications'
#: commands follow)
COMMAND_MODULES = ("explain", "train", "predict", "evaluate", "view", "export")


@dataclass
class GlobalOptions:
    verbose: bool = option(False, short="-v", help="log progress to stderr, and show tracebacks of errors")
    threads: int | None = option(None, low=1, high=max(os.cpu_count() or 1, 1) * 4,
                                 help="CPU threads for PyTorch (default: its own choice; 1 is faster when the cores "
                                      "are busy)")
    release_memory: bool = option(False, help="let the C library give freed memory back to the system at once (by "
                                  "default qkv keeps it for reuse, which makes large temporary tensors cheaper)")


def _chosen(argv: list[str] | None) -> list[str]:
    """The command words of ``argv`` (``["train", "translate"]``, ``["view"]``) past the global options; ``None``:
    every command (the whole parser)."""
    if argv is None:
        return []
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--threads":
            skip = True
        elif not word.startswith("-"):
            words.append(word)
            if len(words) == 2:
                break
    return words


def build_parser(argv: list[str] | None = None) -> ArgumentParser:
    """The parser of ``qkv``. Every command is listed; with ``argv``, only the command it names gets its flags
    (and imports its application), so that a command line loads no more than it uses; without, all of them."""
    import importlib

    from ..apps import application, catalogue
    from .runs import runs_named, with_settings
    from .train import add_train_command

    words = _chosen(argv)
    wanted = (lambda *names: True) if argv is None else (lambda *names: list(names) == words[:len(names)])
    parser = ArgumentParser(prog="qkv", description="Attention mechanisms: explain, train, look inside.")
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    add_options(parser, GlobalOptions)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser)
    apps = catalogue()
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        cmd, help, options, func = module.COMMAND
        if wanted(cmd) and getattr(module, "TAKES_SETTINGS", False):  # the runs' applications' settings as flags
            checkpoints = runs_named(argv[argv.index(cmd) + 1:] if argv and cmd in argv else [])
            options, settings = with_settings(options, checkpoints)
            p = add_command(commands, cmd, help, options, func)
            p.set_defaults(checkpoints=checkpoints, settings=settings)
            continue
        p = add_command(commands, cmd, help, options if wanted(cmd) else None, func)
        if name == "train":
            train_commands = p.add_subparsers(dest="application", required=True, metavar="APPLICATION",
                                              parser_class=ArgumentParser)
            for app in apps.values():
                add_train_command(train_commands, app.name, app.help,
                                  application(app.name) if wanted("train", app.name) else None)
    for app in apps.values():
        for cmd, help in app.commands.items():
            command = application(app.name).commands[cmd] if wanted(cmd) else None
            add_command(commands, cmd, help, command and command.options,
                        command and (lambda args, c=command: c.run(options_from_args(args, c.options))))
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (files, options, data), not a bug in qkv."""
    errors: list[type[BaseException]] = [ValueError, OSError, EOFError, FloatingPointError, gzip.BadGzipFile,
                                         zlib.error, json.JSONDecodeError, UnicodeError, ImportError]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors comes with the train extra
        pass
    return tuple(errors)


def _one_line(e: BaseException, fields: dict[str, str] | None = None) -> str:
    """``e`` as one line: an exception that names options (:class:`~qkv.options.OptionError`,
    :func:`~qkv.options.option_error`) writes each as the running command's flag (``fields``: field name -> flag)
    where the command has one, else as the option's name; a library's advice never names a flag the user cannot
    give to this command."""
    if isinstance(e, NamesOptions) and fields is not None:
        text = e.render(lambda name: fields.get(name, name)).strip()
    else:
        text = str(e).strip() or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{text} ({e.filename})"
    return " ".join(text.split())


def _subparser(parser, args):
    """The parser of the command ``args`` ran."""
    import argparse

    sub = parser
    for word in [w for w in (getattr(args, "command", None), getattr(args, "application", None)) if w]:
        action = next((a for a in sub._actions if isinstance(a, argparse._SubParsersAction)), None)
        if action is None or word not in action.choices:
            break
        sub = action.choices[word]
    return sub


def _interrupted(args, e: BaseException | None = None) -> str:
    """The line printed after Ctrl-C or SIGTERM: where the checkpoint is and how to continue, for a training
    command."""
    from pathlib import Path

    what = "terminated" if getattr(e, "signum", None) == 15 else "interrupted"
    out = getattr(args, "out", None)
    if args.command == "train" and out and (Path(out) / "checkpoint" / "model.safetensors").is_file():
        argv = sys.argv[1:]
        again = " ".join(["qkv", *argv] + ([] if "--resume" in argv else ["--resume"]))
        return f"qkv: {what}: the checkpoint is in {Path(out) / 'checkpoint'} — continue with: {again}"
    return f"qkv: {what}"


def _refuse(parser, args, extra: list[str]) -> None:
    """Exit 2 with one line for words of the command line that no flag takes: a setting the runs' applications do
    not have is named with those they do."""
    settings = getattr(args, "settings", None)
    flag = next((w for w in extra if w.startswith("--")), None)
    if settings is not None and flag and getattr(args, "checkpoints", None):
        from ..options import option_fields

        kinds = sorted({c.task for c in args.checkpoints.values()})
        names = sorted({f.name for cls in settings for f, _ in option_fields(cls)})
        takes = f"their settings: {', '.join(names)}" if names else "they take no setting"
        parser.error(f"{flag.split('=')[0]} is not a setting of {' or '.join(kinds)} runs ({takes})")
    parser.error(f"unrecognized arguments: {' '.join(extra)}")


def _intermixed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with every command's own parser reading options placed between its positionals
    (``qkv predict RUN --json x.json "text"``): argparse's intermixed parsing, where the parser allows it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _intermixed(sub)
    if parser._subparsers is None and "parse_known_args" not in vars(parser):  # (an alias: the same parser)
        plain = parser.parse_known_args
        inside = []

        def parse_known_args(args=None, namespace=None):
            if inside:  # intermixed parsing calls the plain one
                return plain(args, namespace)
            inside.append(True)
            try:
                return parser.parse_known_intermixed_args(args, namespace)
            except TypeError:  # a positional that takes the rest (REMAINDER): parsed as written
                return plain(args, namespace)
            finally:
                inside.clear()

        parser.parse_known_args = parse_known_args
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        from ..apps import load_plugins

        load_plugins()
    except ValueError as e:
        print(f"qkv: error: {_one_line(e)}", file=sys.stderr)
        return 2
    parser = _intermixed(build_parser(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse(parser, args, extra)
    try:
        options = options_from_args(args, GlobalOptions)
    except ValueError as e:
        print(f"qkv: error: {_one_line(e)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if options.verbose else logging.WARNING, format="%(message)s")
    fixed = contextlib.nullcontext()
    if options.threads is not None:  # that count, kept by every loop that follows the machine
        from ..train.threads import threads_held

        fixed = threads_held(options.threads)
    if not options.release_memory:
        keep_freed_memory()
    try:
        with fixed:
            return args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (qkv.train.interrupt.Interrupted carries its exit code)
        print(_interrupted(args, e), file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except _user_errors() as e:
        if options.verbose:
            traceback.print_exc()
        fields = {**command_fields(parser), **command_fields(_subparser(parser, args))}
        print(f"qkv: error: {_one_line(e, fields)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
