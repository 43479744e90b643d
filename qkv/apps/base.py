"""The contract of every application, written once: :class:`Application` (what the registry knows),
:class:`ApplicationTask` (the trainer's side) and :class:`Predictor` (a run read back).

An application (translation, sentiment, images, captioning, question answering...) is a package
``qkv/apps/NAME/`` that states only what is its own:

- its options (``NAMEOptions``, a dataclass of :func:`qkv.options.option` fields) and ``train_defaults``;
- its data (``load_data(options)``) and its model (``model_spec(options, **sizes)``: JSON for
  :func:`qkv.models.create`);
- the trainer's ``NAMETask``, a subclass of :class:`ApplicationTask`: ``setup``, ``train_examples``, ``collate``,
  ``loss``, ``evaluate`` (the one metric function of the application), ``sizes`` and, when it has more to keep
  than the model and the options, ``run_config``; its tokenisers are named in ``assets``;
- a :class:`Predictor` subclass: ``predict``, ``evaluate`` (through the same metric function), ``view`` (how it
  shows an input), ``result_row`` and, for inputs that are not texts, ``inputs_from_strings``.

The base writes the rest once: saving and loading the configuration (``config()``: the model spec, the options
and ``run_config()``), the assets (each name in ``assets`` a tokeniser saved under ``assets/NAME``), the weights
(read once, any checkpoint format: :mod:`qkv.apps.run`), ``build_model()``, ``Predictor.load`` and the run's
data read once (``Predictor.data``). :mod:`qkv.apps` keeps the registry that the command line walks
(``qkv train NAME``, ``qkv predict RUN``, ``qkv evaluate RUN``, ``qkv view RUN``); CONTRIBUTING.md says how to
add an application.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from ..train.task import Task
from ..viz.page import PageInput
from .predictor import (
    Accepts,
    ImagePredictor,
    Predictor,
    ViewInput,
    a_run,
    check_index,
    evaluating,
    file_inputs,
    jsonable,
    length_batches,
    need_text,
    refuse_settings,
    text_inputs,
)
from .run import LoadedRun, load_run, model_from_spec, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["Application", "Accepts", "Command", "ApplicationTask", "Predictor", "ImagePredictor", "PageInput",
           "ViewInput", "a_run", "load_run", "upgrade_options", "model_from_spec", "LoadedRun", "need_text",
           "text_inputs", "file_inputs", "check_index", "refuse_settings", "jsonable", "length_batches", "evaluating"]


def about_of(name: str) -> dict[str, Any] | None:
    """``about.json`` of qkv's own application ``name`` (its help and its commands' help, read without importing
    the package), or ``None``."""
    import json

    path = Path(__file__).parent / name / "about.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclasses.dataclass(frozen=True)
class Command:
    """A command of an application's own (``qkv transcribe``, ``qkv classify``): its help line, its options (a
    dataclass of :func:`qkv.options.option` fields, turned into flags by the command line) and ``run(options) ->
    exit code``."""

    help: str
    options: type
    run: Callable[[Any], int]


@dataclasses.dataclass(frozen=True)
class Application:
    """What the registry (and so the command line) knows of an application.

    Attributes:
        name: ``qkv train NAME``; also the ``task`` name stored in every checkpoint of its runs.
        help: one line for ``qkv train --help``.
        task: the trainer's ``NAMETask(options, data=None)``, an :class:`ApplicationTask`.
        predictor: the :class:`Predictor` subclass that reads its runs back.
        train_defaults: ``options -> qkv.train.TrainConfig``, the trainer's preset for this application.
        options: the ``NAMEOptions`` dataclass (data, model, loss, evaluation: everything not the trainer's);
            by default the task's.
        load_data: ``options -> data``, the splits ``options`` describe (read or generated); by default the task's.
        model_spec: ``(options, **sizes) -> {"name", "config"}`` for :func:`qkv.models.create` (JSON only); by
            default the task's.
        train: ``(options, train_config) -> list of qkv.train.TrainResult``; ``None``: one run of ``task``
            (sentiment's k-fold cross-validation is its own).
        budget_defaults: ``(options, train_config) -> {field: value}``, optional: the options' defaults sized to
            the run's budget (``max_minutes``, ``max_steps``; ``qkv train`` applies them under the flags given);
            ``None``: one size for all.
        commands: the application's own commands (``qkv transcribe``), name -> :class:`Command`, or ``(options,
            run)`` with the help in the application's ``about.json``.
        export: ``predictor -> {graph name: (module, example inputs, manifest extras)}``, the ONNX graphs of a run
            (:func:`qkv.apps.export.export_run`); ``None``: its runs cannot be exported.
        upgrade: ``config -> config``, a run's configuration of checkpoint format 1 (qkv 0.1.0) in the current
            format; by default the task's (``ApplicationTask.upgrade``); ``None``: no format-1 runs.
    """

    name: str
    help: str | None = None  # None: the help of ``about.json`` beside the application's package
    task: type = None  # type: ignore[assignment]
    predictor: type[Predictor] = None  # type: ignore[assignment]
    train_defaults: Callable[[Any], Any] = None  # type: ignore[assignment]
    options: type | None = None
    load_data: Callable[[Any], Any] | None = None
    model_spec: Callable[..., dict[str, Any]] | None = None
    train: Callable[[Any, Any], list[Any]] | None = None
    budget_defaults: Callable[[Any, Any], dict[str, Any]] | None = None
    commands: Mapping[str, Command] = dataclasses.field(default_factory=dict)
    export: Callable[[Any], dict[str, Any]] | None = None
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        about = about_of(self.name) if self.help is None or any(
            not isinstance(c, Command) for c in self.commands.values()) else None
        if self.help is None:
            if about is None:
                raise ValueError(f"application {self.name!r}: no help given and no about.json")
            object.__setattr__(self, "help", about["help"])
        commands = {name: c if isinstance(c, Command) else Command(about["commands"][name], *c)
                    for name, c in self.commands.items()}
        object.__setattr__(self, "commands", commands)
        if self.task is None or self.predictor is None or self.train_defaults is None:
            raise TypeError(f"application {self.name!r} needs task, predictor and train_defaults")
        for name, default in (("options", "options_type"), ("load_data", "load_data"), ("model_spec", "model_spec"),
                              ("upgrade", "upgrade")):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self.task, default))

    def run_training(self, options: Any, config: Any) -> list[Any]:
        """Train with ``options`` and the trainer's ``config``: the :class:`qkv.train.TrainResult` of each run."""
        if self.train is not None:
            return self.train(options, config)
        from ..train import train

        return [train(self.task(options), config)]


class ApplicationTask(Task):
    """The trainer's task of an application: what :class:`qkv.train.Task` needs, with the bridge to the model and
    the run's files written once.

    A subclass states its parts as class keywords: ``name`` (the application's), ``unit``, ``options`` (its options
    dataclass, kept as ``options_type``), ``load_data`` and ``model_spec`` (its module's functions) and ``assets`` (the
    names of the tokenisers it keeps as attributes: ``("tokenizer",)``, ``("src_tokenizer", "tgt_tokenizer")``)::

        class TranslateTask(ApplicationTask, name="translate", unit="tokens", options=TranslateOptions,
                            load_data=load_data, model_spec=model_spec, assets=("src_tokenizer", "tgt_tokenizer")):

    and writes ``setup`` (read the data with :meth:`read_data`, fit the tokenisers that are still ``None``),
    ``train_examples``, ``collate``, ``loss``, ``evaluate`` and ``sizes`` (the keyword arguments of ``model_spec``,
    from the data and the tokenisers). ``run_config()`` adds what a predictor needs beyond the model and the
    options (class names, normalisation); ``callbacks(config)`` gives the trainer's callbacks.

    ``NAMETask(options, data=None)``: ``data``, what ``load_data`` returns, shares one read between runs.
    """

    options_type: ClassVar[type]
    load_data: ClassVar[Callable[[Any], Any]]
    model_spec: ClassVar[Callable[..., dict[str, Any]]]
    assets: ClassVar[tuple[str, ...]] = ()
    #: attributes kept as ``assets/NAME.json`` with every checkpoint and read back on a resume (JSON values; one
    #: that is ``None`` is not written): what a run needs to rebuild its model besides its tokenisers
    json_assets: ClassVar[tuple[str, ...]] = ()
    #: ``config -> config``: a run's configuration of checkpoint format 1 (qkv 0.1.0) in the current format; ``None``:
    #: the application has no format-1 runs
    upgrade: ClassVar[Callable[[dict[str, Any]], dict[str, Any]] | None] = None

    def __init_subclass__(cls, *, name: str | None = None, unit: str | None = None, options: type | None = None,
                          load_data: Callable | None = None, model_spec: Callable | None = None,
                          assets: Sequence[str] | None = None, upgrade: Callable | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr, value in (("name", name), ("unit", unit), ("options_type", options), ("assets", assets),
                            ("load_data", load_data), ("model_spec", model_spec), ("upgrade", upgrade)):
            if value is not None:
                setattr(cls, attr, staticmethod(value) if attr in ("load_data", "model_spec", "upgrade") else
                        tuple(value) if attr == "assets" else value)

    def __init__(self, options: Any, data: Any = None):
        self.options = options
        self.data = data
        for asset in self.assets:
            setattr(self, asset, None)

    def read_data(self) -> Any:
        """The data of :attr:`options` (``load_data``), read once: the one given to the constructor, if any."""
        if self.data is None:
            self.data = self.load_data(self.options)
        return self.data

    def sizes(self) -> dict[str, Any]:
        """The keyword arguments of ``model_spec`` besides the options, from the data (after :meth:`setup`)."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """``{"name", "config"}`` of the model :meth:`build_model` makes (JSON)."""
        return self.model_spec(self.options, **self.sizes())

    def run_config(self) -> dict[str, Any]:
        """What the run keeps in its ``config.json`` beside the model and the options (JSON); none by default."""
        return {}

    def config(self) -> dict[str, Any]:
        from .fingerprint import data_fingerprint

        if not hasattr(self, "_fingerprint"):  # read once: what an evaluation checks (None: generated data)
            self._fingerprint = data_fingerprint(self.options)
        fingerprint = self._fingerprint
        return {"model": self.spec(), **self.run_config(), "options": dataclasses.asdict(self.options),
                **({"data": fingerprint} if fingerprint else {})}

    def build_model(self) -> nn.Module:
        return model_from_spec(self.spec())

    def save_assets(self, directory: Path) -> None:
        import json

        for asset in self.assets:
            getattr(self, asset).save(directory / asset)
        for name in self.json_assets:  # what a resumed run needs besides its tokenisers (None: nothing to keep)
            if getattr(self, name, None) is not None:
                (directory / f"{name}.json").write_text(json.dumps(getattr(self, name), indent=1) + "\n",
                                                        encoding="utf-8")

    def load_assets(self, directory: Path) -> None:
        import json

        from ..data import load_tokenizer

        for asset in self.assets:
            setattr(self, asset, load_tokenizer(directory / asset))
        for name in self.json_assets:
            path = directory / f"{name}.json"
            if path.is_file():
                setattr(self, name, json.loads(path.read_text(encoding="utf-8")))
