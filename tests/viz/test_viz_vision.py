"""qkv.viz.vision: overlays, channel bars, branch weights and non-local query maps write real images; bad
shapes raise ValueError."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from qkv.viz.vision import branch_weights, channel_bars, overlay, query_map, to_image, upsample_map  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG


def test_upsample_map_is_bilinear_and_keeps_constants():
    const = upsample_map(torch.full((7, 7), 0.3), (28, 28))
    assert const.shape == (28, 28)
    np.testing.assert_allclose(const, 0.3, atol=1e-12)
    ramp = upsample_map(np.array([[0.0, 1.0]]), (1, 4))  # pixel centres: 1/4 and 3/4 of the way
    np.testing.assert_allclose(ramp, [[0.0, 0.25, 0.75, 1.0]])
    assert upsample_map(torch.rand(1, 5, 5), (5, 5)).shape == (5, 5)
    with pytest.raises(ValueError, match="spatial map"):
        upsample_map(torch.rand(2, 3, 3), (6, 6))


@pytest.mark.parametrize("shape", [(8, 9), (1, 8, 9), (3, 8, 9), (8, 9, 1), (8, 9, 3)])
def test_to_image_accepts_grey_and_colour_layouts(shape):
    img = to_image(torch.rand(shape) * 5 - 2)
    assert img.shape[:2] == (8, 9)
    assert img.min() == pytest.approx(0.0) and img.max() == pytest.approx(1.0)
    assert to_image(np.zeros((4, 4))).max() == 0.0  # a constant image does not divide by zero


def test_to_image_rejects_other_shapes():
    with pytest.raises(ValueError, match="image must be"):
        to_image(torch.rand(2, 4, 5, 5))
    with pytest.raises(ValueError, match="image must be"):
        to_image(torch.rand(4, 5, 2))


def test_overlay_writes_png(tmp_path):
    ax = overlay(torch.rand(28, 28), torch.rand(7, 7), title="stage 3", path=tmp_path / "sub" / "o.png")
    assert is_png(tmp_path / "sub" / "o.png")
    assert ax.get_title() == "stage 3"
    with pytest.raises(ValueError, match="alpha"):
        overlay(torch.rand(4, 4), torch.rand(2, 2), alpha=2.0)


def test_channel_bars_and_branch_weights_write_png(tmp_path):
    channel_bars(torch.rand(64, 1, 1), path=tmp_path / "c.png", sort=True)
    assert is_png(tmp_path / "c.png")
    w = torch.softmax(torch.randn(2, 32), dim=0)
    ax = branch_weights(w, labels=["3x3", "5x5"], path=tmp_path / "b.png")
    assert is_png(tmp_path / "b.png")
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"3x3 ({w[0].mean():.2f})", f"5x5 ({w[1].mean():.2f})"]
    with pytest.raises(ValueError, match="labels for 2 branches"):
        branch_weights(w, labels=["3x3"])
    with pytest.raises(ValueError, match="at least one"):
        channel_bars(torch.empty(0))


def test_query_map_takes_the_query_row(tmp_path):
    h = w = 4
    attn = torch.zeros(h * w, h * w)
    attn[5] = torch.arange(16.0) / 120  # the row of feature pixel (1, 1)
    ax = query_map(torch.rand(8, 8), attn, (2, 3), key_shape=(4, 4), query_shape=(4, 4), path=tmp_path / "q.png")
    assert is_png(tmp_path / "q.png")
    heat = ax.images[-1].get_array()
    np.testing.assert_allclose(np.asarray(heat), upsample_map(attn[5].reshape(4, 4), (8, 8)))
    with pytest.raises(ValueError, match="outside"):
        query_map(torch.rand(8, 8), attn[5], (8, 0), key_shape=(4, 4))
    with pytest.raises(ValueError, match="do not fill"):
        query_map(torch.rand(8, 8), attn[5], (0, 0), key_shape=(2, 2))
    with pytest.raises(ValueError, match="query_shape"):
        query_map(torch.rand(8, 8), attn, (0, 0), key_shape=(4, 4))
