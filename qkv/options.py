"""Options written once: a dataclass field carries its default, help, choices, range and the models it applies to.

Every application's options (and the trainer's :class:`qkv.train.TrainConfig`) are dataclasses whose fields are
made with :func:`option`. The same field then gives

- the library's validation (:func:`check_options`, called from ``__post_init__``): type, choices, range, and
  "this option does not apply to that model";
- the command line: :mod:`qkv.cli` generates each subcommand's flags from the fields (type, default, help and
  choices), so a field, its flag, its check and its help cannot drift apart.

Example::

    @dataclass
    class MyOptions:
        model: str = option("rnn", help="which model", choices=("rnn", "transformer"))
        num_heads: int = option(4, help="attention heads", low=1, applies={"model": ("transformer",)})

        def __post_init__(self):
            check_options(self)

``MyOptions(model="rnn", num_heads=8)`` raises ``ValueError: num_heads does not apply to model 'rnn' (only to
transformer)``: an option is never silently ignored. This module depends on nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["option", "OptionError", "NamesOptions", "option_error", "ref", "check_options", "option_fields",
           "field_type", "applies_to", "flag_name",
           "OptionSpec", "why_not", "not_applying", "default_of", "base_type", "is_set"]

_MISSING = dataclasses.MISSING


class NamesOptions:
    """What makes an exception name options as fields (the base of :class:`OptionError`, and of the exceptions
    :func:`option_error` makes): ``str()`` writes the field names, :meth:`render` writes each as ``spell`` says."""

    def __init__(self, template: str, *options: str, **values: Any):
        self.template, self.options, self.values = template, options, values
        super().__init__(self.render())

    def render(self, spell: Callable[[str], str] = str) -> str:
        """The message with each option written by ``spell(field name)``."""
        return self.template.format(**self.values, **{o: spell(o) for o in self.options})


class OptionError(NamesOptions, ValueError):
    """A bad value or use of options, naming each option as its field: ``OptionError("{max_len} must be >= {min_len}",
    "max_len", "min_len")``. ``str()`` writes the field names (``max_len``), as the library knows them; the command line
    writes each as its flag (``--max-len``) through :meth:`render`, without reading the text.

    ``template`` is a :meth:`str.format` string whose fields are the ``options`` (and any ``values`` given)."""


@functools.cache
def _naming(kind: type[BaseException]) -> type[BaseException]:
    return type(kind.__name__, (NamesOptions, kind), {"__module__": kind.__module__, "__qualname__": kind.__qualname__})


def option_error(kind: type[BaseException], template: str, *options: str, **values: Any) -> BaseException:
    """An exception of type ``kind`` (``OSError``, ``FileExistsError``...) whose message names options as fields, as
    an :class:`OptionError`'s does: ``raise option_error(FileNotFoundError, "drop " + ref("resume"), "resume")``."""
    return (kind if issubclass(kind, NamesOptions) else _naming(kind))(template, *options, **values)


def ref(name: str) -> str:
    """Option ``name`` in an :class:`OptionError`'s template: ``OptionError(ref("beam") + " must be >= 1", "beam")``."""
    return "{" + name + "}"


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """What :func:`option` stores in a field's metadata (under the key ``"qkv"``)."""

    help: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None  # smallest allowed value (numbers; each element of a tuple)
    high: float | None = None  # largest allowed value
    low_open: bool = False  # True: the value must be > low (not >=)
    applies: Mapping[str, tuple[Any, ...]] | None = None  # {"model": ("transformer",)}: only for these values
    excludes: Mapping[str, tuple[Any, ...]] | None = None  # {"data": ("dates",)}: not for these values
    requires: tuple[str, ...] = ()  # ("evaluate",): only when these other options are set (not None/False/empty)
    cli: bool = True  # False: not a command-line flag (set by code, e.g. the fold of a k-fold loop)
    flag: str | None = None  # the flag's name when not the field's name with dashes
    aliases: tuple[str, ...] = ()  # other names of the flag (older names that still work)
    short: str | None = None  # a one-letter alias, e.g. "-v"
    metavar: str | None = None
    positional: bool = False  # a positional argument instead of a --flag
    nargs: str | int | None = None  # for positionals and lists: "*", "+", "?" or a count
    parse: Callable[[str], Any] | None = None  # str -> value for types the parser cannot infer (e.g. "32,64")
    repeat: bool = False  # the flag may be given several times; values are collected into a list, then parse()d


