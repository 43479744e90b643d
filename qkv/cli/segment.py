"""``qkv segment``: label images with a trained segmentation run, draw them with the ARM/FFM channel weights, or
evaluate it (``qkv train segment`` is the registry's, :mod:`.apps`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..viz.files import write_atomic
from .common import add_command, safe, unique_names
from .options import options_from_args


@dataclass
class SegmentCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory of `qkv train segment`")
    images: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="IMAGE",
                               help="image files (PNG, JPEG...), segmented at their own size; give them before the "
                                    "options")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the run's test split, drawn beside its true labels "
                                          "(repeatable)")
    plot: str | None = option(None, metavar="DIR", help="write a picture per image: the image, the predicted labels "
                              "and the ARM/FFM channel weights")
    evaluate: bool = option(False, help="print mIoU, per-class IoU and pixel accuracy of a split")
    data: str | None = option(None, help="--evaluate on other data: 'scenes' or a folder of images and label PNGs "
                              "(default: the run's)")
    split: str = option("test", choices=("valid", "test"), help="the split of --evaluate")
    max_images: int | None = option(None, low=1, help="--evaluate at most this many images")
    json: str | None = option(None, help="write the --evaluate figures as JSON")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def _evaluate(segmenter, o: SegmentCommand) -> None:
    m = segmenter.evaluate(o.data, split=o.split, limit=o.max_images)
    print(f"split {o.split}, {int(m['examples'])} images, {int(m['pixels'])} pixels scored")
    print(f"mIoU {m['miou']:.4f}  pixel accuracy {m['pixel_accuracy']:.4f}" +
          (f"  mIoU of scenes with held-out item/cell combinations {m['miou_held_out']:.4f}"
           if "miou_held_out" in m else ""))
    print("| class | IoU |")
    print("|---|---|")
    for name in segmenter.class_names:
        v = m[f"iou/{name}"]
        print(f"| {safe(name)} | {'absent' if math.isnan(v) else f'{v:.4f}'} |")
    if o.json:
        print(f"wrote {write_atomic(o.json, json.dumps(m, indent=2) + chr(10), option='--json')}")


def segment(args) -> int:
    from ..tasks.segment import Segmenter
    from ..viz.segmentation import segmentation_figure

    o = options_from_args(args, SegmentCommand)
    if o.plot and Path(o.plot).exists() and not Path(o.plot).is_dir():
        raise ValueError(f"--plot {o.plot} is a file: give a folder for the pictures (one PNG per image)")
    if not (o.images or o.index or o.evaluate):
        raise ValueError("give image files, --index N (an image of the test split) or --evaluate")
    if (o.data or o.max_images or o.json) and not o.evaluate:
        raise ValueError("--data, --max-images and --json go with --evaluate")
    segmenter = Segmenter.load(o.run, o.device)
    if o.evaluate:
        _evaluate(segmenter, o)
    if not (o.images or o.index):
        return 0
    pictures = [segmenter.read(path) for path in o.images]
    names = [Path(path).stem for path in o.images]
    truths = [None] * len(pictures)
    for n in o.index or []:
        pictures.append(segmenter.test_image(n))
        names.append(f"test{n}")
        truths.append(segmenter.data().splits["test"].labels[n])
    results = segmenter.predict(pictures)
    for name, picture, truth, r in zip(unique_names(names), pictures, truths, results, strict=True):
        shares = ", ".join(f"{safe(c)} {v:.1%}" for c, v in sorted(r.shares().items(), key=lambda kv: -kv[1]))
        print(f"{safe(name)}\t{picture.shape[-1]}x{picture.shape[-2]}\t{shares}")
        if o.plot:
            path = Path(o.plot) / f"{name}.png"
            segmentation_figure(picture, r.labels, r.class_names, truth=truth, attention=r.attention,
                                ignore_index=segmenter.ignore_index, title=name, path=path)
            print(f"wrote {safe(str(path))}")
    return 0


def register(commands, train_commands) -> None:
    add_command(commands, "segment", "label images with a segmentation run, draw them with the ARM/FFM channel "
                "weights (--plot), or --evaluate it (mIoU, per-class IoU, pixel accuracy)", SegmentCommand, segment)
