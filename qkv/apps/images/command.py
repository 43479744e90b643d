"""``qkv show-attention``: an image model's attention maps drawn (PNG), its images read and classified
(:mod:`.predict`'s way)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...options import option
from ..command import RunInputs, finish, input_paths, plot_folder
from ..console import safe, unique_names
from .options import ImageSettings
from .predictor import ImageClassifier


@dataclass
class ShowAttentionCommand(ImageSettings, RunInputs):
    images: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="IMAGE",
                               help="image files (PNG, JPEG...), converted to grey; give them before the options")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the test split (repeatable)")
    out: str = option("attention", help="folder for the PNGs")
    query_pixel: str | None = option(None, metavar="Y,X",
                                     help="non-local: the query pixel, in input pixels (default: the centre)")
    data_root: str | None = option(None, requires=("index",), help="IDX folder for --index, if not the one trained "
                                   "on")

    FLAG_HELP = {"json": "write the classes as JSON rows (NaN written null)",
                 "file": "a file of image file names, one per line"}


def _pixel(text: str | None, size: tuple[int, int]) -> tuple[int, int]:
    h, w = size
    if text is None:
        return h // 2, w // 2
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--query-pixel must be 'y,x' (two integers), got {text!r}") from None
    if not (0 <= y < h and 0 <= x < w):
        raise ValueError(f"--query-pixel {y},{x} is outside the model's {h}x{w} input")
    return y, x


def show_attention(o: ShowAttentionCommand) -> int:
    from ...viz.plots import image_attention

    out = plot_folder(o.out, "--out")  # settled first: printed == written
    files = input_paths(o, o.images, "image file", " and/or --index N (an image of the test split)")
    if o.invert and not (o.images or o.file):
        raise ValueError("--invert goes with image files (the test split's images are read as they are)")
    clf = ImageClassifier.load(o.run, o.device)
    query = _pixel(o.query_pixel, clf.image_size)
    pictures = [clf.read(path, invert=o.invert) for path in files]
    names = [Path(path).stem for path in files]
    labels: list[int | None] = [None] * len(pictures)
    if o.index:
        images, targets = clf.test_images(o.data_root)
        for n in o.index:
            if not 0 <= n < len(targets):
                raise ValueError(f"--index {n} is out of range: the test split has {len(targets)} images "
                                 f"(0 to {len(targets) - 1})")
            pictures.append(images[n].float() / 255.0)
            names.append(f"test{n}")
            labels.append(int(targets[n]))
    batch = torch.stack(pictures)
    view = clf.attention(batch)
    if o.query_pixel and not view.non_local:
        raise ValueError("--query-pixel applies to non-local attention runs only (this run has none)")
    for i, (name, label) in enumerate(zip(unique_names(names), labels, strict=True)):
        p, k = view.probabilities[i].max(-1)
        pred = clf.class_names[int(k)]
        truth = f", true {clf.class_names[label]}" if label is not None else ""
        paths = image_attention(batch[i], out / name, caption=f"{name}: {pred} ({float(p):.2f}){truth}",
                                spatial={k: m[i] for k, m in view.spatial.items()},
                                channel={k: m[i] for k, m in view.channel.items()},
                                branches={k: m[i] for k, m in view.branches.items()},
                                branch_labels=view.branch_labels,
                                non_local={k: m[i] for k, m in view.non_local.items()}, grids=view.grids,
                                query_pixel=query)
        print(f"{safe(name)}: {pred} {float(p):.3f}" + (f" (true: {clf.class_names[label]})" if label is not None
                                                        else ""))
        for path in paths:
            print(f"wrote {safe(str(path))}")
    finish(clf, files + [f"test{n}" for n in o.index or []], clf.predict(batch), o.json)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"show-attention": (ShowAttentionCommand, show_attention)}
