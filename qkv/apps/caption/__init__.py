"""Image captioning with visual attention (Show, Attend and Tell): options, data, model, the trainer's task and
a :class:`Captioner` that captions images and returns where it looked for every word.

Data: ``scenes`` (generated, :mod:`qkv.data.scenes`: 1-4 Fashion-MNIST items on a 64x64 canvas, several
references per scene, every item's box, some item/cell combinations only in the test split) or a captions file
(Flickr8k ``image.jpg#N<TAB>caption`` lines or a COCO captions JSON, :mod:`qkv.apps.caption.captions`) with its image
folder, split into train/valid/test images by a seeded permutation.

Models (:mod:`qkv.models.captioning`): ``soft`` (Xu et al.'s deterministic attention with the gate beta and the
doubly stochastic penalty), ``hard`` (a sampled location per word, REINFORCE with a moving-average baseline and
an entropy bonus; evaluated with the expected context or the argmax location, ``hard_test``), ``fixed`` (the
mean-pooled image, no attention) and ``transformer`` (cross-attention to the grid).

Its parts under the contract of :mod:`qkv.apps.base`: :class:`CaptionTask` (the trainer's task), :class:`Captioner`
(a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are image files) and
:func:`evaluate_captions`, the one metric both evaluate with.

Example::

    from qkv.apps.caption import CaptionOptions, CaptionTask, Captioner, train_defaults
    from qkv.train import train
    options = CaptionOptions(data="scenes", model="soft")
    train(CaptionTask(options), train_defaults(options).replace(max_minutes=10, out="runs/scenes"))
    captioner = Captioner.load("runs/scenes")
    images, _ = captioner.test_images([0, 1])
    [c.text for c in captioner.predict(images, beam=3)]    # ['a bag at the top left and a boot at the ...', ...]
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .data import CaptionData
from .decode import Caption, caption_images, caption_metrics, evaluate_captions
from .options import MODELS, CaptionOptions, train_defaults
from .predictor import Captioner
from .task import CaptionTask, load_data, model_spec

__all__ = ["APPLICATION", "CaptionOptions", "load_data", "model_spec", "train_defaults", "CaptionTask",
           "CaptionData", "Caption", "Captioner", "caption_images", "caption_metrics", "evaluate_captions", "MODELS"]


APPLICATION = Application(
    name="caption", commands=command.COMMANDS,
    train_defaults=train_defaults, task=CaptionTask, predictor=Captioner, export=export.graphs)
