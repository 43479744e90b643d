"""``qkv segment``: label images with a trained segmentation run (:mod:`.predict`'s way), draw them with the ARM/FFM
channel weights, or evaluate it (``--evaluate``: :func:`qkv.cli.evaluate.evaluation`, as ``qkv evaluate``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ...options import option
from ..command import LimitOption, PlotOption, RunInputs, evaluation, finish, input_paths, plot_folder
from ..console import safe, unique_names
from .predictor import Segmenter


@dataclass
class SegmentCommand(LimitOption, PlotOption, RunInputs):
    images: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="IMAGE",
                               help="image files (PNG, JPEG...), segmented at their own size; give them before the "
                                    "options")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the run's test split, drawn beside its true labels "
                                          "(repeatable)")
    evaluate: bool = option(False, help="print mIoU, per-class IoU and pixel accuracy of a split")
    data: str | None = option(None, requires=("evaluate",), help="--evaluate on other data: 'scenes' or a folder "
                              "of images and label PNGs (default: the run's)")
    split: str = option("test", choices=("valid", "test"), requires=("evaluate",), help="the split of --evaluate")

    FLAG_HELP = {"plot": "a folder: a picture per image, the image, the predicted labels and the ARM/FFM channel "
                         "weights",
                 "limit": "--evaluate at most this many images",
                 "json": "write the labels' shares as JSON rows, or with --evaluate the figures (NaN written null)",
                 "file": "a file of image file names, one per line"}
    FLAG_ALIASES = {"limit": ("--max-images",)}


def _table(segmenter, o: SegmentCommand, m: dict[str, float]) -> None:
    print(f"split {o.split}, {int(m['examples'])} images, {int(m['pixels'])} pixels scored")
    print(f"mIoU {m['miou']:.4f}  pixel accuracy {m['pixel_accuracy']:.4f}" +
          (f"  mIoU of scenes with held-out item/cell combinations {m['miou_held_out']:.4f}"
           if "miou_held_out" in m else ""))
    print("| class | IoU |")
    print("|---|---|")
    for name in segmenter.class_names:
        v = m[f"iou/{name}"]
        print(f"| {safe(name)} | {'absent' if math.isnan(v) else f'{v:.4f}'} |")


def segment(o: SegmentCommand) -> int:
    from .pictures import segmentation_figure

    plots = plot_folder(o.plot) if o.plot else None  # settled first: printed == written
    files = input_paths(o, o.images, "image file", ", --index N (an image of the test split)")
    segmenter = Segmenter.load(o.run, o.device)
    if o.evaluate:
        evaluation(segmenter, o.data, split=o.split, limit=o.limit, json_path=o.json,
                   report=lambda m: _table(segmenter, o, m))
        return 0
    pictures = [segmenter.read(path) for path in files]
    names = [Path(path).stem for path in files]
    truths = [None] * len(pictures)
    for n in o.index or []:
        pictures.append(segmenter.test_image(n))
        names.append(f"test{n}")
        truths.append(segmenter.dataset().splits["test"].labels[n])
    results = segmenter.predict(pictures)
    for name, picture, truth, r in zip(unique_names(names), pictures, truths, results, strict=True):
        shares = ", ".join(f"{safe(c)} {v:.1%}" for c, v in sorted(r.shares().items(), key=lambda kv: -kv[1]))
        print(f"{safe(name)}\t{picture.shape[-1]}x{picture.shape[-2]}\t{shares}")
        if plots:
            path = plots / f"{name}.png"
            segmentation_figure(picture, r.labels, r.class_names, truth=truth, attention=r.attention,
                                ignore_index=segmenter.ignore_index, title=name, path=path)
            print(f"wrote {safe(str(path))}")
    finish(segmenter, files + [f"test{n}" for n in o.index or []], results, o.json)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"segment": (SegmentCommand, segment)}
