"""Where a captioning run on scenes goes wrong: how often each item is named, per (item, cell), marking the
held-out pairs, and the same for the worst pairs' test images rolled by 32 pixels to the other cells.

If an item is named far less often at its held-out cell than at the others, and the very same images rolled to
another cell are named right, the model has learned "item k never at cell c" (BENCHMARKS.md, captioning).

    python benchmarks/caption_diagnose.py runs/caption-bench/soft
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from qkv.apps.caption import Captioner
from qkv.data.scenes import HELD_OUT


def recall(captioner: Captioner, images: torch.Tensor, item: str) -> float:
    return sum(item in c.text.split() for c in captioner.predict(images, beam=1)) / len(images)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worst", type=int, default=2, help="roll the images of this many worst pairs")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    captioner = Captioner.load(args.run)
    data = captioner.dataset()
    if data.splits["test"].scenes is None:
        raise SystemExit(f"{args.run} was not trained on scenes")
    part, words = data.splits["test"], data.item_words
    captions = captioner.predict(part.batch(range(len(part))), beam=1)
    named, where = defaultdict(lambda: [0, 0]), defaultdict(list)
    for i, (caption, scene) in enumerate(zip(captions, part.scenes, strict=True)):
        for item, cell in zip(scene.items, scene.cells, strict=True):
            named[item, cell][0] += item in caption.text.split()
            named[item, cell][1] += 1
            where[item, cell].append(i)
    print("| item | cell | scenes | named | held out |\n|---|---|---|---|---|")
    for (item, cell), (hit, n) in sorted(named.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {item} | {cell} | {n} | {hit / n:.3f} | {'yes' if (words.index(item), cell) in HELD_OUT else ''} |")
    worst = sorted(named, key=lambda k: named[k][0] / named[k][1])[:args.worst]
    print("\n| item | cell | named | rolled down | rolled right | rolled both |\n|---|---|---|---|---|---|")
    for item, cell in worst:
        images = part.batch(where[item, cell])
        rolled = [recall(captioner, torch.roll(images, shifts=s, dims=(2, 3)), item)
                  for s in ((32, 0), (0, 32), (32, 32))]
        print(f"| {item} | {cell} | {named[item, cell][0] / named[item, cell][1]:.3f} | "
              + " | ".join(f"{r:.3f}" for r in rolled) + " |")


if __name__ == "__main__":
    main()
