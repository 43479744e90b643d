"""What an application is, and what every application shares: reading its runs back (any checkpoint format
version) for prediction.

An application (translation, sentiment, images, captioning, question answering...) is a package
``qkv/tasks/NAME/`` whose ``__init__.py`` defines ``APPLICATION``, an :class:`Application`: its options
dataclass, ``train_defaults``, ``load_data``, ``model_spec``, the trainer's ``Task`` and a :class:`Predictor`
(``load`` / ``predict`` / ``evaluate`` / ``view``). :mod:`qkv.tasks` keeps the registry that the command line
walks (``qkv train NAME``, ``qkv evaluate RUN``, ``qkv view RUN``); CONTRIBUTING.md says how to add one.

A run's ``config.json`` (format version 2) holds ``{"model": {"name", "config"}, "options": {...}, ...}``:
:func:`qkv.models.create` rebuilds the model from ``model`` alone, and ``options`` are the task's options as
trained. Runs written by qkv 0.1.0 (format version 1) are upgraded on load: each task maps its old
configuration, and :func:`qkv.models.legacy.upgrade_state_dict` renames the weights.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ..options import default_of, option_fields, why_not

logger = logging.getLogger(__name__)

__all__ = ["Application", "Predictor", "PageInput", "ViewInput", "load_run", "upgrade_options", "model_from_spec",
           "LoadedRun", "need_text", "text_inputs", "file_inputs", "refuse_settings", "jsonable"]


@dataclasses.dataclass(frozen=True)
class Application:
    """What the registry (and so the command line) knows of an application.

    Attributes:
        name: ``qkv train NAME``; also the ``task`` name stored in every checkpoint of its runs.
        help: one line for ``qkv train --help``.
        options: the ``NAMEOptions`` dataclass (data, model, loss, evaluation: everything not the trainer's).
        train_defaults: ``options -> qkv.train.TrainConfig``, the trainer's preset for this application.
        load_data: ``options -> data``, the splits ``options`` describe (read or generated).
        model_spec: ``(options, **sizes) -> {"name", "config"}`` for :func:`qkv.models.create` (JSON only).
        task: the trainer's ``NAMETask(options, data=None)``.
        predictor: the :class:`Predictor` subclass that reads its runs back.
        train: ``(options, train_config) -> list of qkv.train.TrainResult``; ``None``: one run of ``task``
            (sentiment's k-fold cross-validation is its own).
        budget_defaults: ``(options, train_config) -> {field: value}``, optional: the options' defaults sized to
            the run's budget (``max_minutes``, ``max_steps``; ``qkv train`` applies them under the flags given);
            ``None``: one size for all.
    """

    name: str
    help: str
    options: type
    train_defaults: Callable[[Any], Any]
    load_data: Callable[[Any], Any]
    model_spec: Callable[..., dict[str, Any]]
    task: type
    predictor: type[Predictor]
    train: Callable[[Any, Any], list[Any]] | None = None
    budget_defaults: Callable[[Any, Any], dict[str, Any]] | None = None

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


@dataclasses.dataclass
class PageInput:
    """What :func:`qkv.viz.page.attention_page` needs: the records, axis labels, the image, a title and notes."""

    records: list
    tokens: dict[str, list[str]] | list[str] | None = None
    image: Any = None
    title: str = "Attention"
    notes: list[str] = dataclasses.field(default_factory=list)

    def page_kwargs(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "image": self.image, "title": self.title, "notes": self.notes}


def need_text(text: str | None, what: str) -> str:
    """``text``, or a ``ValueError`` saying that ``what`` needs one."""
    if text is None or not text.strip():
        raise ValueError(f"a {what} run needs a text to look at")
    return text


class Predictor(ABC):
    """A trained run of one application, read back for use: the same four methods in every application.

    - ``load(run_dir, device="auto")`` reads a run (its ``best/``, else ``checkpoint/``) or a checkpoint
      directory of any release (through :func:`load_run`);
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

    #: the application's name (``Application.name``, the checkpoint's ``task``)
    task: ClassVar[str]
    #: what one command-line string is to :meth:`inputs_from_strings`: ``"text"``, ``"image file"``...
    input_kind: ClassVar[str] = "text"

    model: nn.Module
    options: Any

    @classmethod
    @abstractmethod
    def load(cls, run_dir: str | os.PathLike, device: str | torch.device = "auto") -> Predictor:
        """Read ``run_dir`` for prediction, the model on ``device`` (``auto``: CUDA when there is one)."""

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
    """``value`` with what JSON cannot hold replaced: tensors become lists (a 0-d one a number), tuples lists, and
    non-finite floats (NaN, infinities) ``None``."""
    import math

    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


@dataclasses.dataclass
class LoadedRun:
    """A run read back for prediction: the model (eval mode, on ``device``), the checkpoint, its configuration
    in the current format and the task's options."""

    model: nn.Module
    checkpoint: Any
    config: dict[str, Any]
    options: Any


def model_from_spec(spec: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor] | None = None,
                    where: str = "the checkpoint") -> nn.Module:
    """``qkv.models.create(spec["name"], **spec["config"])``, with ``state_dict`` loaded; a mismatch between the
    configuration and the weights is a ``ValueError`` that names the parameter."""
    from ..models import create

    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or \
            not isinstance(spec.get("config"), Mapping):
        raise ValueError(f"{where}: the model entry must be {{'name': ..., 'config': {{...}}}}, got {spec!r}")
    model = create(spec["name"], **spec["config"])
    if state_dict is not None:
        own = model.state_dict()
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            first = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
            more = len(missing) + len(unexpected) - 1
            raise ValueError(f"{where}: the weights do not fit a {spec['name']!r} model ({first}"
                             f"{f' and {more} more' if more else ''})")
        for name, t in state_dict.items():
            if tuple(t.shape) != tuple(own[name].shape):
                raise ValueError(f"{where}: weight {name} is {tuple(t.shape)} but the configuration makes it "
                                 f"{tuple(own[name].shape)}")
        model.load_state_dict(state_dict)
    return model


def upgrade_options(cls: type, old: Mapping[str, Any], renames: Mapping[str, str] | None = None) -> Any:
    """Options of an older release as an instance of ``cls``: fields renamed (``renames``: old -> new), unknown
    ones dropped, and values of options that do not apply to the other settings reset to their defaults (old
    runs stored every option, applicable or not)."""
    renames = renames or {}
    names = {f.name for f in dataclasses.fields(cls)}
    values = {renames.get(k, k): v for k, v in old.items()}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names}
    specs = {f.name: (f, s) for f, s in option_fields(cls)}
    for name, (f, spec) in specs.items():
        if name in values and why_not(spec, name, lambda other: values.get(other, default_of(specs[other][0]))):
            values[name] = default_of(f)
    return cls(**values)


