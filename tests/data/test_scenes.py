"""Generated captioning scenes (determinism, held-out combinations, boxes, references), the captioning metrics
(BLEU-1..4, box mass, grounding) on hand-made cases, and the Flickr8k / COCO readers' errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from qkv.apps.caption.captions import load_image, read_captions
from qkv.data import scenes as sc
from qkv.metrics import box_mass, caption_bleu, grounding

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data():
    return sc.make_scenes(300, 100, 300, seed=3)


@pytest.mark.slow
def test_deterministic_from_the_seed(data):
    again = sc.make_scenes(300, 100, 300, seed=3)
    other = sc.make_scenes(300, 100, 300, seed=4)
    for split in ("train", "valid", "test"):
        assert torch.equal(data.splits[split].images, again.splits[split].images)
        assert data.splits[split].scenes == again.splits[split].scenes
    assert not torch.equal(data.splits["train"].images, other.splits["train"].images)
    # scene i does not depend on how many scenes are made
    fewer = sc.make_scenes(10, 1, 1, seed=3)
    assert torch.equal(fewer.splits["train"].images, data.splits["train"].images[:10])


def test_held_out_combinations_only_in_test(data):
    index = {w: k for k, w in enumerate(data.item_words)}
    for split in ("train", "valid"):
        for scene in data.splits[split].scenes:
            assert not scene.held_out
            assert not any((index[w], c) in sc.HELD_OUT for w, c in zip(scene.items, scene.cells, strict=True))
    test = data.splits["test"].scenes
    flagged = [any((index[w], c) in sc.HELD_OUT for w, c in zip(s.items, s.cells, strict=True)) for s in test]
    assert flagged == [s.held_out for s in test] and 0.1 < sum(flagged) / len(test) < 0.9


def test_items_boxes_and_references(data):
    counts = set()
    for split in data.splits.values():
        for image, scene in zip(split.images, split.scenes, strict=True):
            counts.add(len(scene.items))
            assert len(set(scene.items)) == len(scene.items) and scene.cells == sorted(scene.cells)
            inside = torch.zeros(sc.CANVAS, sc.CANVAS, dtype=torch.bool)
            for (y0, x0, y1, x1), (r, c) in zip(scene.boxes, scene.cells, strict=True):
                assert r * sc.CELL <= y0 < y1 <= (r + 1) * sc.CELL and c * sc.CELL <= x0 < x1 <= (c + 1) * sc.CELL
                assert sc.SIZES[0] <= y1 - y0 <= sc.SIZES[1] and y1 - y0 == x1 - x0
                assert image[y0:y1, x0:x1].any()  # the item is drawn in its box
                inside[y0:y1, x0:x1] = True
            assert not image[~inside].any()  # and nothing outside the boxes
            assert 1 <= len(scene.captions) <= 3 and len(set(scene.captions)) == len(scene.captions)
            for ref in scene.captions:
                assert sorted(w for w in ref.split() if w in data.item_words) == sorted(scene.items)
    assert counts == {1, 2, 3, 4}


def test_scene_captions_by_hand():
    assert sc.scene_captions(["bag"], [(1, 1)]) == ["a bag at the bottom right", "a bag on the right at the bottom"]
    refs = sc.scene_captions(["boot", "bag", "dress"], [(1, 0), (0, 1), (0, 0)])
    assert refs == ["a dress at the top left , a bag at the top right and a boot at the bottom left",
                    "a dress at the top left , a boot at the bottom left and a bag at the top right",
                    "a dress left of a bag above a boot on the left"]


@pytest.mark.slow
def test_splits_use_disjoint_pictures():
    pools, words, _ = sc._item_pools(None)
    assert words == list(sc.FASHION_ITEMS.values()) or words == list(sc.DIGIT_ITEMS.values())
    for k in range(len(words)):
        digests = {name: {hashlib.sha1(p.numpy().tobytes()).digest() for p in pools[name][k]}
                   for name in ("train", "valid")}
        assert len(digests["valid"]) and not digests["train"] & digests["valid"]


def test_digits_when_fashion_mnist_is_missing(monkeypatch, tmp_path):
    pytest.importorskip("sklearn")
    import qkv.data.idx

    monkeypatch.setattr(qkv.data.idx, "FASHION_MNIST_ROOT", str(tmp_path / "none"))
    d = sc.make_scenes(5, 2, 2)
    assert d.item_words == list(sc.DIGIT_ITEMS.values()) and "digits" in d.source
    with pytest.raises(FileNotFoundError, match="scenes_root"):
        sc.make_scenes(5, 2, 2, root=str(tmp_path / "none"))
    with pytest.raises(ValueError, match="n_valid"):
        sc.make_scenes(5, 0, 2)


# ----------------------------------------------------------------------------------------------- metrics

def test_box_mass_hand_made():
    a = torch.tensor([[0.5, 0.5], [0.0, 0.0]])  # a 2x2 grid over a 4x4 image: cells of 2x2 pixels
    assert box_mass(a, (0, 0, 2, 4), (4, 4)) == pytest.approx(1.0)
    assert box_mass(a, (0, 0, 2, 2), (4, 4)) == pytest.approx(0.5)
    assert box_mass(a, (0, 1, 1, 3), (4, 4)) == pytest.approx(0.25)  # a quarter of each top cell
    assert box_mass(a, (2, 0, 4, 4), (4, 4)) == 0.0
    assert box_mass(2 * a, (0, 0, 2, 2), (4, 4)) == pytest.approx(0.5)  # a share of the total
    with pytest.raises(ValueError, match="box"):
        box_mass(a, (0, 0, 5, 2), (4, 4))
    assert grounding([0.2, 0.9, 0.6]) == {"grounding": pytest.approx(1.7 / 3), "grounding_above": 2 / 3,
                                          "grounded_words": 3.0}
    assert grounding([])["grounded_words"] == 0


def test_caption_bleu_against_sacrebleu():
    import sacrebleu

    hyps = ["a bag at the top left", "a boot on the right"]
    refs = [["a bag at the top left", "a bag on the left at the top"], ["a boot at the top right"]]
    m = caption_bleu(hyps, refs)
    streams = [[r[0] for r in refs], [refs[0][1], refs[1][0]]]
    assert m["bleu4"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score)
    assert m["bleu1"] >= m["bleu2"] >= m["bleu3"] >= m["bleu4"]
    assert caption_bleu(["a b c d"], [["a b c d"]])["bleu4"] == pytest.approx(100.0)


# ----------------------------------------------------------------------------------------------- readers

def _png(path: Path, value: int = 128) -> None:
    from PIL import Image

    Image.new("RGB", (20, 12), (value, 0, 255 - value)).save(path)


def test_flickr_reader(tmp_path):
    for name in ("a.jpg", "b.jpg"):
        _png(tmp_path / name)
    good = "a.jpg#0\tA dog runs .\na.jpg#1\ta  dog\n\nb.jpg#0\tTwo cats\n"
    (tmp_path / "captions.txt").write_text(good)
    cf = read_captions(tmp_path / "captions.txt")
    assert [p.name for p in cf.images] == ["a.jpg", "b.jpg"] and cf.captions == [["A dog runs .", "a dog"],
                                                                                   ["Two cats"]]
    (tmp_path / "bad.txt").write_text(good + "b.jpg no tab here\n")
    with pytest.raises(ValueError, match=r"bad\.txt:5: expected 'image\.jpg#N<TAB>caption'"):
        read_captions(tmp_path / "bad.txt")
    (tmp_path / "missing.txt").write_text("a.jpg#0\tok\nc.jpg#0\tgone\nb.jpg#x\tbad number\n")
    with pytest.raises(ValueError, match=r"missing\.txt:2: image c\.jpg not found"):
        read_captions(tmp_path / "missing.txt")
    cf = read_captions(tmp_path / "missing.txt", on_error="skip")
    assert cf.skipped == 2 and len(cf.images) == 1 and "missing.txt:3" in cf.problems[1]
    with pytest.raises(FileNotFoundError, match="image folder"):
        read_captions(tmp_path / "captions.txt", tmp_path / "nowhere")


def test_coco_reader(tmp_path):
    _png(tmp_path / "1.png")
    doc = {"images": [{"id": 1, "file_name": "1.png"}, {"id": 2, "file_name": "2.png"}],
           "annotations": [{"image_id": 1, "caption": "a red  box"}, {"image_id": 2, "caption": "gone"},
                           {"image_id": 9, "caption": "no such image"}, {"caption": "no id"}]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"c\.json: images\[1\]: image 2\.png not found"):
        read_captions(tmp_path / "c.json")
    cf = read_captions(tmp_path / "c.json", on_error="skip")
    assert cf.captions == [["a red box"]] and cf.skipped == 4
    (tmp_path / "broken.json").write_text('{"images": [\n  {"id": 1,}\n]}')
    with pytest.raises(ValueError, match=r"broken\.json:2: not valid JSON"):
        read_captions(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="on_error"):
        read_captions(tmp_path / "c.json", on_error="ignore")


def test_load_image_crops_and_resizes(tmp_path):
    _png(tmp_path / "x.png", 200)
    rgb = load_image(tmp_path / "x.png", 16)
    grey = load_image(tmp_path / "x.png", 8, grey=True)
    assert rgb.shape == (3, 16, 16) and rgb.dtype == torch.uint8 and abs(int(rgb[0, 5, 5]) - 200) <= 2
    assert grey.shape == (1, 8, 8)
    (tmp_path / "bad.png").write_bytes(PNG + b"garbage")
    with pytest.raises(ValueError, match="cannot read image"):
        load_image(tmp_path / "bad.png", 8)
