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

import contextlib
import dataclasses
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..train.task import Task
from ..viz.page import PageInput
from .run import LoadedRun, load_run, model_from_spec, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["Application", "Command", "ApplicationTask", "Predictor", "PageInput", "ViewInput", "load_run",
           "upgrade_options", "model_from_spec", "LoadedRun", "need_text", "text_inputs", "file_inputs",
           "refuse_settings", "jsonable", "length_batches", "evaluating"]


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
        commands: the application's own commands (``qkv transcribe``), name -> :class:`Command`.
        export: ``predictor -> {graph name: (module, example inputs, manifest extras)}``, the ONNX graphs of a run
            (:func:`qkv.apps.export.export_run`); ``None``: its runs cannot be exported.
        upgrade: ``config -> config``, a run's configuration of checkpoint format 1 (qkv 0.1.0) in the current
            format; ``None``: the application has no format-1 runs.
    """

    name: str
    help: str
    task: type
    predictor: type[Predictor]
    train_defaults: Callable[[Any], Any]
    options: type | None = None
    load_data: Callable[[Any], Any] | None = None
    model_spec: Callable[..., dict[str, Any]] | None = None
    train: Callable[[Any, Any], list[Any]] | None = None
    budget_defaults: Callable[[Any, Any], dict[str, Any]] | None = None
    commands: Mapping[str, Command] = dataclasses.field(default_factory=dict)
    export: Callable[[Any], dict[str, Any]] | None = None
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        for name, default in (("options", "options_type"), ("load_data", "load_data"), ("model_spec", "model_spec")):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self.task, default))

    def run_training(self, options: Any, config: Any) -> list[Any]:
        """Train with ``options`` and the trainer's ``config``: the :class:`qkv.train.TrainResult` of each run."""
        if self.train is not None:
            return self.train(options, config)
        from ..train import train

        return [train(self.task(options), config)]


@dataclasses.dataclass
class ViewInput:
    """One input to look at (``qkv view``): what an application takes of it is its own (a text, an image...)."""

    text: str | None = None
    image: Any = None  #: a path or a tensor
    index: int | None = None  #: an example of the run's test split
    question: str | None = None


