"""Captioning data sets in the formats people have: Flickr8k-style caption lines and COCO captions JSON.

- Flickr8k / Flickr30k (``Flickr8k.token.txt``): one caption a line, ``image.jpg#N<TAB>caption`` (``N`` the
  caption's number, 0-4). Blank lines are skipped.
- COCO (``captions_train2014.json``): ``{"images": [{"id", "file_name"}, ...], "annotations": [{"image_id",
  "caption"}, ...]}``.

:func:`read_captions` tells the two apart by the content (a JSON object or not), checks that every image
exists in the image folder and is an image Pillow can open (its header: a damaged body is only found when the
image is read), and returns each image's captions. A malformed line or entry and a missing or unreadable image
are a ``ValueError`` naming ``file:line`` (COCO: the entry, e.g. ``annotations[12]``), or, with
``on_error="skip"``, skipped and counted (:attr:`CaptionFile.skipped`, logged).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ...data.files import text_lines
from ...data.images import BACKGROUND, image_8bit
from ...options import OptionError, ref

logger = logging.getLogger(__name__)

__all__ = ["CaptionFile", "read_captions", "read_flickr_captions", "read_coco_captions", "load_image"]

ON_ERROR = ("raise", "skip")


@dataclass
class CaptionFile:
    """Captions read from a file: ``images`` (paths) with their ``captions`` (lists, same order), and how many
    lines or entries were ``skipped`` (``on_error="skip"``) with the first ``problems`` (``file:line: why``);
    ``where`` names the line or entry that first named each image (``file:line``), for errors found later, when
    the image itself is read."""

    images: list[Path]
    captions: list[list[str]]
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    where: dict[Path, str] = field(default_factory=dict)


class _Collector:
    def __init__(self, on_error: str):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.by_image: dict[Path, list[str]] = {}
        self.skipped = 0
        self.problems: list[str] = []
        self._checked: dict[Path, str | None] = {}
        self.where: dict[Path, str] = {}

    def problem(self, where: str, why: str) -> None:
        message = f"{where}: {why}"
        if self.on_error == "raise":
            raise OptionError("{message} (" + ref("on_error") + " skip skips it)", "on_error", message=message)
        self.skipped += 1
        if len(self.problems) < 10:
            self.problems.append(message)

    def unreadable(self, file: Path) -> str | None:
        """Why ``file`` cannot be read as an image (``None`` if its header opens); asked once per image."""
        if file not in self._checked:
            self._checked[file] = _open_problem(file)
        return self._checked[file]

    def image_ok(self, file: Path, name: str, folder: Path, where: str) -> bool:
        """Whether the image ``name`` (``file`` in ``folder``) exists and opens; else its problem, at ``where``."""
        if not file.is_file():
            self.problem(where, f"image {name} not found in {folder}")
            return False
        if (why := self.unreadable(file)) is not None:
            self.problem(where, why)
            return False
        return True

    def add(self, image: Path, caption: str, where: str) -> None:
        self.by_image.setdefault(image, []).append(caption)
        self.where.setdefault(image, where)

    def result(self, path: Path) -> CaptionFile:
        if self.skipped:
            logger.warning("%s: skipped %d bad line(s) or entries, e.g. %s", path, self.skipped, self.problems[0])
        return CaptionFile(list(self.by_image), list(self.by_image.values()), self.skipped, self.problems,
                           self.where)


def _open_problem(file: Path) -> str | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as im:
            w, h = im.size
        if w < 1 or h < 1:
            return f"image {file.name} is empty ({w}x{h})"
    except UnidentifiedImageError:
        return f"{file.name} is not an image that Pillow can read"
    except OSError as e:
        return f"cannot read image {file.name} ({e.strerror or e})"
    except Exception as e:  # any decoder error means the same to the user
        return f"cannot read image {file.name} ({type(e).__name__}: {e})"
    return None


def _image_dir(path: Path, images: str | os.PathLike | None) -> Path:
    folder = Path(images) if images is not None else path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"no such image folder: {folder} (images)")
    return folder


def read_flickr_captions(path: str | os.PathLike, images: str | os.PathLike | None = None, *,
                         on_error: str = "raise") -> CaptionFile:
    """Read ``image.jpg#N<TAB>caption`` lines; ``images``: the folder of the pictures (default: the file's)."""
    path = Path(path)
    folder = _image_dir(path, images)
    out = _Collector(on_error)
    for n, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        name, tab, caption = line.partition("\t")
        image, hash_, number = name.strip().rpartition("#")
        if not tab or not hash_ or not image or not number.isdigit():
            out.problem(f"{path}:{n}", f"expected 'image.jpg#N<TAB>caption', got {line[:60]!r}")
            continue
        if not caption.strip():
            out.problem(f"{path}:{n}", f"empty caption for {image}")
            continue
        file = folder / image
        if not out.image_ok(file, image, folder, f"{path}:{n}"):
            continue
        out.add(file, " ".join(caption.split()), f"{path}:{n}")
    return out.result(path)


