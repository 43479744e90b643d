"""``qkv view RUN|HF_DIR``: one offline HTML page per input showing every attention of a model. What is looked at
is a *viewer* found by :func:`viewer_of`, one lookup for every kind of directory: a run (or checkpoint) of any
application is viewed by its predictor (the registry of :mod:`qkv.tasks`), a saved Hugging Face model directory by
:class:`HuggingFaceViewer`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..options import option
from ..tasks import ViewInput
from ..viz.files import page_path
from .common import add_command, input_texts, numbered_paths
from .options import options_from_args
from .shared import DeviceOption, FileOption, RunArgument

__all__ = ["register", "ViewCommand", "viewer_of", "VIEWERS", "HuggingFaceViewer"]


@dataclass
class ViewCommand(DeviceOption, FileOption, RunArgument):
    text: list[str] = option(default_factory=list, positional=True, nargs="*",
                             help="inputs to look at (text applications, audio files for speech); one page each")
    image: list[str] | None = option(None, repeat=True, metavar="FILE",
                                     help="an image file (image applications; repeatable)")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an example of the run's test split (repeatable)")
    question: str | None = option(None, help="the question (question-answering runs; the text is the context)")
    out: str = option("attention.html", help="the page to write (numbered NAME-0.html, NAME-1.html... for several)")
    rollout: bool = option(True, help="add attention rollout for stacks of self-attention")

    FLAG_HELP = {"run": "run directory or checkpoint directory of any application, or a saved Hugging Face model "
                        "directory (save_pretrained's layout, with its tokenizer)"}


class HuggingFaceViewer:
    """A saved Hugging Face model directory, viewed on qkv's attention backend (texts only)."""

    def __init__(self, path: str, device: str = "auto"):
        self.path, self.device = path, device

    def view(self, given: ViewInput):
        from ..integrations.transformers_view import view_page_input

        if given.image is not None or given.index is not None or given.question:
            raise ValueError("a Hugging Face model directory takes texts only (no --image, --index or --question)")
        return view_page_input(self.path, given.text, device=self.device)


def _is_hf_dir(path: str) -> bool:
    from ..integrations.transformers_view import is_hf_model_dir

    return is_hf_model_dir(path)


def _run_viewer(path: str, device: str):
    from ..tasks import load_predictor

    return load_predictor(path, device)


#: ``(recognises(path), viewer(path, device))`` in order; the last takes any directory (a run of the registry)
VIEWERS: list[tuple[Callable[[str], bool], Callable[[str, str], Any]]] = [
    (_is_hf_dir, HuggingFaceViewer),
    (lambda path: True, _run_viewer),
]


def viewer_of(path: str, device: str = "auto"):
    """What views the directory ``path``: an object whose ``view(ViewInput)`` gives a page's input."""
    for recognises, viewer in VIEWERS:
        if recognises(path):
            return viewer(path, device)
    raise ValueError(f"{path}: nothing qkv can view")  # pragma: no cover - the last viewer takes anything


def view(args) -> int:
    from ..viz.page import save_attention_page

    o = options_from_args(args, ViewCommand)
    out = page_path(o.out, option="--out")  # settled first: printed == written
    inputs = [ViewInput(image=path, question=o.question) for path in o.image or []] + \
        [ViewInput(index=i, question=o.question) for i in o.index or []]
    if o.text or o.file or not inputs:
        inputs += [ViewInput(text=t, question=o.question)
                   for t in input_texts(o.text, o.file, "a text to look at (or --image FILE)")]
    viewer = viewer_of(o.run, o.device)
    for path, given in zip(numbered_paths(str(out), len(inputs)), inputs, strict=True):
        page = viewer.view(given)
        written = save_attention_page(path, page.records, rollout=o.rollout, **page.page_kwargs())
        print(f"wrote {written} ({len(page.records)} attention modules)")
    return 0


def register(commands, train_commands) -> None:
    add_command(commands, "view", "write one offline HTML page showing every attention of a run's model (or of a "
                "saved Hugging Face model)", ViewCommand, view)