def load_run(path: str | os.PathLike, task: str, upgrade: Callable[[dict[str, Any], dict], tuple[dict, dict]],
             options_cls: type, device: str | torch.device = "auto") -> LoadedRun:
    """Read a run (or checkpoint) directory of ``task`` for prediction.

    ``upgrade(config, state_dict)`` turns a format-version-1 configuration and weights into the current ones.
    Raises ``ValueError`` for a run of another task, a newer format, or a configuration that does not fit.
    """
    from ..train import resolve_device
    from ..train.checkpoint import VERSION, load_checkpoint

    dev = resolve_device(str(device))
    ckpt = load_checkpoint(path)
    where = str(ckpt.path / "config.json")
    if ckpt.task != task:
        raise ValueError(f"{ckpt.path} holds a {ckpt.task!r} model, not a {task!r} one")
    config, state_dict = ckpt.config, ckpt.state_dict
    if ckpt.version < VERSION:
        logger.info("%s: upgrading a format-version-%d run", ckpt.path, ckpt.version)
        try:
            config, state_dict = upgrade(config, state_dict)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a valid format-version-{ckpt.version} {task} configuration ({e})") from None
    if not isinstance(config, Mapping) or not isinstance(config.get("options"), Mapping):
        raise ValueError(f"{where}: the configuration has no 'options' mapping")
    try:  # an option that does not apply to this run's settings is reset to its default: its stored value may be
        # a default of an older release, which would now read as set
        options = upgrade_options(options_cls, config["options"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: options do not match this qkv's {options_cls.__name__} ({e})") from None
    model = model_from_spec(config.get("model"), state_dict, where)
    return LoadedRun(model.to(dev).eval(), ckpt, config, options)
