"""The IDX format of MNIST and Fashion-MNIST, plain or gzip-compressed, from any folder.

Format (LeCun et al., http://yann.lecun.com/exdb/mnist/): a 4-byte magic number ``0x00 0x00 TYPE NDIM``,
then ``NDIM`` big-endian uint32 sizes, then the data, big-endian, row-major. ``TYPE``: 0x08 uint8,
0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.

Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017, https://arxiv.org/abs/1708.07747, MIT licence) ships as
``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz`` and
``t10k-labels-idx1-ubyte.gz``; Debian's ``dataset-fashion-mnist`` package installs them in
``/usr/share/datasets/fashion-mnist``. MNIST uses the same names (also unpacked, with ``.idx3-ubyte``).
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import sys
import zlib
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["read_idx", "write_idx", "load_idx_pair", "load_idx_dataset", "load_fashion_mnist", "find_idx_file",
           "FASHION_MNIST_ROOT", "FASHION_MNIST_CLASSES"]

log = logging.getLogger(__name__)

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")

# IDX type code -> (torch dtype, bytes per element)
_TYPES: dict[int, tuple[torch.dtype, int]] = {
    0x08: (torch.uint8, 1),
    0x09: (torch.int8, 1),
    0x0B: (torch.int16, 2),
    0x0C: (torch.int32, 4),
    0x0D: (torch.float32, 4),
    0x0E: (torch.float64, 8),
}
_CODES = {dtype: code for code, (dtype, _) in _TYPES.items()}
_SPLITS = {"train": "train", "test": "t10k"}


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    try:
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e}); the download may be truncated") from None


def read_idx(path: str | os.PathLike) -> Tensor:
    """Read one IDX file (gzip-compressed or not, told by its content) into a tensor of its type and shape.

    Raises ``ValueError`` naming the file when the magic number, the sizes or the data length are wrong.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: {len(data)} bytes, too short for an IDX header (4-byte magic number)")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or code not in _TYPES:
        raise ValueError(f"{path}: bad IDX magic number 0x{data[:4].hex()} (expected 0x0000 then a type in "
                         f"{[hex(c) for c in _TYPES]} then the number of dimensions); not an IDX file?")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated header: {ndim} dimensions need {header} bytes, the file has {len(data)}")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype, size = _TYPES[code]
    count = 1
    for d in dims:
        count *= d
    expected = header + count * size
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise ValueError(f"{path}: {what}: header declares shape {dims} of {dtype} ({expected} bytes in all), "
                         f"the file has {len(data)} bytes")
    raw = bytearray(data[header:])
    if size == 1:
        out = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    else:
        out = torch.frombuffer(raw, dtype=torch.uint8).view(-1, size)
        if sys.byteorder == "little":
            out = out.flip(-1)
        out = out.contiguous().view(dtype).view(-1)
    return out.reshape(dims).clone()


def write_idx(path: str | os.PathLike, tensor: Tensor) -> None:
    """Write ``tensor`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``)."""
    path = Path(path)
    t = tensor.detach().cpu().contiguous()
    if t.dtype not in _CODES:
        raise ValueError(f"IDX cannot store {t.dtype}; expected one of {list(_CODES)}")
    if t.dim() == 0 or t.dim() > 255:
        raise ValueError(f"IDX stores 1 to 255 dimensions, got shape {tuple(t.shape)}")
    header = struct.pack(f">HBB{t.dim()}I", 0, _CODES[t.dtype], t.dim(), *t.shape)
    raw = t.view(-1).view(torch.uint8).view(-1, t.element_size())
    if sys.byteorder == "little" and t.element_size() > 1:
        raw = raw.flip(-1)
    body = bytes(raw.contiguous().view(-1).tolist()) if t.numel() else b""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + body)


def find_idx_file(root: str | os.PathLike, stem: str) -> Path:
    """The file for ``stem`` (e.g. ``train-images-idx3-ubyte``) in ``root``: ``.gz`` or not, ``-idx`` or ``.idx``."""
    root = Path(root)
    names = [stem, stem.replace("-idx", ".idx")]
    for name in names:
        for candidate in (root / name, root / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"no {stem}[.gz] in {root}")


def load_idx_pair(images_path: str | os.PathLike, labels_path: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """Read an images file ``(N, H, W)`` and its labels file ``(N,)``, checking that they belong together.

    Returns ``images (N, H, W) uint8`` and ``labels (N,) int64``.
    """
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dim() != 3:
        raise ValueError(f"{images_path}: expected images (N, H, W), got an IDX array of shape {tuple(images.shape)}"
                         + (" - is this a labels file?" if images.dim() == 1 else ""))
    if labels.dim() != 1:
        raise ValueError(f"{labels_path}: expected labels (N,), got an IDX array of shape {tuple(labels.shape)}"
                         + (" - is this an images file?" if labels.dim() == 3 else ""))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images_path} has {images.shape[0]} images but {labels_path} has {labels.shape[0]} "
                         "labels; the files do not belong together")
    if images.dtype != torch.uint8 or labels.dtype != torch.uint8:
        raise ValueError(f"{images_path}, {labels_path}: expected uint8 images and labels, got {images.dtype} and "
                         f"{labels.dtype}")
    return images, labels.long()


def load_idx_dataset(root: str | os.PathLike, split: str = "train") -> tuple[Tensor, Tensor]:
    """Load the ``train`` or ``test`` split of an MNIST-style folder: ``images (N, H, W) uint8, labels (N,) int64``."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {list(_SPLITS)}, got {split!r}")
    prefix = _SPLITS[split]
    root = Path(root)
    images = find_idx_file(root, f"{prefix}-images-idx3-ubyte")
    labels = find_idx_file(root, f"{prefix}-labels-idx1-ubyte")
    out = load_idx_pair(images, labels)
    log.info("loaded %s: %d images of %dx%d", root / prefix, *out[0].shape)
    return out


def load_fashion_mnist(root: str | os.PathLike = FASHION_MNIST_ROOT, split: str = "train") -> tuple[Tensor, Tensor]:
    """Fashion-MNIST ``split`` (``train``: 60,000, ``test``: 10,000) from ``root``.

    Class names are :data:`FASHION_MNIST_CLASSES`. Raises ``FileNotFoundError`` with install advice when
    the files are missing.
    """
    try:
        return load_idx_dataset(root, split)
    except FileNotFoundError as e:
        hint = " (install it with `apt-get install dataset-fashion-mnist`)" if str(root) == FASHION_MNIST_ROOT else ""
        raise FileNotFoundError(f"Fashion-MNIST not found: {e}{hint}; or pass root= a folder with the four "
                                "IDX files from https://github.com/zalandoresearch/fashion-mnist") from None