def option(default: Any = _MISSING, *, help: str, default_factory: Callable[[], Any] | Any = _MISSING,
           choices: Sequence[Any] | None = None, low: float | None = None, high: float | None = None,
           low_open: bool = False, applies: Mapping[str, Sequence[Any]] | None = None,
           excludes: Mapping[str, Sequence[Any]] | None = None, requires: Sequence[str] = (), cli: bool = True,
           flag: str | None = None, aliases: Sequence[str] = (), short: str | None = None,
           metavar: str | None = None, positional: bool = False,
           nargs: str | int | None = None, parse: Callable[[str], Any] | None = None,
           repeat: bool = False) -> Any:
    """A dataclass field with what its command-line flag and its validation need (see the module docstring).

    Args:
        default / default_factory: as for :func:`dataclasses.field`.
        help: one line for ``--help``.  choices: the allowed values.
        low, high, low_open: the allowed range of a number (``low_open``: strictly above ``low``); floats must
            also be finite.
        applies: ``{other_field: allowed values}``: the option only means something when ``other_field`` has
            one of these values; set to anything but its default otherwise, it is an error.
        excludes: ``{other_field: values}``: the option means nothing when ``other_field`` has one of these.
        requires: other fields that must be set (not ``None``, ``False`` or empty) for the option to mean
            anything, e.g. ``("evaluate",)``; a class without such a field does not check it (a shared option
            used both alone and inside a mode).
        cli: whether it is a command-line flag.  flag, metavar: its name and placeholder.  aliases: other names
            of the flag.
        positional, nargs: a positional argument.  parse: ``str -> value`` for the command line.
        repeat: a flag that may be repeated (values collected into a list and given to ``parse``).
    """
    spec = OptionSpec(help=help, choices=tuple(choices) if choices is not None else None, low=low, high=high,
                      low_open=low_open, applies={k: tuple(v) for k, v in applies.items()} if applies else None,
                      excludes={k: tuple(v) for k, v in excludes.items()} if excludes else None,
                      requires=tuple(requires), cli=cli, flag=flag, aliases=tuple(aliases), short=short,
                      metavar=metavar, positional=positional, nargs=nargs, parse=parse,
                      repeat=repeat)
    kw: dict[str, Any] = {"metadata": {"qkv": spec}}
    if default_factory is not _MISSING:
        kw["default_factory"] = default_factory
    elif default is not _MISSING:
        kw["default"] = default
    return dataclasses.field(**kw)


def option_fields(cls_or_obj) -> list[tuple[dataclasses.Field, OptionSpec]]:
    """The fields of an options dataclass made with :func:`option`, in order, with their specs."""
    return [(f, f.metadata["qkv"]) for f in dataclasses.fields(cls_or_obj) if "qkv" in f.metadata]


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls, name: str) -> Any:
    """The resolved type annotation of field ``name`` (``int``, ``int | None``, ``tuple[int, ...]``...)."""
    return _type_hints(cls if isinstance(cls, type) else type(cls))[name]


def base_type(tp: Any) -> tuple[Any, bool]:
    """``(T, optional)`` for ``T`` or ``T | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def flag_name(f: dataclasses.Field, spec: OptionSpec) -> str:
    """The command-line name of a field: ``--max-minutes`` for ``max_minutes`` (or ``spec.flag``)."""
    return spec.flag or "--" + f.name.replace("_", "-")


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return _MISSING


def is_set(value: Any) -> bool:
    """Whether an option's value says it was set: not ``None``, ``False`` or empty."""
    return not (value is None or value is False or (isinstance(value, str | tuple | list | dict) and not value))


