"""``qkv caption``: caption images with a trained run (:mod:`.predict`'s way), draw where each word looked, or
evaluate it (``--evaluate``: :func:`qkv.cli.evaluate.evaluation`, as ``qkv evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...options import option
from ..command import LimitOption, PlotOption, RunInputs, evaluation, finish, input_paths, plot_folder, settings_of
from ..console import safe, unique_names
from .options import CaptionSettings
from .predictor import Captioner


@dataclass
class CaptionCommand(CaptionSettings, LimitOption, PlotOption, RunInputs):
    images: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="IMAGE",
                               help="image files (PNG, JPEG...); give them before the options")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the run's test split, e.g. a generated scene (repeatable)")
    split: str = option("test", choices=("valid", "test"), help="the split of --index and --evaluate")
    evaluate: bool = option(False, help="caption the whole split and print BLEU-1..4, exact match and grounding")
    data: str | None = option(None, requires=("evaluate",),
                              help="--evaluate on another captions file (default: the run's data)")
    on_error: str = option("raise", choices=("raise", "skip"), requires=("evaluate", "data"),
                           help="with --evaluate --data: captions naming missing or unreadable images: stop, or skip "
                                "and count them")

    FLAG_HELP = {"plot": "a folder: a picture per image, the image and, for every word, its attention map "
                         "upsampled and overlaid",
                 "limit": "--evaluate at most this many images",
                 "beam": "beam size (1 = greedy)",
                 "json": "write the captions as JSON rows, or with --evaluate the figures (NaN written null)",
                 "file": "a file of image file names, one per line"}
    FLAG_ALIASES = {"limit": ("--max-images",)}


def _table(o: CaptionCommand, m: dict[str, float]) -> None:
    print(f"split {o.split}, beam {o.beam}, {int(m['images'])} images")
    print("| BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | exact match |" + (" grounding | > 0.5 |" if "grounding" in m else ""))
    print("|---|---|---|---|---|" + ("---|---|" if "grounding" in m else ""))
    row = " | ".join(f"{m[f'bleu{n}']:.2f}" for n in range(1, 5)) + f" | {m['exact_match']:.4f}"
    if "grounding" in m:
        row += f" | {m['grounding']:.3f} | {m['grounding_above']:.3f}"
    print(f"| {row} |")
    if "layout_match" in m:
        print("exact match by number of items: " + ", ".join(f"{n}: {m[f'exact_match_items{n}']:.4f}"
                                                             for n in range(1, 5)))
        print(f"held-out item/position combinations: {m['exact_match_unseen']:.4f}; "
              f"layout (positions and relations, items masked): {m['layout_match']:.4f}")


def caption(o: CaptionCommand) -> int:
    from .pictures import caption_attention

    if o.split != "test" and not (o.index or o.evaluate):
        raise ValueError("--split goes with --index or --evaluate (without them, it would be ignored)")
    plots = plot_folder(o.plot) if o.plot else None  # settled first: printed == written
    files = input_paths(o, o.images, "image file", ", --index N (an image of the test split)")
    captioner = Captioner.load(o.run, o.device)
    if o.hard_test and not hasattr(captioner.model, "test_attention"):
        raise ValueError("--hard-test applies to hard attention runs only")
    if o.evaluate:
        evaluation(captioner, o.data, split=o.split, limit=o.limit, json_path=o.json, report=lambda m: _table(o, m),
                   **settings_of(o, captioner, "evaluate"))
        return 0
    pictures = [captioner.read(path) for path in files]
    names = [Path(path).stem for path in files]
    refs: list[list[str] | None] = [None] * len(pictures)
    boxes: list[list | None] = [None] * len(pictures)
    if o.index:
        images, index_refs = captioner.test_images(o.index, o.split)
        scenes = captioner.dataset().splits[o.split].scenes
        pictures += list(torch.unbind(images))
        names += [f"{o.split}{n}" for n in o.index]
        refs += index_refs
        boxes += [list(zip(scenes[n].items, scenes[n].boxes, strict=True)) if scenes else None for n in o.index]
    results = captioner.predict(torch.stack(pictures), **settings_of(o, captioner))
    for name, r, ref in zip(unique_names(names), results, refs, strict=True):
        print(f"{safe(name)}\t{safe(r.text)}")
        if ref is not None:
            print(f"  references: {' | '.join(ref)}")
    if plots:
        for i, (name, r, box) in enumerate(zip(unique_names(names), results, boxes, strict=True)):
            path = caption_attention(pictures[i], r.words, r.attention, boxes=box, path=plots / f"{name}.png")
            print(f"wrote {safe(str(path))}")
    finish(captioner, files + [f"{o.split}{n}" for n in o.index or []], results, o.json)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"caption": (CaptionCommand, caption)}
