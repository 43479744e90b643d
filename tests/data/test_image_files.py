"""Reading image files: 16-bit grey and float images are scaled to the 8-bit range, not clipped;
transparent images are composited on a stated background with a warning; a captions file naming an unreadable
image is an error at its ``file:line``, or skipped and counted. Each reader is compared with a NumPy reference
computed from the generated pixels."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

Image = pytest.importorskip("PIL.Image")

from qkv.apps.caption.captions import load_image, read_captions  # noqa: E402
from qkv.data.images import image_array, read_image  # noqa: E402

LUMA = np.array([0.299, 0.587, 0.114])


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def grey16(rng, path, h=12, w=12):
    a = rng.integers(0, 65536, size=(h, w), dtype=np.uint16)
    Image.fromarray(a).save(path)
    assert Image.open(path).mode.startswith("I")
    return a.astype(np.float64) / 65535.0


def test_16_bit_grey_png_is_scaled_not_clipped(tmp_path, rng):
    ref = grey16(rng, tmp_path / "g16.png")
    got = read_image(tmp_path / "g16.png", (12, 12))
    torch.testing.assert_close(got, torch.from_numpy(ref).float(), rtol=0, atol=1e-6)
    assert float(got.mean()) == pytest.approx(ref.mean(), abs=1e-6) and 0.4 < ref.mean() < 0.6
    # the captioning reader: uint8 in 0..255, grey and RGB (the same grey level in every channel)
    ref8 = np.round(ref * 255.0)
    grey = load_image(tmp_path / "g16.png", 12, grey=True)
    rgb = load_image(tmp_path / "g16.png", 12)
    assert grey.shape == (1, 12, 12) and rgb.shape == (3, 12, 12)
    assert np.abs(grey[0].numpy().astype(np.float64) - ref8).max() <= 1
    assert all(np.abs(rgb[c].numpy().astype(np.float64) - ref8).max() <= 1 for c in range(3))


@pytest.mark.parametrize("scale", [1.0, 255.0])
def test_float_images_in_0_1_or_0_255_are_scaled(tmp_path, rng, scale):
    a = rng.random((10, 10)).astype(np.float32)
    Image.fromarray(a * np.float32(scale)).save(tmp_path / "f.tiff")
    got = read_image(tmp_path / "f.tiff", (10, 10))
    torch.testing.assert_close(got, torch.from_numpy(a), rtol=0, atol=1e-5)


def test_float_images_of_another_range_are_stretched_with_a_warning(tmp_path, rng, caplog):
    a = rng.normal(size=(10, 10)).astype(np.float32) * 1000
    Image.fromarray(a).save(tmp_path / "f.tiff")
    with caplog.at_level(logging.WARNING):
        got = read_image(tmp_path / "f.tiff", (10, 10))
    ref = (a - a.min()) / (a.max() - a.min())
    torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=1e-5)
    assert "are stretched to [0, 1]" in caplog.text and "f.tiff" in caplog.text


def rgba_reference(rgba: np.ndarray, background: float) -> np.ndarray:
    x = rgba.astype(np.float64) / 255.0
    alpha = x[..., 3:]
    return x[..., :3] * alpha + background * (1 - alpha)


@pytest.mark.parametrize("background", [1.0, 0.0])
def test_transparent_rgba_is_composited_on_the_background_with_a_warning(tmp_path, rng, caplog, background):
    rgba = rng.integers(0, 256, size=(8, 8, 4), dtype=np.uint8)
    rgba[0, 0, 3] = 0  # one fully transparent pixel: the background only
    Image.fromarray(rgba, "RGBA").save(tmp_path / "t.png")
    ref = rgba_reference(rgba, background)
    with caplog.at_level(logging.WARNING):
        got = read_image(tmp_path / "t.png", (8, 8), background=background)
        rgb = load_image(tmp_path / "t.png", 8, background=background)
    torch.testing.assert_close(got, torch.from_numpy(ref @ LUMA).float(), rtol=0, atol=1e-6)
    assert float(got[0, 0]) == pytest.approx(background)
    assert np.abs(rgb.permute(1, 2, 0).numpy() - np.round(ref * 255)).max() <= 1
    assert "t.png is transparent: composited on a background of grey level" in caplog.text
    assert ("white" if background == 1.0 else "black") in caplog.text


def test_grey_with_alpha_and_palette_transparency(tmp_path, rng, caplog):
    la = rng.integers(0, 256, size=(6, 6, 2), dtype=np.uint8)
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    a = la[..., 1:] / 255.0
    ref = la[..., 0] / 255.0 * a[..., 0] + 1.0 * (1 - a[..., 0])
    torch.testing.assert_close(read_image(tmp_path / "la.png", (6, 6)), torch.from_numpy(ref).float(), rtol=0,
                               atol=2e-3)  # Pillow's RGBA round trip of the grey levels
    p = Image.new("P", (4, 4), 1)
    p.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    p.putpixel((0, 0), 0)
    p.info["transparency"] = 0
    p.save(tmp_path / "p.png", transparency=0)
    with caplog.at_level(logging.WARNING):
        got = read_image(tmp_path / "p.png", (4, 4), background=0.5)
    assert float(got[0, 0]) == pytest.approx(0.5) and float(got[1, 1]) == pytest.approx(
        float(np.array([10, 20, 30]) @ LUMA / 255), abs=1e-6)
    assert "p.png is transparent" in caplog.text


def test_opaque_and_8_bit_images_are_unchanged_and_quiet(tmp_path, rng, caplog):
    rgb = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(np.concatenate([rgb, np.full((8, 8, 1), 255, np.uint8)], -1), "RGBA").save(tmp_path / "o.png")
    with caplog.at_level(logging.WARNING):
        for name in ("rgb.png", "o.png"):
            assert torch.equal(load_image(tmp_path / name, 8), torch.from_numpy(rgb).permute(2, 0, 1))
            ref = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.float64) / 255
            torch.testing.assert_close(read_image(tmp_path / name, (8, 8)), torch.from_numpy(ref).float())
    assert caplog.text == ""
    assert image_array(Image.fromarray(rgb), grey=False).shape == (8, 8, 3)


# --- captions files naming unreadable images ---------------------------------------------------------------------
def flickr(tmp_path, rng):
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)).save(tmp_path / f"ok{i}.png")
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "empty.jpg").write_bytes(b"")
    good = (tmp_path / "ok0.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(good[:12])  # a header cut short
    lines = ["ok0.png#0\ta dog", "ok1.png#0\ta cat", "text.png#0\ta fish", "ok2.png#0\ta cow", "empty.jpg#0\tx",
             "cut.png#0\ty", "text.png#1\ta fish again"]
    (tmp_path / "captions.txt").write_text("\n".join(lines) + "\n")
    return tmp_path / "captions.txt"


def test_flickr_captions_naming_unreadable_images(tmp_path, rng):
    path = flickr(tmp_path, rng)
    with pytest.raises(ValueError, match=r"captions.txt:3: text.png is not an image that Pillow can read") as e:
        read_captions(path)
    assert "\n" not in str(e.value)
    cf = read_captions(path, on_error="skip")
    assert [p.name for p in cf.images] == ["ok0.png", "ok1.png", "ok2.png"]
    assert cf.where[tmp_path / "ok2.png"] == f"{path}:4"  # for an image found damaged when it is read
    assert cf.skipped == 4
    assert [p.split(": ", 1)[0].rsplit("/", 1)[-1] for p in cf.problems] == \
        ["captions.txt:3", "captions.txt:5", "captions.txt:6", "captions.txt:7"]


def test_coco_captions_naming_unreadable_images(tmp_path, rng):
    flickr(tmp_path, rng)
    data = {"images": [{"id": 1, "file_name": "ok0.png"}, {"id": 2, "file_name": "text.png"}],
            "annotations": [{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a fish"}]}
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"c.json: images\[1\]: text.png is not an image"):
        read_captions(tmp_path / "c.json")
    cf = read_captions(tmp_path / "c.json", on_error="skip")
    assert [p.name for p in cf.images] == ["ok0.png"] and cf.skipped == 2  # the image and its caption


def test_a_folder_given_as_an_image_is_named_as_a_folder(tmp_path):
    with pytest.raises(ValueError, match=rf"^{tmp_path} is a folder, not an image file$"):
        read_image(tmp_path, (8, 8))
    with pytest.raises(ValueError, match=r"^no image file"):
        read_image(tmp_path / "missing.png", (8, 8))
