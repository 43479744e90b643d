"""Applications as plain libraries, all of one shape (:class:`~qkv.tasks.base.Application`): a package
``qkv/tasks/NAME/`` with ``options.py`` (``NAMEOptions``, ``train_defaults``), ``task.py`` (``load_data``,
``model_spec``, ``build_model``, ``NAMETask``), ``predictor.py`` (the result type and the
:class:`~qkv.tasks.base.Predictor`: ``load`` / ``predict`` / ``evaluate`` / ``view``) and ``APPLICATION`` in its
``__init__.py``.

The registry below is what the command line walks: ``qkv train NAME``, ``qkv evaluate RUN`` and ``qkv view RUN``
(a run knows its application). CONTRIBUTING.md says how to add an application.
"""

from __future__ import annotations

import importlib
import os

from .base import Application, PageInput, Predictor, ViewInput

__all__ = ["APPLICATIONS", "application", "application_of", "load_predictor", "Application", "Predictor",
           "PageInput", "ViewInput"]

#: the applications, in the order ``qkv train --help`` lists them (each a package ``qkv.tasks.NAME``)
APPLICATIONS = ("translate", "sentiment", "images", "caption", "qa", "segment", "summarize", "speech")


def application(name: str) -> Application:
    """The application called ``name`` (``ValueError`` listing the names for another)."""
    if name not in APPLICATIONS:
        raise ValueError(f"no application {name!r}; qkv has {', '.join(APPLICATIONS)}")
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
