"""A trained run of one application read back for use (:class:`Predictor`): the same methods in every application,
and the small pieces every predictor uses (:class:`ViewInput`, :func:`text_inputs`, :func:`file_inputs`,
:func:`jsonable`, :func:`length_batches`, :func:`evaluating`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..options import OptionError, ref
from ..train.threads import follow_threads
from ..viz.page import PageInput
from .run import load_run, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["Predictor", "ImagePredictor", "Accepts", "ViewInput", "a_run", "need_text", "text_inputs", "file_inputs",
           "check_index", "refuse_settings", "jsonable", "length_batches", "evaluating"]


@dataclasses.dataclass
class ViewInput:
    """One input to look at (``qkv view``): what an application takes of it is its own (a text, an image...)."""

    text: str | None = None
    image: Any = None  #: a path or a tensor
    index: int | None = None  #: an example of the run's test split
    question: str | None = None


def a_run(name: str) -> str:
    """``"a translate run"``, ``"an images run"``, ``"an lm run"``: an application's runs, in a sentence."""
    return f"{'an' if name[:1] in 'aeiou' or name == 'lm' else 'a'} {name} run"


def need_text(text: str | None, what: str) -> str:
    """``text``, or a ``ValueError`` saying that ``what`` (an application's name) needs one."""
    if text is None or not text.strip():
        raise ValueError(f"{a_run(what)} needs a text to look at")
    return text


