"""A trained captioning run read back: :class:`Captioner` (``load`` / ``predict`` / ``evaluate`` / ``view``);
its result is :class:`~qkv.apps.caption.decode.Caption` (the words and one attention map per word)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...options import OptionError, ref
from ..base import Accepts, ImagePredictor, PageInput, file_inputs, jsonable, upgrade_options
from ..stopped import stopped_note
from .data import CaptionData
from .decode import Caption, caption_images, evaluate_captions
from .options import ATTENDING, CaptionOptions, CaptionSettings
from .task import CaptionTask, load_data

__all__ = ["Captioner", "Caption"]



#: model options a run saved before they existed, as the model built then (the constructors' defaults)
_BUILT_BEFORE = {"padding": "zeros", "keys": "features", "init_state": "mean", "glimpse": False,
               "glimpse_features": "grid"}


def _as_built(options: CaptionOptions, model_config: dict[str, Any]) -> CaptionOptions:
    """``options`` with the model options the saved model was built with (a run saved before an option existed
    gets the value its model has, not today's default for its data)."""
    built = {k: model_config.get(k, old) for k, old in _BUILT_BEFORE.items()}
    if options.model not in ATTENDING:
        built = {"padding": built["padding"]}
    return dataclasses.replace(options, **built)


class Captioner(ImagePredictor):
    """A trained captioning run: ``Captioner.load(run_dir).predict(images, beam=3)``."""

    task_class = CaptionTask
    settings = CaptionSettings
    #: an image file of any size is resized and centre-cropped to the trained size (a tensor must have it)
    accepts = Accepts(min_image=1)

    def __init__(self, model: nn.Module, options: CaptionOptions, config: dict[str, Any], *, tokenizer):
        options = _as_built(options, config["model"]["config"])
        if "references" not in config.get("options", {}):  # saved before the option: trained on one drawn
            options = dataclasses.replace(options, references="sample")
        super().__init__(model, options, config, tokenizer=tokenizer)
        self.image_size, self.channels = int(config["image_size"]), int(config["channels"])
        self.item_words = list(config.get("item_words") or [])

    def read(self, path: str | os.PathLike) -> Tensor:
        """An image file as this model's input ``(C, S, S)`` uint8 (resized and centre-cropped)."""
        from .captions import load_image

        if not Path(path).is_file():
            raise ValueError(f"no image file {str(path)!r}")
        return load_image(path, self.image_size, grey=self.channels == 1)

    def inputs_from_strings(self, strings: Sequence[str], **given: Any) -> Tensor:
        """Each string an image file, read at the trained size (:meth:`read`): the ``(N, C, S, S)`` batch that
        :meth:`predict` takes."""
        self.check_settings(given, "predict")
        return torch.stack([self.read(p) for p in file_inputs(strings, "image")])

    def result_row(self, result: Caption) -> dict[str, Any]:
        """``output`` (the caption), its ``words``, the beam ``score`` and why decoding ``stopped``."""
        return jsonable({"output": result.text, "words": list(result.words), "score": result.score,
                         "stopped": result.stopped})

    def options_for(self, data: str | None, on_error: str = "raise") -> CaptionOptions:
        """The run's options reading another captions file ``data`` (``on_error="skip"``: its captions naming
        missing or unreadable images are skipped and counted); ``None``: the run's own."""
        if data is None:
            return self.options
        return upgrade_options(CaptionOptions, {**dataclasses.asdict(self.options), "data": data,
                                                "on_error": on_error})

    def dataset(self, data: str | None = None, on_error: str = "raise") -> CaptionData:
        """The run's data (generated or read again, once), or another captions file ``data`` (read each time, with
        ``on_error``)."""
        if data is not None:
            return load_data(self.options_for(data, on_error))
        return super().dataset()

    def test_images(self, index: list[int], split: str = "test") -> tuple[Tensor, list[list[str]]]:
        """Images ``(N, C, S, S)`` uint8 of ``split`` by index, and their references."""
        part = self.dataset().splits[split]
        for n in index:
            if not 0 <= n < len(part):
                raise OptionError(ref("index") + " {n} is out of range: the {split} split has {size} images (0 to "
                                  "{last})", "index", n=n, split=split, size=len(part), last=len(part) - 1)
        return part.batch(index), [part.references[n] for n in index]

    def predict(self, images: Tensor, *, beam: int = 3, max_len: int = 40, hard_test: str | None = None,
                batch_size: int = 100) -> list[Caption]:
        """Captions of ``images (N, C, S, S)`` (uint8, or float in [0, 1]), each with one attention map per word.

        ``hard_test`` (hard attention only): ``"expectation"`` or ``"argmax"`` instead of the trained setting, for
        this call only.
        """
        self.check_settings({"beam": beam, "max_len": max_len, "hard_test": hard_test}, "predict")
        if images.dim() == 3 and self.channels == 1:
            images = images[:, None]
        if images.dim() != 4 or tuple(images.shape[1:]) != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"images must be (N, {self.channels}, {self.image_size}, {self.image_size}), got "
                             f"{tuple(images.shape)}")
        if len(images) == 0:
            raise ValueError("no images to caption")
        with self._hard_test(hard_test):
            return caption_images(self.model, self.tokenizer, images, beam=beam, max_len=max_len,
                                  batch_size=batch_size)

    @contextmanager
    def _hard_test(self, hard_test: str | None) -> Iterator[None]:
        """The hard model's test-time attention set to ``hard_test`` inside the block, restored after."""
        if hard_test is None:
            yield
            return
        if not hasattr(self.model, "test_attention"):
            raise OptionError(ref("hard_test") + " applies to hard attention models only", "hard_test")
        if hard_test not in ("expectation", "argmax"):
            raise ValueError(f"hard_test must be 'expectation' or 'argmax', got {hard_test!r}")
        before = self.model.test_attention
        self.model.test_attention = hard_test
        try:
            yield
        finally:
            self.model.test_attention = before

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None, beam: int = 1,
                 max_len: int = 40, hard_test: str | None = None, on_error: str = "raise") -> dict[str, float]:
        """:func:`caption_metrics` of ``split`` (of the run's data, or of another captions file ``data``), at most
        ``limit`` images: BLEU-1..4, exact match, and on scenes grounding and the figures by number of items."""
        self.check_settings({"beam": beam, "max_len": max_len, "hard_test": hard_test, "on_error": on_error})
        with self._hard_test(hard_test):
            return evaluate_captions(self.model, self.tokenizer, self.dataset(data, on_error), split, limit=limit,
                                     beam=beam, max_len=max_len)

    def test_image(self, index: int) -> Tensor:
        """Image ``index`` of the run's test split, ``(C, S, S)`` uint8 as :meth:`read` gives a file."""
        return self.test_images([index])[0][0]

    def view_predict(self, x: Tensor, **options: Any) -> Caption:
        """The greedy caption of one image: the decoding itself is recorded."""
        (caption,) = self.predict(x[None], beam=1, **options)
        return caption

    def view_page(self, records: list, x: Tensor, caption: Caption) -> PageInput:
        """Every attention of the model captioning the image, a row per word; the caption as its title."""
        words = list(caption.words)
        notes = [f"{self.options.model} captioning model, greedy decoding; pick a word as the query of the image view"]
        notes += [n for n in [self.note(caption, {})] if n]
        return PageInput(records, {"target": [*words, "<eos>"] if caption.stopped == "end" else words,
                                   "words": words}, x.float() / 255, title=caption.text, notes=notes)

    def note(self, result: Caption, settings) -> str | None:
        return stopped_note(result.stopped, len(result.words), "caption", "words")