def read_coco_captions(path: str | os.PathLike, images: str | os.PathLike | None = None, *,
                       on_error: str = "raise") -> CaptionFile:
    """Read a COCO captions JSON; ``images``: the folder of the pictures (default: the file's)."""
    path = Path(path)
    folder = _image_dir(path, images)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or \
            not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: a COCO captions file is an object with 'images' and 'annotations' lists")
    out = _Collector(on_error)
    files: dict[object, Path] = {}
    named: dict[Path, str] = {}
    for i, entry in enumerate(data["images"]):
        if not isinstance(entry, dict) or "id" not in entry or not isinstance(entry.get("file_name"), str):
            out.problem(f"{path}: images[{i}]", "expected {'id': ..., 'file_name': '...'}")
            continue
        file = folder / entry["file_name"]
        if not out.image_ok(file, entry["file_name"], folder, f"{path}: images[{i}]"):
            continue
        files[entry["id"]] = file
        named.setdefault(file, f"{path}: images[{i}]")
    for i, entry in enumerate(data["annotations"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("caption"), str) or "image_id" not in entry:
            out.problem(f"{path}: annotations[{i}]", "expected {'image_id': ..., 'caption': '...'}")
            continue
        if entry["image_id"] not in files:
            out.problem(f"{path}: annotations[{i}]", f"image_id {entry['image_id']!r} is not among the images "
                        "(or its image was missing)")
            continue
        if not entry["caption"].strip():
            out.problem(f"{path}: annotations[{i}]", "empty caption")
            continue
        out.add(files[entry["image_id"]], " ".join(entry["caption"].split()), named[files[entry["image_id"]]])
    return out.result(path)


def read_captions(path: str | os.PathLike, images: str | os.PathLike | None = None, *,
                  on_error: str = "raise") -> CaptionFile:
    """Either format, told by the content: a file starting with ``{`` is COCO JSON, else Flickr lines."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give the captions file (Flickr8k.token.txt or a COCO JSON)")
    if not path.is_file():
        raise FileNotFoundError(f"no such captions file: {path} (data)")
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    reader = read_coco_captions if head.startswith(b"{") else read_flickr_captions
    return reader(path, images, on_error=on_error)


def load_image(path: str | os.PathLike, size: int, *, grey: bool = False, background: float = BACKGROUND) -> Tensor:
    """An image file as ``(C, size, size)`` uint8 (C = 1 grey or 3 RGB): the shorter side resized to ``size``
    (antialiased), then the centre cropped. 16-bit and float images are scaled to 0..255 (not clipped) and transparent
    ones composited on ``background`` (a grey level in [0, 1], white by default) with a warning, as
    :func:`qkv.data.images.image_array` says. Raises ``ValueError`` naming the file when it cannot be read."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = image_8bit(im, grey=grey, background=background, name=str(path))
        w, h = im.size
        scale = size / min(w, h)
        im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR,
                       reducing_gap=None)
        w, h = im.size
        left, top = (w - size) // 2, (h - size) // 2
        a = np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.uint8)
    except Exception as e:  # any decoder error means the same to the user
        raise ValueError(f"cannot read image {str(path)!r}: {e}") from None
    t = torch.from_numpy(np.array(a, copy=True))
    return t[None] if grey else t.permute(2, 0, 1).contiguous()