@dataclasses.dataclass(frozen=True)
class Accepts:
    """The inputs an application takes, declared once (:attr:`Predictor.accepts`); :meth:`Predictor.check_input`
    refuses the rest in one line naming the input, for every command and method that reads one.

    Attributes:
        min_image: the smallest image side, in pixels (a model that halves its input n times needs 2^n).
        max_text: the longest text, in characters (``None``: any; a model's own token limit cuts and says so).
        min_audio: the shortest audio, in seconds.  max_audio: the longest, in seconds.
    """

    min_image: int | None = None
    max_text: int | None = None
    min_audio: float | None = None
    max_audio: float | None = None


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
    task_class: ClassVar[type]
    #: the application's name (``Application.name``, the checkpoint's ``task``): ``task_class.name``
    application: ClassVar[str]
    #: the same name, as older releases called it (kept for one release)
    task: ClassVar[str]
    #: what one command-line string is to :meth:`inputs_from_strings`: ``"text"``, ``"image file"``...
    input_kind: ClassVar[str] = "text"
    #: what :meth:`view` looks at, of a :class:`ViewInput`'s fields (``text``, ``image``, ``index``, ``question``)
    view_inputs: ClassVar[tuple[str, ...]] = ("text",)
    #: the settings :meth:`predict` and :meth:`evaluate` take (beam, max_len...): a dataclass of
    #: :func:`qkv.options.option` fields, typed and bounded, checked by :meth:`check_settings`; ``None``: the
    #: methods' own keyword arguments
    settings: ClassVar[type | None] = None
    #: the inputs it takes (:class:`Accepts`), refused otherwise by :meth:`check_input`
    accepts: ClassVar[Accepts] = Accepts()

    model: nn.Module
    options: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "task_class" in cls.__dict__:
            cls.application = cls.task = cls.task_class.name

    def __init__(self, model: nn.Module, options: Any, config: Mapping[str, Any] | None = None, **assets: Any):
        wanted = set(self.task_class.assets)
        if set(assets) != wanted:
            raise TypeError(f"{type(self).__name__} takes the assets {', '.join(sorted(wanted)) or 'none'}, got "
                            f"{', '.join(sorted(assets)) or 'none'}")
        self.model, self.options, self.config = model.eval(), options, dict(config or {})
        for name, value in assets.items():
            setattr(self, name, value)
        self._data: dict[Any, Any] = {}
        #: the run's ``assets/`` folder when read by :meth:`load` (its task's ``json_assets`` are there)
        self.assets_dir: Path | None = None

    @classmethod
    def load(cls, run_dir, device: str | torch.device = "auto") -> Predictor:
        """Read ``run_dir`` (a run directory: its ``best/``, else ``checkpoint/``; a checkpoint directory, of any
        release; or a :class:`~qkv.train.checkpoint.Checkpoint` already read) for prediction, the model on
        ``device`` (``auto``: CUDA when there is one)."""
        from ..data import load_tokenizer

        run = load_run(run_dir, cls.application, cls.task_class.options_type, device,
                       upgrade=getattr(cls.task_class, "upgrade", None))
        assets = {name: load_tokenizer(run.checkpoint.assets / name) for name in cls.task_class.assets}
        predictor = cls(run.model, run.options, run.config, **assets)
        predictor.assets_dir = run.checkpoint.assets
        return predictor

    def options_for(self, data: str | None) -> Any:
        """The run's options reading ``data`` instead of its own (``None``: its own), what applied only to the old
        data reset to the defaults."""
        if not data or data == self.options.data:
            return self.options
        return upgrade_options(type(self.options), {**dataclasses.asdict(self.options), "data": data})

    def read_data(self, data: str | None) -> Any:
        """The data :meth:`dataset` keeps: ``load_data`` of :meth:`options_for` ``data``."""
        return self.task_class.load_data(self.options_for(data))

    def dataset(self, data: str | None = None) -> Any:
        """The run's data (or ``data``, another source of the same format), read once (:meth:`read_data`)."""
        if data not in self._data:
            self._data[data] = self.read_data(data)
        return self._data[data]

    #: :meth:`dataset`, as older releases called it (kept for one release)
    data = dataset

    @abstractmethod
    def predict(self, inputs: Sequence[Any]) -> list[Any]:
        """One result per input."""

    @abstractmethod
    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 **settings: Any) -> dict[str, float]:
        """The application's metrics on ``split`` of the run's data (or of ``data``), at most ``limit`` examples."""

    def view(self, given: ViewInput, **options: Any) -> PageInput:
        """Every attention of the model on one input, for :func:`qkv.viz.page.save_attention_page`: the input
        read from ``given`` (:meth:`view_input`), its prediction made with every attention of the model recorded
        (:meth:`view_predict`, given ``options``), and the page's tokens, title and notes (:meth:`view_page`)."""
        from ..capture import capture_attention

        x = self.view_input(given)
        with torch.no_grad(), capture_attention(self.model) as records:
            result = self.view_predict(x, **options)
        return self.view_page(records, x, result)

    def view_input(self, given: ViewInput) -> Any:
        """The input :meth:`view` shows, read from ``given``: by default its text (a ``ValueError`` when there is
        none)."""
        return need_text(given.text, self.application)

    def view_predict(self, x: Any, **options: Any) -> Any:
        """The prediction :meth:`view` records: by default ``predict([x])``'s one result."""
        (result,) = self.predict([x], **options)
        return result

    def view_page(self, records: list, x: Any, result: Any) -> PageInput:
        """The page of ``x``: its ``records`` (every attention of :meth:`view_predict`), the tokens of their
        queries and keys, a title and notes."""
        raise NotImplementedError(f"{type(self).__name__} shows no page: it writes no view_page")

    def note(self, result: Any, settings: Mapping[str, Any]) -> str | None:
        """What ``result`` (one of :meth:`predict`'s, made with ``settings``) left out, in words (a source cut at the
        model's limit, an output stopped at the longest allowed), or ``None``. Every command says it on stderr and
        in the result's row; none by default (what the library already logs is not said twice)."""
        return None

    def check_settings(self, given: Mapping[str, Any], method: str = "evaluate") -> dict[str, Any]:
        """``given`` (settings that are not ``None``) checked against the application's :attr:`settings` (their
        types and bounds) and against what ``method`` (``"predict"`` or ``"evaluate"``) takes: one that does not
        apply is a ``ValueError`` naming it and the settings that do. Returns them as a dict.

        What ``method`` takes are its named keyword arguments (its ``**kwargs``, if any, are what it refuses); a
        setting given as an object already loaded (a language model as ``lm``) or as a path is checked as set."""
        import inspect

        from ..options import check_options, option_fields

        takes = inspect.signature(getattr(self, method)).parameters
        if self.settings is None and any(p.kind is p.VAR_KEYWORD for p in takes.values()):
            return dict(given)  # no declaration: the method checks what it takes
        known = ([f.name for f, _ in option_fields(self.settings)] if self.settings is not None else
                 [k for k, p in takes.items() if p.kind is p.KEYWORD_ONLY and k not in ("split", "limit")])
        known = [k for k in known if k in takes and takes[k].kind is not takes[k].VAR_KEYWORD]
        refused = [k for k in given if k not in known]
        if refused:
            raise ValueError(f"{', '.join(refused)} {'does' if len(refused) == 1 else 'do'} not apply to "
                             f"{self.application} runs" + (f" (their settings: {', '.join(known)})" if known else
                                                    " (they take no setting)"))
        if self.settings is not None:
            plain = (str, int, float, bool, tuple, type(None))
            check_options(self.settings(**{k: os.fspath(v) if isinstance(v, os.PathLike) else
                                           v if isinstance(v, plain) else type(v).__name__
                                           for k, v in given.items()}))
        return dict(given)

    def check_input(self, kind: str, value: Any, where: str) -> None:
        """A ``ValueError`` naming ``where`` (``input 2``, a file) when an input of ``kind`` (``"image"``: its
        ``(height, width)``; ``"text"``: the string; ``"audio"``: its length in seconds) is outside what the
        application :attr:`accepts`."""
        a = self.accepts
        if kind == "image" and a.min_image is not None and min(value) < a.min_image:
            raise ValueError(f"{where}: an image of {value[0]}x{value[1]} pixels; {self.application} runs take images "
                             f"of at least {a.min_image}x{a.min_image}")
        if kind == "text" and a.max_text is not None and len(value) > a.max_text:
            raise ValueError(f"{where}: a text of {len(value)} characters; {self.application} runs take at most "
                             f"{a.max_text}")
        if kind == "audio" and a.min_audio is not None and value < a.min_audio:
            raise ValueError(f"{where}: {value:.3f} s of audio; {self.application} runs take at least "
                             f"{a.min_audio:g} s")
        if kind == "audio" and a.max_audio is not None and value > a.max_audio:
            raise ValueError(f"{where}: {value:.1f} s of audio; {self.application} runs take at most "
                             f"{a.max_audio:g} s")

    def check_view_input(self, given: ViewInput) -> None:
        """A ``ValueError`` naming the parts of ``given`` that :meth:`view` would not look at (:attr:`view_inputs`):
        a question to a translator, an image to a text model... is refused, never ignored."""
        names = {"text": "a text", "image": ref("image"), "index": ref("index"), "question": ref("question")}
        unused = [names[f] for f in names if getattr(given, f) is not None and f not in self.view_inputs]
        if unused:
            takes = " or ".join(names[f] for f in self.view_inputs)
            raise OptionError("a {application} run does not look at " + " or ".join(unused) + " (it takes " + takes +
                              ")", "image", "index", "question", application=self.application)

    def inputs_from_strings(self, strings: Sequence[str], **given: Any) -> list[Any]:
        """The inputs of :meth:`predict` that ``strings`` (command-line arguments, lines of a file) stand for: by
        default each one a text (an empty one is a ``ValueError`` naming it). Settings given beside them (``given``)
        are checked as :meth:`predict` takes them (:meth:`check_settings`): one that does not apply is refused
        before any input is read."""
        self.check_settings(given, "predict")
        return text_inputs(strings)

    @abstractmethod
    def result_row(self, result: Any) -> dict[str, Any]:
        """One result of :meth:`predict` as a JSON-able dict: ``"output"`` (one line for people) and the
        application's own figures (see :func:`jsonable`)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device




class ImagePredictor(Predictor, ABC):
    """A :class:`Predictor` whose inputs are images: ``qkv view`` takes ``--image`` (a file) or ``--index`` (an
    image of the run's test split), and each string given to ``qkv predict`` is an image file."""

    view_inputs = ("image", "index")
    input_kind = "image file"

    @abstractmethod
    def test_image(self, index: int) -> Tensor:
        """Image ``index`` of the run's test split as :meth:`read` gives a file; an ``OptionError`` naming
        ``index`` when the split has no such image."""

    def read(self, path: str | os.PathLike) -> Tensor:
        """An image file as this model's input."""
        raise NotImplementedError(f"{type(self).__name__} reads no image file: it writes no read")

    def view_input(self, given: ViewInput) -> Tensor:
        """``given.index`` (an image of the test split), or ``given.image`` (a file, read; or a tensor as it is)."""
        if given.index is not None:
            return self.test_image(given.index)
        if given.image is None:
            raise OptionError(a_run(self.application) + " needs " + ref("image") + " (a file) or " + ref("index") +
                              " (an image of its test split)", "image", "index")
        return self.read(given.image) if isinstance(given.image, str | os.PathLike) else given.image

    def inputs_from_strings(self, strings: Sequence[str], **given: Any) -> list[Any]:
        """Each string an image file (read by :meth:`predict`)."""
        self.check_settings(given, "predict")
        return file_inputs(strings, "image")


def check_index(index: int, size: int, what: str = "images") -> int:
    """``index`` of an example of a test split of ``size`` ``what``; an ``OptionError`` naming it when out of range."""
    if not 0 <= index < size:
        raise OptionError(ref("index") + " {n} is out of range: the test split has {size} " + what, "index",
                          n=index, size=size)
    return index


def length_batches(items: Sequence[Any], batch_size: int, *,
                   device: torch.device | str | None = None) -> Iterator[list[int]]:
    """The indices of ``items`` (texts, token lists: anything with a length) in batches of at most ``batch_size``,
    shortest first: batches of similar lengths pad less. Torch's threads follow the machine while the batches are
    used (:func:`~qkv.train.threads.follow_threads`, their units the items' lengths), when the work runs on
    ``device`` (``None``: the CPU)."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    return follow_threads(batches, lambda idx: sum(len(items[i]) for i in idx), device=device)


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


