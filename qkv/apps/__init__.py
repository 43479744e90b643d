"""Applications as plain libraries, each a small subclass of one contract (:mod:`qkv.apps.base`): a package
``qkv/apps/NAME/`` with ``options.py`` (``NAMEOptions``, ``train_defaults``), ``task.py`` (``load_data``,
``model_spec``, its metric function and ``NAMETask``, an :class:`~qkv.apps.base.ApplicationTask`), ``predictor.py``
(the result type and the :class:`~qkv.apps.base.Predictor`: ``predict`` / ``evaluate`` / ``view`` /
``result_row``; ``load`` is the base's) and ``APPLICATION`` in its ``__init__.py``.

The registry below is what the command line walks: ``qkv train NAME``, ``qkv evaluate RUN`` and ``qkv view RUN``
(a run knows its application); :func:`register_application` adds one defined elsewhere. CONTRIBUTING.md says how
to add an application.
"""

from __future__ import annotations

import importlib
import os

from .base import Application, ApplicationTask, Predictor, ViewInput

__all__ = ["APPLICATIONS", "application", "application_of", "load_predictor", "register_application",
           "unregister_application", "Application", "ApplicationTask", "Predictor", "ViewInput"]

#: the applications' names, in the order ``qkv train --help`` lists them: qkv's own (each a package
#: ``qkv.apps.NAME``), then those added by :func:`register_application`
APPLICATIONS: list[str] = ["translate", "sentiment", "images", "caption", "qa", "segment", "summarize", "speech",
                           "lm"]
_REGISTERED: dict[str, Application] = {}


def register_application(app: Application) -> Application:
    """Add ``app`` to the registry (``qkv train NAME``, ``qkv evaluate``, ``qkv view`` and ``qkv predict`` then
    know it); ``ValueError`` for a name already taken. Returns ``app``."""
    if not isinstance(app, Application):
        raise TypeError(f"register_application takes an Application, got {type(app).__name__}")
    if app.name in APPLICATIONS:
        raise ValueError(f"an application is already called {app.name!r}")
    if app.task.name != app.name:
        raise ValueError(f"application {app.name!r}: its task is called {app.task.name!r}; they must be the same "
                         "(the name every checkpoint of its runs stores)")
    _REGISTERED[app.name] = app
    APPLICATIONS.append(app.name)
    return app


def unregister_application(name: str) -> None:
    """Remove an application that :func:`register_application` added (``ValueError`` for any other name)."""
    if name not in _REGISTERED:
        raise ValueError(f"{name!r} is not a registered application")
    del _REGISTERED[name]
    APPLICATIONS.remove(name)


def application(name: str) -> Application:
    """The application called ``name`` (``ValueError`` listing the names for another)."""
    if name not in APPLICATIONS:
        raise ValueError(f"no application {name!r}; qkv has {', '.join(APPLICATIONS)}")
    if name in _REGISTERED:
        return _REGISTERED[name]
    return importlib.import_module(f"{__name__}.{name}").APPLICATION


def application_of(run: str | os.PathLike) -> Application:
    """The application whose run (or checkpoint) ``run`` is, read from its ``config.json`` alone (the weights are
    read once, by the predictor's ``load``)."""
    from .run import run_task

    task = run_task(run)
    if task not in APPLICATIONS:
        raise ValueError(f"{run} is a {task!r} run; qkv knows {', '.join(APPLICATIONS)}")
    return application(task)


def load_predictor(run: str | os.PathLike, device: str = "auto") -> Predictor:
    """The predictor of any application's run: ``load_predictor("runs/dates").predict(["7 mars 2019"])``."""
    return application_of(run).predictor.load(run, device)