def why_not(spec: OptionSpec, name: str, value_of: Callable[[str], Any],
            show: Callable[[str], str] = str) -> str | None:
    """Why option ``name`` does not apply given the other options' values (``value_of(other)``, ``MISSING``
    for an option the class does not have), or None if it does; ``show`` writes an option's name (a field name,
    or a flag on the command line)."""
    error = not_applying(spec, name, value_of)
    return None if error is None else error.render(show)


def not_applying(spec: OptionSpec, name: str, value_of: Callable[[str], Any]) -> OptionError | None:
    """:func:`why_not` as an :class:`OptionError` (its options named as fields), or None."""
    needed = [other for other in spec.requires if value_of(other) is not _MISSING]
    if needed and not all(is_set(value_of(other)) for other in needed):
        return OptionError(ref(name) + " goes with " + " ".join(map(ref, needed)) +
                           " (without it, it would be ignored)", name, *needed)
    for other, allowed in (spec.applies or {}).items():
        if value_of(other) not in allowed:
            return OptionError(ref(name) + " does not apply to " + ref(other) + " {value} (only to " + ref(other) +
                               " {allowed})", name, other, value=value_of(other),
                               allowed=" or ".join(map(str, allowed)))
    for other, refused in (spec.excludes or {}).items():
        if value_of(other) in refused:
            return OptionError(ref(name) + " does not apply to " + ref(other) + " {value}", name, other,
                               value=value_of(other))
    return None


def applies_to(obj, name: str) -> tuple[bool, str]:
    """Whether option ``name`` means something for ``obj``'s other settings, and if not, why (one phrase)."""
    spec = next(s for f, s in option_fields(obj) if f.name == name)
    why = why_not(spec, name, lambda other: getattr(obj, other, _MISSING))
    return why is None, why or ""


def _check_number(name: str, value: Any, spec: OptionSpec, want: Any) -> None:
    def bad(what: str) -> OptionError:
        return OptionError(ref(name) + " must be " + what + ", got {value!r}", name, value=value)

    if want is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return
    if want is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("an integer")
    if want is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        if not math.isfinite(value):
            raise bad("a finite number")
    if spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low):
        raise bad(f"{'>' if spec.low_open else '>='} {spec.low:g}")
    if spec.high is not None and value > spec.high:
        raise bad(f"<= {spec.high:g}")


def check_value(obj, f: dataclasses.Field, spec: OptionSpec) -> None:
    """Type, choices and range of one field's value; an :class:`OptionError` naming the field."""
    value = getattr(obj, f.name)
    tp, optional = base_type(field_type(obj, f.name))
    name = f.name
    if value is None:
        if not optional:
            raise OptionError(ref(name) + " must be set, got None", name)
        return
    if spec.choices is not None and value not in spec.choices:
        raise OptionError(ref(name) + " must be one of {choices}, got {value!r}", name,
                          choices=", ".join(map(str, spec.choices)), value=value)
    if tp in (int, float, bool):
        _check_number(name, value, spec, tp)
    elif tp is str and not isinstance(value, str):
        raise OptionError(ref(name) + " must be a string, got {value!r}", name, value=value)
    elif typing.get_origin(tp) is tuple:
        want = typing.get_args(tp)[0]
        if not isinstance(value, tuple):
            raise OptionError(ref(name) + " must be a tuple, got {value!r}", name, value=value)
        for v in value:
            _check_number(name, v, spec, want)


def check_options(obj) -> None:
    """Validate every :func:`option` field of ``obj``: type, choices, range, and that an option set to anything
    but its default applies to the other settings. Raises an :class:`OptionError` (a ``ValueError``) naming the
    field."""
    fields = option_fields(obj)
    for f, spec in fields:
        check_value(obj, f, spec)
    for f, spec in fields:
        if (spec.applies or spec.excludes or spec.requires) and getattr(obj, f.name) != default_of(f):
            error = not_applying(spec, f.name, lambda other: getattr(obj, other, _MISSING))
            if error is not None:
                raise error