def need_text(text: str | None, what: str) -> str:
    """``text``, or a ``ValueError`` saying that ``what`` needs one."""
    if text is None or not text.strip():
        raise ValueError(f"a {what} run needs a text to look at")
    return text


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

    def __init_subclass__(cls, *, name: str | None = None, unit: str | None = None, options: type | None = None,
                          load_data: Callable | None = None, model_spec: Callable | None = None,
                          assets: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr, value in (("name", name), ("unit", unit), ("options_type", options), ("assets", assets),
                            ("load_data", load_data), ("model_spec", model_spec)):
            if value is not None:
                setattr(cls, attr, staticmethod(value) if attr in ("load_data", "model_spec") else
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
        return {"model": self.spec(), **self.run_config(), "options": dataclasses.asdict(self.options)}

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


class Predictor(ABC):
    """A trained run of one application, read back for use: the same methods in every application.

    A subclass sets ``task_class`` (its :class:`ApplicationTask`: the name, options, data reader and assets come
    from it) and writes ``predict``, ``evaluate``, ``view`` and ``result_row``; ``__init__(model, options,
    config=None, **assets)`` keeps the model (eval mode), the options, the run's configuration and each asset as
    an attribute (a subclass that derives more from them extends it).

    - ``load(run_dir, device="auto")`` reads a run (its ``best/``, else ``checkpoint/``) or a checkpoint
      directory of any release (through :func:`load_run`; the weights are read once), and the assets;
    - ``predict(inputs)`` takes a list of inputs (texts, images, ``(context, question)`` pairs...) and returns a
      list of the application's result dataclass, which carries the attention; an empty input is a
      ``ValueError``;
    - ``evaluate(data=None, split="test", limit=None)`` returns ``{metric: value}`` on a split of the run's own
      data or of ``data`` (another corpus in the same format);
    - ``view(ViewInput)`` runs the model on one input inside :func:`qkv.capture_attention` and returns the
      :class:`PageInput` of ``qkv view``.

    And the two that let one command (``qkv predict RUN INPUT...``) serve every application:

    - ``inputs_from_strings(strings, **given)``: the inputs of ``predict`` that command-line strings stand for
      (:attr:`input_kind` says what one string is: a text, an image or audio file, a ``context<TAB>question``
      pair); a bad string is a ``ValueError`` naming it (``input 2: ...``). By default each string is a text.
    - ``result_row(result) -> dict``: a JSON-able summary of one result of ``predict`` (no tensors, no NaN):
      ``"output"``, the one line a person reads (the translation, the label, the caption, the answer...), and the
      application's own figures beside it.
    """

    #: the application's trainer task, whose name, options, ``load_data`` and assets the predictor shares
    task_class: ClassVar[type[ApplicationTask]]
    #: the application's name (``Application.name``, the checkpoint's ``task``): ``task_class.name``
    task: ClassVar[str]
    #: what one command-line string is to :meth:`inputs_from_strings`: ``"text"``, ``"image file"``...
    input_kind: ClassVar[str] = "text"
    #: what :meth:`view` looks at, of a :class:`ViewInput`'s fields (``text``, ``image``, ``index``, ``question``)
    view_inputs: ClassVar[tuple[str, ...]] = ("text",)

    model: nn.Module
    options: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "task_class" in cls.__dict__:
            cls.task = cls.task_class.name

    def __init__(self, model: nn.Module, options: Any, config: Mapping[str, Any] | None = None, **assets: Any):
        wanted = set(self.task_class.assets)
        if set(assets) != wanted:
            raise TypeError(f"{type(self).__name__} takes the assets {', '.join(sorted(wanted)) or 'none'}, got "
                            f"{', '.join(sorted(assets)) or 'none'}")
        self.model, self.options, self.config = model.eval(), options, dict(config or {})
        for name, value in assets.items():
            setattr(self, name, value)
        self._data: dict[Any, Any] = {}

    @classmethod
    def load(cls, run_dir, device: str | torch.device = "auto") -> Predictor:
        """Read ``run_dir`` (a run directory: its ``best/``, else ``checkpoint/``; a checkpoint directory, of any
        release; or a :class:`~qkv.train.checkpoint.Checkpoint` already read) for prediction, the model on
        ``device`` (``auto``: CUDA when there is one)."""
        from ..data import load_tokenizer

        run = load_run(run_dir, cls.task, cls.task_class.options_type, device)
        assets = {name: load_tokenizer(run.checkpoint.assets / name) for name in cls.task_class.assets}
        return cls(run.model, run.options, run.config, **assets)

    def options_for(self, data: str | None) -> Any:
        """The run's options reading ``data`` instead of its own (``None``: its own), what applied only to the old
        data reset to the defaults."""
        if not data or data == self.options.data:
            return self.options
        return upgrade_options(type(self.options), {**dataclasses.asdict(self.options), "data": data})

    def read_data(self, data: str | None) -> Any:
        """The data :meth:`data` keeps: ``load_data`` of :meth:`options_for` ``data``."""
        return self.task_class.load_data(self.options_for(data))

    def data(self, data: str | None = None) -> Any:
        """The run's data (or ``data``, another source of the same format), read once (:meth:`read_data`)."""
        if data not in self._data:
            self._data[data] = self.read_data(data)
        return self._data[data]

    @abstractmethod
    def predict(self, inputs: Sequence[Any]) -> list[Any]:
        """One result per input."""

    @abstractmethod
    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 **settings: Any) -> dict[str, float]:
        """The application's metrics on ``split`` of the run's data (or of ``data``), at most ``limit`` examples."""

    @abstractmethod
    def view(self, given: ViewInput) -> PageInput:
        """Every attention of the model on one input, for :func:`qkv.viz.page.save_attention_page`."""

    def note(self, result: Any, settings: Mapping[str, Any]) -> str | None:
        """What ``result`` (one of :meth:`predict`'s, made with ``settings``) left out, in words (a source cut at the
        model's limit, an output stopped at the longest allowed), or ``None``. Every command says it on stderr and
        in the result's row; none by default (what the library already logs is not said twice)."""
        return None

    def check_settings(self, given: Mapping[str, Any], method: str = "evaluate") -> dict[str, Any]:
        """``given`` (settings that are not ``None``) when :meth:`predict` or :meth:`evaluate` (``method``) takes
        every one of them; else a ``ValueError`` naming those it does not take."""
        import inspect

        takes = inspect.signature(getattr(self, method)).parameters
        if any(p.kind is p.VAR_KEYWORD for p in takes.values()):
            return dict(given)
        refused = [k for k in given if k not in takes or k in ("inputs", "data", "split", "limit")]
        if refused:
            raise ValueError(f"{', '.join(refused)} {'does' if len(refused) == 1 else 'do'} not apply to {self.task} "
                             "runs")
        return dict(given)

    def check_view_input(self, given: ViewInput) -> None:
        """A ``ValueError`` naming the parts of ``given`` that :meth:`view` would not look at (:attr:`view_inputs`):
        a question to a translator, an image to a text model... is refused, never ignored."""
        names = {"text": "a text", "image": "--image", "index": "--index", "question": "--question"}
        unused = [names[f] for f in names if getattr(given, f) is not None and f not in self.view_inputs]
        if unused:
            takes = " or ".join(names[f] for f in self.view_inputs)
            raise ValueError(f"a {self.task} run does not look at {' or '.join(unused)} (it takes {takes})")

    def inputs_from_strings(self, strings: Sequence[str], **given: Any) -> list[Any]:
        """The inputs of :meth:`predict` that ``strings`` (command-line arguments, lines of a file) stand for: by
        default each one a text (an empty one is a ``ValueError`` naming it). Settings (``given``) an application
        does not take are a ``ValueError``."""
        refuse_settings(given, self.task)
        return text_inputs(strings)

    @abstractmethod
    def result_row(self, result: Any) -> dict[str, Any]:
        """One result of :meth:`predict` as a JSON-able dict: ``"output"`` (one line for people) and the
        application's own figures (see :func:`jsonable`)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def language_model(self, lm: Any) -> Any:
        """``lm`` for shallow fusion in this model's beam: a language-model run directory (``qkv train lm``) loaded
        on this model's device, or an already loaded :class:`~qkv.apps.lm.LanguageModel` as it is. A run of
        another application is a ``ValueError``."""
        if lm is None or not isinstance(lm, str | os.PathLike):
            return lm
        from . import application_of

        app = application_of(lm)
        if app.name != "lm":
            raise ValueError(f"{lm} is a {app.name} run, not a language model (qkv train lm)")
        return app.predictor.load(lm, self.device)


def length_batches(items: Sequence[Any], batch_size: int) -> Iterator[list[int]]:
    """The indices of ``items`` (texts, token lists: anything with a length) in batches of at most ``batch_size``,
    shortest first: batches of similar lengths pad less."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode and no gradients inside the block; its mode restored after, whatever happens."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def refuse_settings(given: Mapping[str, Any], task: str) -> None:
    """A ``ValueError`` naming the settings in ``given`` (those that are not ``None``): ``task`` takes none."""
    extra = sorted(k for k, v in given.items() if v is not None)
    if extra:
        raise ValueError(f"{task} inputs take no {', '.join(extra)} setting")


def text_inputs(strings: Sequence[str]) -> list[str]:
    """``strings`` as texts: a list of strings, none of them empty (``ValueError`` naming the first that is)."""
    if isinstance(strings, str):
        raise ValueError("inputs must be a list of strings, not one string")
    if not strings:
        raise ValueError("no input given")
    for n, s in enumerate(strings, 1):
        if not isinstance(s, str) or not s.strip():
            raise ValueError(f"input {n} is empty")
    return list(strings)


def file_inputs(strings: Sequence[str], what: str) -> list[str]:
    """``strings`` as paths of existing ``what`` files (``"image"``, ``"audio"``): a ``ValueError`` naming the
    first that is missing or a folder."""
    from pathlib import Path

    for n, s in enumerate(text_inputs(strings), 1):
        path = Path(s)
        if path.is_dir():
            raise ValueError(f"input {n}: {s} is a folder, not an {what} file")
        if not path.is_file():
            raise ValueError(f"input {n}: no such {what} file: {s}")
    return list(strings)


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold replaced: tensors and numpy arrays become lists (a 0-d one a number),
    numpy numbers Python ones, tuples lists, and non-finite floats (NaN, infinities) ``None``."""
    import math
    import numbers

    if isinstance(value, torch.Tensor) or (hasattr(value, "tolist") and hasattr(value, "dtype")):  # numpy too
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


