"""Segmentation data: the labelled scenes agree with the canvases they label, held-out (item, cell)
combinations occur in the test split only; the folder reader reads grayscale, 16-bit and palette label PNGs as
class numbers (compared with the arrays written), and every hostile file (missing label, size mismatch, a label
above the class count, a truncated, garbage or colour PNG, a JPEG named .png) is a ValueError naming the file, or
skipped and counted with on_error="skip"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.apps.segment.scenes import EDGE, IGNORE, make_segmentation_scenes, read_label_png, read_segmentation_folder
from qkv.cli import main
from qkv.data.scenes import CELL, CELLS, HELD_OUT

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def scenes():
    return make_segmentation_scenes(60, 10, 60, seed=3)


def test_scene_labels_follow_the_canvas(scenes):
    for split in scenes.splits.values():
        x, y = split.images[:, 0].long(), split.labels.long()
        assert x.shape == y.shape == (len(split), 64, 64) and split.images.dtype == torch.uint8
        assert ((y > 0) & (y != IGNORE) <= (x >= EDGE)).all()  # an item's pixels are bright enough
        assert ((x == 0) <= (y == 0)).all()  # black pixels are background
        assert ((x >= EDGE) <= (y > 0)).all()  # every bright pixel belongs to an item
        assert ((x > 0) & (x < EDGE) <= (y == IGNORE)).all()  # the faint halo is ignored
    assert scenes.class_names[0] == "background" and len(scenes.class_names) == 7


def test_one_item_class_per_cell_and_varied_sizes(scenes):
    sides = []
    for labels in scenes.splits["train"].labels:
        for r, c in CELLS:
            cell = labels[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]
            classes = set(cell.unique().tolist()) - {0, IGNORE}
            assert len(classes) <= 1
            if classes:
                ys, xs = torch.nonzero(cell != 0, as_tuple=True)
                sides.append(int(max(ys.max() - ys.min(), xs.max() - xs.min())) + 1)
    assert min(sides) <= 16 and max(sides) >= 28  # items from 12 to 32 pixels


def _combos(labels):
    """The (item, cell) combinations of label maps ``(N, 64, 64)``."""
    out = set()
    for scene in labels:
        for r, c in CELLS:
            cell = scene[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]
            out |= {(k - 1, (r, c)) for k in set(cell.unique().tolist()) - {0, IGNORE}}
    return out


def test_held_out_combinations_only_in_test(scenes):
    assert not _combos(scenes.splits["train"].labels) & HELD_OUT
    assert not _combos(scenes.splits["valid"].labels) & HELD_OUT
    test = scenes.splits["test"]
    assert _combos(test.labels) & HELD_OUT
    for labels, held in zip(test.labels, test.held_out, strict=True):
        assert bool(held) == bool(_combos(labels[None]) & HELD_OUT)


@pytest.mark.slow
def test_scenes_are_deterministic_in_the_seed():
    a, b = make_segmentation_scenes(3, 1, 1, seed=5), make_segmentation_scenes(3, 1, 1, seed=5)
    c = make_segmentation_scenes(3, 1, 1, seed=6)
    assert torch.equal(a.splits["train"].labels, b.splits["train"].labels)
    assert not torch.equal(a.splits["train"].images, c.splits["train"].images)


# --- the folder reader -----------------------------------------------------------------------------------------

def _image(path, h=10, w=12, seed=0):
    a = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    Image.fromarray(a).save(path)
    return a


def _labels(path, a, mode="L"):
    if mode == "P":
        im = Image.fromarray(a.astype(np.uint8), mode="P")
        im.putpalette([v for k in range(256) for v in (k * 7 % 256, k * 13 % 256, k * 29 % 256)])
        im.save(path)
    elif mode == "I;16":
        Image.fromarray(a.astype(np.uint16)).save(path)
    else:
        Image.fromarray(a.astype(np.uint8)).save(path)
    return a


def _folder(root, n=6, classes=3, h=10, w=12):
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    truth = {}
    for i in range(n):
        _image(root / "images" / f"im{i}.png", h, w, seed=i)
        a = np.random.default_rng(100 + i).integers(0, classes, size=(h, w))
        a[0, 0] = IGNORE
        truth[f"im{i}"] = _labels(root / "labels" / f"im{i}.png", a, mode="P" if i % 2 else "L")
    return truth


@pytest.mark.parametrize("mode", ["L", "P", "I;16"])
def test_label_png_modes_read_as_class_numbers(tmp_path, mode):
    a = np.random.default_rng(0).integers(0, 5, size=(7, 9))
    a[3, 4] = IGNORE
    _labels(tmp_path / "l.png", a, mode)
    assert Image.open(tmp_path / "l.png").mode.startswith(mode[0])
    got = read_label_png(tmp_path / "l.png", num_classes=5)
    assert got.dtype == torch.int64 and np.array_equal(got.numpy(), a)


def test_folder_reader_splits_and_keeps_labels(tmp_path):
    truth = _folder(tmp_path / "d", n=10)
    d = read_segmentation_folder(tmp_path / "d", image_size=None, valid=0.2, test=0.2, seed=1)
    assert {s: len(v) for s, v in d.splits.items()} == {"train": 6, "valid": 2, "test": 2}
    assert d.class_names == ["0", "1", "2"] and d.channels == 3
    for split in d.splits.values():
        for name, labels in zip(split.names, split.labels, strict=True):
            assert np.array_equal(labels.numpy(), truth[name].astype(np.uint8))
    names = [n for s in d.splits.values() for n in s.names]
    assert sorted(names) == sorted(truth)
    resized = read_segmentation_folder(tmp_path / "d", image_size=24, valid=0.2, test=0.2, seed=1, grey=True)
    assert resized.splits["train"].images.shape[1:] == (1, 24, 24)
    assert set(resized.splits["train"].labels.unique().tolist()) <= {0, 1, 2, IGNORE}  # nearest: no new labels


def test_voc_layout_split_folders_and_class_names(tmp_path):
    for split in ("train", "test"):
        root = tmp_path / "voc" / split
        (root / "JPEGImages").mkdir(parents=True)
        (root / "SegmentationClass").mkdir()
        for i in range(4):
            _image(root / "JPEGImages" / f"{split}{i}.png", seed=i)
            _labels(root / "SegmentationClass" / f"{split}{i}.png", np.full((10, 12), i % 2), mode="P")
    (tmp_path / "voc" / "classes.txt").write_text("background\nthing\n")
    d = read_segmentation_folder(tmp_path / "voc", valid=0.25)
    assert d.class_names == ["background", "thing"]
    assert [len(d.splits[s]) for s in ("train", "valid", "test")] == [3, 1, 4]


def _hostile(root, kind):
    bad_label = root / "labels" / "im2.png"
    if kind == "missing":
        bad_label.unlink()
    elif kind == "size":
        _labels(bad_label, np.zeros((9, 12)))
    elif kind == "above":
        a = np.zeros((10, 12))
        a[5, 7] = 3
        _labels(bad_label, a)
    elif kind == "truncated":
        data = bad_label.read_bytes()
        bad_label.write_bytes(data[:len(data) // 2])
    elif kind == "garbage":
        bad_label.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 3)
    elif kind == "empty":
        bad_label.write_bytes(b"")
    elif kind == "rgb":
        Image.fromarray(np.zeros((10, 12, 3), dtype=np.uint8)).save(bad_label)
    elif kind == "jpeg":
        Image.fromarray(np.zeros((10, 12), dtype=np.uint8)).save(bad_label, format="JPEG")
    elif kind == "image":
        (root / "images" / "im2.png").write_bytes(b"not an image")
    return bad_label


HOSTILE = {"missing": "no label PNG", "size": "9 pixels", "above": "label 3 at pixel (y=5, x=7)",
           "truncated": "not a readable PNG", "garbage": "not a readable PNG", "empty": "not a readable PNG",
           "rgb": "RGB PNG", "jpeg": "not a PNG", "image": "not a readable image"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_label_pngs_name_the_file_or_are_skipped(tmp_path, kind, caplog):
    _folder(tmp_path / "d", n=8)
    (tmp_path / "d" / "classes.txt").write_text("a\nb\nc\n")
    _hostile(tmp_path / "d", kind)
    with pytest.raises(ValueError) as e:
        read_segmentation_folder(tmp_path / "d", valid=0.25, test=0.25)
    message = str(e.value)
    assert "im2" in message and HOSTILE[kind] in message and "\n" not in message
    d = read_segmentation_folder(tmp_path / "d", valid=0.25, test=0.25, on_error="skip")
    assert d.skipped == 1 and sum(len(s) for s in d.splits.values()) == 7
    assert "im2" not in [n for s in d.splits.values() for n in s.names]


def test_label_above_num_classes_without_classes_txt(tmp_path):
    _folder(tmp_path / "d", n=6, classes=4)
    with pytest.raises(ValueError, match="there are 2 classes"):
        read_segmentation_folder(tmp_path / "d", num_classes=2, valid=0.2, test=0.2)
    assert len(read_segmentation_folder(tmp_path / "d", valid=0.2, test=0.2).class_names) == 4


def test_empty_splits_and_missing_folders_are_errors(tmp_path):
    _folder(tmp_path / "d", n=3)
    with pytest.raises(ValueError, match="each needs at least one"):
        read_segmentation_folder(tmp_path / "d", valid=0.1, test=0.1)
    with pytest.raises(ValueError, match="no such folder"):
        read_segmentation_folder(tmp_path / "nothing")
    (tmp_path / "e").mkdir()
    with pytest.raises(ValueError, match="no images/ folder"):
        read_segmentation_folder(tmp_path / "e")


def test_training_on_a_hostile_folder_is_one_line_exit_2(tmp_path, capsys):
    _folder(tmp_path / "d", n=8)
    _hostile(tmp_path / "d", "truncated")
    out = tmp_path / "run"
    code = main(["train", "segment", "--data", str(tmp_path / "d"), "--valid", "0.25", "--test", "0.25",
                 "--max-steps", "1", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("qkv: error:") and "im2.png" in err and len(err.splitlines()) == 1
    assert not out.exists()
