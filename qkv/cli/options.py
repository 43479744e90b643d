"""Command-line flags generated from options dataclasses (:mod:`qkv.options`), and read back into them.

:func:`add_options` adds one flag per field (type, default, help and choices from the field); the flag's ``dest``
is the field's name, and a flag not given on the command line leaves no attribute behind, so that
:func:`options_from_args` knows what the user set. An option given for a model it does not apply to is an error,
even when its value equals the default; so is an option given without the option it ``requires`` (``--json``
of a command's ``--evaluate`` mode, say), so that no option given is ever ignored.

A command's dataclass inherits the options every command shares from small mixins (:mod:`.shared`: the run,
``--device``, ``--file``, ``--json``, ``--plot``, the example limit), defined and checked once; a command may say
what a shared flag means for it with ``FLAG_HELP = {field: help}`` and keep older names of it with
``FLAG_ALIASES = {field: ("--old-name",)}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from ..options import OptionError, base_type, check_options, default_of, field_type, flag_name, option_fields, why_not

__all__ = ["ArgumentParser", "add_command", "add_options", "options_from_args", "OptionsError", "flag_of",
           "command_fields"]


class OptionsError(ValueError):
    """A bad command-line option: the message names the flag."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``qkv: error: ...``, with exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse's API
        sys.stderr.write(f"qkv: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _tuple_parser(item_type, name):
    def parse(text: str):
        try:
            return tuple(item_type(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes comma-separated {item_type.__name__}s like 1,2,3, "
                                             f"got {text!r}") from None
    return parse


def _registry(parser: argparse.ArgumentParser) -> list[type]:
    if not hasattr(parser, "_qkv_options"):
        parser._qkv_options = []  # type: ignore[attr-defined]
    return parser._qkv_options  # type: ignore[attr-defined]


def add_options(parser: argparse.ArgumentParser, cls: type, *, defaults: Any = None, title: str | None = None,
                exclude: tuple[str, ...] = ()) -> None:
    """Add a flag for every command-line field of the options dataclass ``cls`` to ``parser``.

    ``defaults`` is an instance of ``cls`` whose values are shown as the defaults (a task's preset); the
    values themselves come from :func:`options_from_args`. Flags are grouped under ``title``.
    """
    shown = defaults if defaults is not None else None
    group = parser.add_argument_group(title) if title else parser
    taken = {a.dest for a in parser._actions}
    helps, aliases = getattr(cls, "FLAG_HELP", {}), getattr(cls, "FLAG_ALIASES", {})
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    ordered = sorted(option_fields(cls), key=lambda fs: 0 if fs[1].positional else 2 if fs[0].name in inherited else 1)
    for f, spec in ordered:  # positionals in order, then the command's own flags, then the shared ones
        if not spec.cli or f.name in exclude:
            continue
        if f.name in taken:
            raise RuntimeError(f"option {f.name!r} of {cls.__name__} is already a flag of {parser.prog}")
        tp, optional = base_type(field_type(cls, f.name))
        default = getattr(shown, f.name) if shown is not None else (
            f.default if f.default is not dataclasses.MISSING else None)
        help_text = helps.get(f.name, spec.help)
        if default not in (None, "", False) and not spec.positional:
            help_text += f" (default: {','.join(map(str, default)) if isinstance(default, tuple) else default})"
        kw: dict[str, Any] = {"help": help_text, "default": argparse.SUPPRESS}
        if spec.metavar:
            kw["metavar"] = spec.metavar
        if spec.positional:
            kw.pop("default")
            if spec.nargs is not None:
                kw["nargs"] = spec.nargs
                if spec.nargs in ("*", "?"):
                    kw["default"] = argparse.SUPPRESS
            group.add_argument(f.name, **kw)
            continue
        name = flag_name(f, spec)
        if tp is bool:
            if default is True or optional:
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["action"] = "store_true"
        elif spec.repeat:
            kw["action"] = "append"
        elif spec.parse is not None:
            kw["type"] = spec.parse
        elif typing.get_origin(tp) is tuple:
            kw["type"] = _tuple_parser(typing.get_args(tp)[0], name)
            kw.setdefault("metavar", "A,B,...")
        elif tp in (int, float, str):
            kw["type"] = tp
            if spec.choices is not None:
                kw["choices"] = spec.choices
        elif typing.get_origin(tp) is list and spec.nargs is not None:
            kw["nargs"] = spec.nargs
            kw["type"] = typing.get_args(tp)[0]
        else:
            raise RuntimeError(f"cannot make a flag for {cls.__name__}.{f.name} of type {tp}")
        older = aliases.get(f.name, ())
        if older:  # the command's older names of the flag: they still work, and the help says they are older
            kw["help"] = f"{kw.get('help', '')} ({', '.join(older)}: its older name)".strip()
        names = [*([spec.short] if spec.short else []), name, *spec.aliases, *older]
        group.add_argument(*names, dest=f.name, **kw)
    _registry(parser).append(cls)


def add_command(commands, name: str, help: str, options_cls: type | None, func) -> argparse.ArgumentParser:
    """``qkv NAME``, its flags generated from the dataclass ``options_cls``, run by ``func(args)``; with
    ``options_cls`` ``None`` the command is only listed (its flags are not needed for this command line)."""
    p = commands.add_parser(name, help=help)
    if options_cls is not None:
        add_options(p, options_cls)
        p.set_defaults(func=func)
    return p


def flag_of(cls: type, name: str) -> str:
    """The flag (or positional name) of field ``name`` of ``cls``."""
    for f, spec in option_fields(cls):
        if f.name == name:
            return f.name if spec.positional else flag_name(f, spec)
    return name


def command_fields(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Field name -> flag of every options dataclass whose flags ``parser`` has (:func:`add_options`)."""
    out: dict[str, str] = {}
    for cls in _registry(parser):
        for f, spec in option_fields(cls):
            if spec.cli and not spec.positional:
                out.setdefault(f.name, flag_name(f, spec))
    return out


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` that were given on the command line, with their parsed values."""
    out = {}
    for f, spec in option_fields(cls):
        if spec.cli and hasattr(args, f.name):
            value = getattr(args, f.name)
            if spec.repeat and spec.parse is not None:
                try:
                    value = spec.parse(value)
                except (ValueError, TypeError) as e:
                    raise OptionsError(f"{flag_name(f, spec)}: {e}") from None
            out[f.name] = value
    return out


def options_from_args(args: argparse.Namespace, cls: type, *, defaults: Any = None, **overrides) -> Any:
    """An instance of ``cls``: ``defaults`` (or the field defaults), then the flags given, then ``overrides``.

    A flag given for a model it does not apply to raises :class:`OptionsError` naming the flag, as does any
    value the options reject.
    """
    values = dataclasses.asdict(defaults) if defaults is not None else {}
    values = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
    chosen = given(args, cls)
    merged = {**values, **chosen, **overrides}
    fields = {f.name: f for f in dataclasses.fields(cls)}

    # the values as the options resolve them (a default that depends on another option, e.g. the model): from all
    # the flags, else from those that no other option restricts
    specs = dict((f.name, s) for f, s in option_fields(cls))
    free = {k: v for k, v in merged.items() if k not in specs or not (specs[k].applies or specs[k].excludes or
                                                                       specs[k].requires)}
    resolved = None
    for attempt in (merged, free):
        try:
            resolved = cls(**attempt)
            break
        except (ValueError, TypeError):
            continue

    def value_of(other: str) -> Any:
        if other not in fields:
            return dataclasses.MISSING
        if resolved is not None:
            return getattr(resolved, other)
        return merged[other] if other in merged else default_of(fields[other])

    for name in chosen:
        spec = next(s for f, s in option_fields(cls) if f.name == name)
        why = why_not(spec, name, value_of, lambda n: flag_of(cls, n))
        if why:
            raise OptionsError(why)
    try:
        obj = cls(**{**values, **chosen, **overrides})
        check_options(obj)
    except OptionError as e:
        raise OptionsError(e.render(lambda name: flag_of(cls, name))) from None
    except ValueError as e:  # a check that names no option as such: its words as they are
        raise OptionsError(str(e)) from None
    from ..apps.command import check_shared

    try:
        check_shared(obj)
    except ValueError as e:
        raise OptionsError(str(e)) from None
    return obj
