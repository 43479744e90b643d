"""Where a captioning run's attention sits relative to the item each word names: the offset of the attention's
centre of mass from the centre of the item's box, in pixels, over the item words of the test captions.

A run whose grounding (attention mass inside the box) is low can be attending at random, or following every item
at a fixed displacement: the second gives a small spread of the offset around a large mean. Offsets are taken on
the torus of the canvas (the scene models' CNN pads circularly), so a displacement to the left of an item at the
left edge counts as the same displacement.

    python benchmarks/caption_offset.py runs/budget/caption-seed0 runs/budget/caption-seed1 --images 300
"""

from __future__ import annotations

import argparse

import torch

from qkv.apps.caption import Captioner


def offsets(run: str, images: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offsets (N, 2), masses (N,))``: ``(dy, dx)`` of each item word's attention centre from its box centre,
    and the attention's mass inside the box, over the item words of ``images`` test captions (greedy)."""
    from qkv.metrics import box_mass

    captioner = Captioner.load(run)
    data = captioner.dataset()
    part = data.splits["test"].head(images)
    if part.scenes is None:
        raise SystemExit(f"{run}: not a scenes run (no item boxes to measure against)")
    size = data.image_size
    items = set(data.item_words)
    rows, masses = [], []
    for caption, scene in zip(captioner.predict(part.batch(range(len(part))), beam=1), part.scenes, strict=True):
        boxes = dict(zip(scene.items, scene.boxes, strict=True))
        for t, word in enumerate(caption.words):
            if word not in items or word not in boxes:
                continue
            a = caption.attention[t].double()
            a = a / a.sum()
            h, w = a.shape
            cy = float((a.sum(1) * (torch.arange(h) + 0.5) * size / h).sum())
            cx = float((a.sum(0) * (torch.arange(w) + 0.5) * size / w).sum())
            y0, x0, y1, x1 = boxes[word]
            d = torch.tensor([cy - (y0 + y1) / 2, cx - (x0 + x1) / 2])
            rows.append((d + size / 2) % size - size / 2)  # on the torus: [-size/2, size/2)
            masses.append(box_mass(caption.attention[t], boxes[word], (size, size)))
    if not rows:
        raise SystemExit(f"{run}: no caption named an item of its scene")
    return torch.stack(rows), torch.tensor(masses)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--images", type=int, default=300, help="test images captioned per run")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| run | item words | mass in the box | mean offset (dy, dx) px | spread (std dy, dx) px "
          "| median distance px |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        d, m = offsets(run, args.images)
        mean, std = d.mean(0), d.std(0)
        print(f"| {run} | {len(d)} | {float(m.mean()):.3f} | ({mean[0]:+.1f}, {mean[1]:+.1f}) | "
              f"({std[0]:.1f}, {std[1]:.1f}) | {float(d.norm(dim=1).median()):.1f} |")


if __name__ == "__main__":
    main()
