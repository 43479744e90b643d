"""Applications: each one folder ``qkv/apps/NAME/`` holding everything that is its own (options, data, model spec,
metric, predictor, pictures, export graphs, command), each a small subclass of one contract (:mod:`qkv.apps.base`).

Words used throughout: an *application* (translation, speech...) is what ``qkv train NAME`` trains; a *run* is the
folder one training wrote (its ``best/`` and ``checkpoint/``); the *task* is the trainer's side of an application
(:class:`qkv.train.Task`).

The registry below is what the command line walks. :func:`catalogue` lists the applications and their commands
without importing any of them (``qkv --help`` stays fast): qkv's own are the packages of this folder, each
declaring its help and its commands' help in ``about.json`` (data, read without importing the package);
:func:`register_application` adds one defined elsewhere, and :func:`load_plugins` imports those the environment
names (``QKV_APPS``, or a package's ``qkv.applications`` entry points) for the command line. :func:`application`
imports one when it is used; :func:`load_predictor` reads a run of any application, its configuration and weights
read once.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from pathlib import Path

from .base import Application, ApplicationTask, Command, Predictor, ViewInput, about_of

__all__ = ["About", "catalogue", "application", "application_of", "load_predictor", "register_application",
           "unregister_application", "load_plugins", "Application", "ApplicationTask", "Command", "Predictor",
           "ViewInput"]

_HERE = Path(__file__).parent
_REGISTERED: dict[str, Application] = {}


@dataclasses.dataclass(frozen=True)
class About:
    """What the command line knows of an application before importing it: its ``help`` (``qkv train --help``) and
    its own commands, name -> help."""

    name: str
    help: str
    commands: dict[str, str]


def _read_about(folder: Path) -> About | None:
    """The ``about.json`` of the application package ``folder`` (read as data: the package is not imported)."""
    about = about_of(folder.name) if (folder / "__init__.py").is_file() else None
    return None if about is None else About(folder.name, about["help"], dict(about.get("commands", {})))


@functools.cache
def _builtin() -> dict[str, About]:
    found = (_read_about(d) for d in sorted(_HERE.iterdir()) if d.is_dir() and not d.name.startswith("_"))
    return {a.name: a for a in found if a is not None}


def catalogue() -> dict[str, About]:
    """Every application, name -> :class:`About`: qkv's own (in the order ``qkv train --help`` lists them), then
    those added by :func:`register_application`. Nothing is imported."""
    order = ("translate", "sentiment", "images", "caption", "qa", "segment", "summarize", "speech", "lm")
    own = _builtin()
    names = [n for n in order if n in own] + sorted(n for n in own if n not in order)
    out = {n: own[n] for n in names}
    for name, app in _REGISTERED.items():
        out[name] = About(name, app.help, {c: cmd.help for c, cmd in app.commands.items()})
    return out


def register_application(app: Application) -> Application:
    """Add ``app`` to the registry (``qkv train NAME``, ``qkv evaluate``, ``qkv view``, ``qkv predict``, ``qkv
    export`` and its own commands then know it); ``ValueError`` for a name already taken. Returns ``app``."""
    if not isinstance(app, Application):
        raise TypeError(f"register_application takes an Application, got {type(app).__name__}")
    if app.name in catalogue():
        raise ValueError(f"an application is already called {app.name!r}")
    if app.task.name != app.name:
        raise ValueError(f"application {app.name!r}: its task is called {app.task.name!r}; they must be the same "
                         "(the name every checkpoint of its runs stores)")
    taken = {c for about in catalogue().values() for c in about.commands}
    clash = sorted(set(app.commands) & taken)
    if clash:
        raise ValueError(f"application {app.name!r}: the command {clash[0]!r} is already another application's")
    _REGISTERED[app.name] = app
    return app


def load_plugins() -> list[str]:
    """Import the applications defined outside qkv that the environment names, each registering itself when
    imported: the files or modules of ``QKV_APPS`` (separated by ``os.pathsep``: ``QKV_APPS=my_app.py qkv train
    my-app``) and the entry points of the group ``qkv.applications`` of installed packages. Returns what was
    imported; one that cannot be is a ``ValueError`` naming it."""
    import importlib.util
    import sys
    from importlib.metadata import entry_points

    loaded = []
    for entry in filter(None, os.environ.get("QKV_APPS", "").split(os.pathsep)):
        path = Path(entry)
        try:
            if path.suffix == ".py":
                if not path.is_file():
                    raise FileNotFoundError(f"no such file: {entry}")
                spec = importlib.util.spec_from_file_location(f"qkv_plugin_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(entry)
        except ValueError as e:
            if "already called" not in str(e):
                raise ValueError(f"QKV_APPS: {entry}: {e}") from None
        except (ImportError, OSError, SyntaxError) as e:
            raise ValueError(f"QKV_APPS: cannot import {entry} ({type(e).__name__}: {e})") from None
        loaded.append(entry)
    for ep in entry_points(group="qkv.applications"):
        if ep.name not in catalogue():
            ep.load()
            loaded.append(ep.value)
    return loaded


def unregister_application(name: str) -> None:
    """Remove an application that :func:`register_application` added (``ValueError`` for any other name)."""
    if name not in _REGISTERED:
        raise ValueError(f"{name!r} is not a registered application")
    del _REGISTERED[name]


def application(name: str) -> Application:
    """The application called ``name``, imported now (``ValueError`` listing the names for another)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _builtin():
        raise ValueError(f"no application {name!r}; qkv has {', '.join(catalogue())}")
    return importlib.import_module(f"{__name__}.{name}").APPLICATION


def application_of(run: str | os.PathLike) -> Application:
    """The application whose run (or checkpoint) ``run`` is, read from its ``config.json`` alone."""
    from .run import run_application

    task = run_application(run)
    if task not in catalogue():
        raise ValueError(f"{run} is a {task!r} run; qkv knows {', '.join(catalogue())}")
    return application(task)


def load_predictor(run, device: str = "auto", name: str | None = None) -> Predictor:
    """The predictor of any application's run (a run or checkpoint directory, or a read
    :class:`qkv.train.checkpoint.Checkpoint`), its folder resolved and its files read once:
    ``load_predictor("runs/dates").predict(["7 mars 2019"])``. ``name``: the application the run must be."""
    from ..train.checkpoint import Checkpoint, load_checkpoint

    ckpt = run if isinstance(run, Checkpoint) else load_checkpoint(run)
    if name is not None and ckpt.task != name:
        raise ValueError(f"{ckpt.path} holds a {ckpt.task!r} model, not a {name!r} one")
    if ckpt.task not in catalogue():
        raise ValueError(f"{run} is a {ckpt.task!r} run; qkv knows {', '.join(catalogue())}")
    return application(ckpt.task).predictor.load(ckpt, device)
