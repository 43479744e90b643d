"""``qkv view RUN|HF_DIR``: one offline HTML page per input showing every attention of a model. What is looked at
is a *viewer* found by :func:`viewer_of`, one lookup for every kind of directory: a run (or checkpoint) of any
application is viewed by its predictor (the registry of :mod:`qkv.apps`), a saved Hugging Face model directory by
:class:`HuggingFaceViewer`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..apps import ViewInput
from ..apps.command import DeviceOption, FileOption, RunArgument, read_inputs
from ..apps.console import numbered_paths
from ..options import option
from ..train.rng import MAX_SEED
from ..viz.files import page_path
from .options import given, options_from_args

__all__ = ["COMMAND", "ViewCommand", "viewer_of", "VIEWERS", "HuggingFaceViewer"]


def _numbers(xs: list[str]) -> list[int]:
    return [int(x) for s in xs for x in s.split(",") if x.strip()]


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
    generate: int | None = option(None, low=1, metavar="N", help="a Hugging Face model generates up to N tokens "
                                  "from the text, its attention recorded at every step")
    layers: list[int] | None = option(None, repeat=True, parse=_numbers, metavar="L",
                                      help="the layers to record (Hugging Face models; e.g. 0,5; default all)")
    heads: list[int] | None = option(None, repeat=True, parse=_numbers, metavar="H",
                                     help="the heads to record (Hugging Face models; default all)")
    strategy: str = option("greedy", choices=("greedy", "sample", "beam"), requires=("generate",),
                           help="how --generate chooses tokens")
    beam: int = option(4, low=2, applies={"strategy": ("beam",)}, help="hypotheses of --strategy beam")
    seed: int = option(0, low=0, high=MAX_SEED, applies={"strategy": ("sample",)}, help="seed of --strategy sample")
    revision: str | None = option(None, metavar="REV", help="a Hugging Face hub id's branch, tag or commit "
                                  "(default main)")
    measures: bool = option(False, help="a Hugging Face text model: each head's importance (the loss's rise with "
                            "the head zeroed) on the page, and the value-weighted and attention x gradient views")

    FLAG_HELP = {"run": "run directory or checkpoint directory of any application, a saved Hugging Face model "
                        "directory (save_pretrained's layout, with its tokenizer), or a Hugging Face hub id "
                        "(org/name: from the cache, else fetched; HF_HUB_OFFLINE=1 keeps to the cache)"}


class HuggingFaceViewer:
    """A saved Hugging Face model directory, viewed on qkv's attention backend: a text model reads the text once,
    or with ``generate`` the tokens it generates, step by step; an image classifier (ViT-style) reads an image."""

    #: the settings of ``qkv view`` this viewer takes (others are refused, naming them)
    takes = ("generate", "layers", "heads", "strategy", "beam", "seed", "measures")

    def __init__(self, path: str, device: str = "auto", *, generate: int | None = None, layers=None, heads=None,
                 strategy: str = "greedy", beam: int = 4, seed: int = 0, measures: bool = False):
        from ..integrations.transformers_view import hf_image_model

        self.path, self.device = path, device
        self.generate, self.layers, self.heads = generate, layers, heads
        self.strategy, self.beam, self.seed, self.measures = strategy, beam, seed, measures
        self.image_model = hf_image_model(path)
        if self.image_model and generate is not None:
            raise ValueError("a Hugging Face image model takes --image FILE only (no --generate)")

    def view(self, given: ViewInput):
        if self.image_model:
            if given.image is None or given.index is not None or given.question or given.text is not None:
                raise ValueError("a Hugging Face image model takes --image FILE only (no text, --index or "
                                 "--question)")
            from ..integrations.transformers_view import view_image_input

            return view_image_input(self.path, given.image, device=self.device, layers=self.layers,
                                    heads=self.heads)
        if given.image is not None or given.index is not None or given.question:
            raise ValueError("a Hugging Face text model takes texts only (no --image, --index or --question)")
        if self.generate is not None:
            from ..integrations.generation import view_generation

            return view_generation(self.path, given.text, self.generate, strategy=self.strategy, beams=self.beam,
                                   seed=self.seed, layers=self.layers, heads=self.heads, device=self.device)
        from ..integrations.transformers_view import view_page_input

        return view_page_input(self.path, given.text, device=self.device, layers=self.layers, heads=self.heads,
                               importance=self.measures, value_weighted=self.measures, gradient=self.measures)


def _is_hf_dir(path: str) -> bool:
    from ..integrations.transformers_view import is_hf_model_dir

    return is_hf_model_dir(path)


def _run_viewer(path: str, device: str, **settings: Any):
    """The predictor of a run, its folder resolved and its files read once; the settings of ``qkv view`` it takes
    (its ``view_takes``: a language model generates) set through its ``viewing``, others refused."""
    from ..apps import application, load_predictor
    from ..train.checkpoint import load_checkpoint

    def refuse(keys, what: str) -> ValueError:
        flags = ", ".join("--" + k.replace("_", "-") for k in keys)
        return ValueError(f"{flags} apply to Hugging Face models and language-model runs; {path} is {what}")

    try:
        checkpoint = load_checkpoint(path)
    except FileNotFoundError:
        if settings:  # said before what is missing: these flags need another kind of model anyway
            raise refuse(settings, "neither") from None
        raise
    takes = getattr(application(checkpoint.task).predictor, "view_takes", ()) if settings else ()
    refused = [k for k in settings if k not in takes]
    if refused:
        raise refuse(refused, f"a {checkpoint.task} run")
    predictor = load_predictor(checkpoint, device)
    return predictor.viewing(**settings) if settings else predictor


#: ``(recognises(path), viewer(path, device, **settings))`` in order, each viewer refusing the settings it does not
#: take; the last takes any directory (a run of any application of the registry)
VIEWERS: list[tuple[Callable[[str], bool], Callable[..., Any]]] = [
    (_is_hf_dir, HuggingFaceViewer),
    (lambda path: True, _run_viewer),
]


def viewer_of(path: str, device: str = "auto", **settings: Any):
    """What views the directory ``path``: an object whose ``view(ViewInput)`` gives a page's input. ``settings``
    (``generate``, ``layers``...) that its viewer does not take are refused by the viewer, once, naming their
    flags."""
    for recognises, viewer in VIEWERS:
        if recognises(path):
            return viewer(path, device, **settings)
    raise ValueError(f"{path}: nothing qkv can view")  # pragma: no cover - the last viewer takes anything


def _local(path: str, revision: str | None) -> str:
    """``path``, or the snapshot folder of a hub id (:func:`qkv.integrations.hub.resolve_model`)."""
    from pathlib import Path

    if revision is None and Path(path).exists():
        return path
    from ..integrations.hub import is_hub_id, resolve_model

    return resolve_model(path, revision) if revision is not None or is_hub_id(path) else path


def view(args) -> int:
    from ..viz.page import save_attention_page

    o = options_from_args(args, ViewCommand)
    out = page_path(o.out, option="--out")  # settled first: printed == written
    inputs = [ViewInput(image=path, question=o.question) for path in o.image or []] + \
        [ViewInput(index=i, question=o.question) for i in o.index or []]
    if o.text or o.file or not inputs:
        inputs += [ViewInput(text=t, question=o.question)
                   for t in read_inputs(o.text, o.file, "a text to look at (or --image FILE)")]
    settings = {k: getattr(o, k) for k in given(args, ViewCommand) if k in HuggingFaceViewer.takes}
    viewer = viewer_of(_local(o.run, o.revision), o.device, **settings)
    for one in inputs:  # what the run would not look at is refused before any page is written
        if hasattr(viewer, "check_view_input"):
            viewer.check_view_input(one)
    for path, one in zip(numbered_paths(str(out), len(inputs)), inputs, strict=True):
        page = viewer.view(one)
        written = save_attention_page(path, page.records, rollout=o.rollout, **page.page_kwargs())
        print(f"wrote {written} ({len(page.records)} attention modules)")
    return 0



#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("view", "write one offline HTML page showing every attention of a run's model (or of a "
            "saved Hugging Face model)", ViewCommand, view)
