"""IDX reader: round trips, gzip or not, and clear errors naming the file for broken or mismatched files."""

import gzip
from pathlib import Path

import pytest
import torch

from qkv.data.idx import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_ROOT,
    find_idx_file,
    load_fashion_mnist,
    load_idx_dataset,
    load_idx_pair,
    read_idx,
    write_idx,
)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip(tmp_path, dtype, suffix):
    t = (torch.randn(3, 4, 5) * 50).to(dtype)
    path = tmp_path / f"a{suffix}"
    write_idx(path, t)
    out = read_idx(path)
    assert out.dtype == dtype and torch.equal(out, t)


def test_known_bytes(tmp_path):
    # magic 0x00000801 (uint8, 1 dim), 3 items: the layout of a labels file
    path = tmp_path / "labels"
    path.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 0, 9]))
    assert read_idx(path).tolist() == [7, 0, 9]
    # big-endian int32
    path.write_bytes(bytes([0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 0, 0xFF, 0xFF, 0xFF, 0xFE]))
    assert read_idx(path).tolist() == [256, -2]


def test_gzip_told_by_content_not_name(tmp_path):
    t = torch.arange(12, dtype=torch.uint8).view(3, 4)
    write_idx(tmp_path / "x.gz", t)
    (tmp_path / "x.gz").rename(tmp_path / "plain-name")
    assert torch.equal(read_idx(tmp_path / "plain-name"), t)


def write_pair(folder: Path, n_images=5, n_labels=5, prefix="train", gz=True):
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    images = torch.randint(0, 256, (n_images, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (n_labels,), dtype=torch.uint8)
    write_idx(folder / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_load_dataset_from_any_folder(tmp_path, gz):
    images, labels = write_pair(tmp_path / "d", gz=gz)
    write_pair(tmp_path / "d", n_images=3, n_labels=3, prefix="t10k", gz=gz)
    x, y = load_idx_dataset(tmp_path / "d", "train")
    assert torch.equal(x, images) and torch.equal(y, labels.long()) and y.dtype == torch.int64
    assert load_idx_dataset(tmp_path / "d", "test")[0].shape == (3, 28, 28)
    assert load_fashion_mnist(tmp_path / "d", "test")[1].shape == (3,)


def test_mnist_dot_names(tmp_path):
    write_idx(tmp_path / "train-images.idx3-ubyte", torch.zeros(2, 28, 28, dtype=torch.uint8))
    assert find_idx_file(tmp_path, "train-images-idx3-ubyte").name == "train-images.idx3-ubyte"


def test_truncated_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    write_idx(path, torch.zeros(4, 28, 28, dtype=torch.uint8))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte: truncated: header declares shape \(4, 28, 28\)"):
        read_idx(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "h"
    path.write_bytes(bytes([0, 0, 8, 3, 0, 0]))
    with pytest.raises(ValueError, match=r"h: truncated header: 3 dimensions need 16 bytes"):
        read_idx(path)
    path.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="too short"):
        read_idx(path)


def test_trailing_bytes(tmp_path):
    path = tmp_path / "t"
    write_idx(path, torch.zeros(3, dtype=torch.uint8))
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ValueError, match="t: has trailing bytes"):
        read_idx(path)


def test_truncated_gzip(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(path, torch.zeros(1000, dtype=torch.uint8))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: not a readable gzip file"):
        read_idx(path)


@pytest.mark.parametrize("head", [b"\x00\x01\x08\x01", b"\x00\x00\x07\x01", b"PK\x03\x04"])
def test_bad_magic(tmp_path, head):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as f:
        f.write(head + b"\x00\x00\x00\x01\x05")
    with pytest.raises(ValueError, match=r"bad.gz: bad IDX magic number"):
        read_idx(path)


def test_mislabelled_files(tmp_path):
    images, _ = write_pair(tmp_path)
    img = tmp_path / "train-images-idx3-ubyte.gz"
    lab = tmp_path / "train-labels-idx1-ubyte.gz"
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: expected images .* is this a labels file"):
        load_idx_pair(lab, img)


def test_count_mismatch(tmp_path):
    write_pair(tmp_path, n_images=5, n_labels=4)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz has 5 images but .*train-labels-idx1-ubyte.gz "
                                         r"has 4 labels"):
        load_idx_dataset(tmp_path)


def test_missing_files_and_bad_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="Fashion-MNIST not found"):
        load_fashion_mnist(tmp_path)
    with pytest.raises(ValueError, match="split must be one of"):
        load_idx_dataset(tmp_path, "valid")


def test_write_rejects_unstorable(tmp_path):
    with pytest.raises(ValueError, match="IDX cannot store"):
        write_idx(tmp_path / "x", torch.zeros(2, dtype=torch.bool))


FASHION = Path(FASHION_MNIST_ROOT) / "t10k-labels-idx1-ubyte.gz"


@pytest.mark.skipif(not FASHION.exists(), reason=f"Fashion-MNIST is not installed ({FASHION_MNIST_ROOT} missing; "
                                                  "`apt-get install dataset-fashion-mnist`)")
def test_fashion_mnist_installed():
    x, y = load_fashion_mnist(split="test")
    assert x.shape == (10_000, 28, 28) and x.dtype == torch.uint8
    assert torch.equal(y.bincount(), torch.full((10,), 1000))
    assert len(FASHION_MNIST_CLASSES) == 10
