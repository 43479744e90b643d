"""The segment application end to end: a tiny BiSeNet learns a two-class scene in seconds; `qkv train
segment` on scenes and on a folder, `qkv segment` (labels, --plot pictures with the ARM/FFM weights, --evaluate),
`qkv view`; the predictor against the model run by hand; option errors exit 2 with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.apps.segment import Segmenter, SegmentOptions, SegmentTask, normalize, train_defaults
from qkv.apps.segment.scenes import SegmentationData, SegmentationSplit
from qkv.cli import main
from qkv.train import train

TINY = ["--widths", "4,8,8,16", "--blocks", "1,1,1,1", "--spatial-widths", "4,4,8", "--dim", "8", "--head-dim", "8"]


def _discs(n: int, seed: int, size: int = 32) -> SegmentationSplit:
    """Bright discs of random centre and radius on a noisy background: label 1 inside, 0 outside."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    images, labels = [], []
    for _ in range(n):
        cy, cx = torch.randint(6, size - 6, (2,), generator=g).tolist()
        r = int(torch.randint(3, 9, (1,), generator=g))
        inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        x = 0.25 + 0.1 * torch.randn(size, size, generator=g) + 0.45 * inside
        images.append((x.clamp(0, 1) * 255).round().to(torch.uint8)[None])
        labels.append(inside.to(torch.uint8))
    return SegmentationSplit(torch.stack(images), torch.stack(labels), [str(i) for i in range(n)])


@pytest.mark.slow
def test_a_tiny_bisenet_learns_a_two_class_scene(one_thread):
    data = SegmentationData({"train": _discs(96, 0), "valid": _discs(16, 1), "test": _discs(32, 2)},
                            ["background", "disc"])
    options = SegmentOptions(data="x", widths=(4, 8, 8, 16), blocks=(1, 1, 1, 1), spatial_widths=(4, 4, 8), dim=8,
                             head_dim=8)
    task = SegmentTask(options, data)
    task.setup()
    torch.manual_seed(0)
    before = task.evaluate(task.build_model().eval(), "test")
    config = train_defaults(options).replace(epochs=12, batch_size=16, lr=1e-2, warmup_steps=0, progress=False)
    result = train(SegmentTask(options, data), config)
    after = result.metrics["test"]
    assert after["miou"] > 0.75 and after["iou/disc"] > 0.6, (before, after)
    assert after["miou"] > before["miou"] + 0.3 and after["loss"] < before["loss"] / 2


@pytest.fixture(scope="module")
def scenes_run(tiny_run):
    return tiny_run("segment")


@pytest.mark.slow
def test_segment_prints_labels_and_plots_the_attention(scenes_run, tmp_path, capsys):
    from PIL import Image

    image = np.zeros((40, 52), dtype=np.uint8)
    image[10:30, 5:25] = 200
    Image.fromarray(image).save(tmp_path / "odd.png")
    plots = tmp_path / "plots"
    assert main(["segment", str(scenes_run), str(tmp_path / "odd.png"), "--index", "2", "--plot", str(plots)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("odd\t52x40\t") and "%" in lines[0]
    assert any(line.startswith("test2\t64x64\t") for line in lines)
    for name in ("odd", "test2"):
        picture = Image.open(plots / f"{name}.png")
        assert f"wrote {plots / f'{name}.png'}" in lines and picture.size[0] > 800 and picture.size[1] > 500
        a = np.asarray(picture.convert("L"), dtype=np.float64)
        assert a.std() > 20  # drawn, not blank


def test_the_figure_shows_the_labels_and_weights(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from qkv.apps.segment.pictures import colorize, label_palette, segmentation_figure

    labels = torch.tensor([[0, 1], [2, 255]])
    rgb = colorize(labels, 3)
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1].tolist() == [128, 0, 0] and rgb[1, 0].tolist() == [0, 128, 0]
    assert rgb[1, 1].tolist() == [255, 255, 255]  # ignored: white
    assert len({tuple(c) for c in label_palette(21)}) == 21
    with pytest.raises(ValueError, match="label 5 outside 0..2"):
        colorize(torch.tensor([[5]]), 3)
    weights = {"arm16": torch.linspace(0, 1, 8), "ffm": torch.full((16,), 0.25)}
    fig = segmentation_figure(torch.rand(1, 10, 12), torch.randint(0, 3, (10, 12)), ["a", "b", "c"],
                              truth=labels.repeat(5, 6), attention=weights, path=tmp_path / "f.png")
    axes = fig.axes
    assert [ax.get_title() for ax in axes[:3]] == ["image", "predicted", "true"]
    assert axes[3].get_title().startswith("ARM at 1/16: 8 channels, mean 0.50")
    heights = [p.get_height() for p in axes[3].patches]
    assert heights == pytest.approx(torch.linspace(0, 1, 8).tolist())
    assert (tmp_path / "f.png").stat().st_size > 5000


@pytest.mark.slow
def test_evaluate_prints_miou_per_class_iou_and_pixel_accuracy(scenes_run, tmp_path, capsys):
    assert main(["segment", str(scenes_run), "--evaluate", "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "mIoU" in out and "pixel accuracy" in out and "| boot |" in out
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["examples"] == 8 and 0 <= m["miou"] <= 1 and "iou/background" in m
    assert main(["evaluate", str(scenes_run)]) == 0


def test_predictor_is_the_model_run_by_hand(scenes_run, gen):
    seg = Segmenter.load(scenes_run, "cpu")
    x = torch.randint(0, 256, (1, 23, 31), generator=gen, dtype=torch.uint8)
    (r,) = seg.predict([x])
    with torch.no_grad():
        logits, _, maps = seg.model(normalize(x[None], seg.mean, seg.std), return_aux=True, return_attention=True)
    assert torch.equal(r.labels, logits[0].argmax(0)) and r.labels.shape == (23, 31)
    torch.testing.assert_close(r.confidence, logits[0].softmax(0).max(0).values)
    assert set(r.attention) == {"arm16", "arm32", "ffm"}
    torch.testing.assert_close(r.attention["ffm"], maps["ffm"][0].flatten())
    with pytest.raises(ValueError, match="no images"):
        seg.predict([])
    with pytest.raises(ValueError, match=r"\(1, H, W\)"):
        seg.predict([torch.zeros(3, 8, 8)])


def test_view_shows_the_channel_attention(scenes_run, tmp_path, capsys):
    page = tmp_path / "view.html"
    assert main(["view", str(scenes_run), "--index", "1", "--out", str(page)]) == 0
    assert "3 attention modules" in capsys.readouterr().out
    html = page.read_text()
    assert "arm16" in html and "ffm" in html


def test_train_on_a_folder_and_evaluate_it(tmp_path, capsys, one_thread):
    from PIL import Image

    split = _discs(12, 5, size=24)
    for d in ("images", "labels"):
        (tmp_path / "d" / d).mkdir(parents=True)
    for i in range(12):
        Image.fromarray(split.images[i, 0].numpy()).save(tmp_path / "d" / "images" / f"{i}.png")
        Image.fromarray(split.labels[i].numpy()).save(tmp_path / "d" / "labels" / f"{i}.png")
    out = tmp_path / "run"
    assert main(["train", "segment", "--data", str(tmp_path / "d"), "--image-size", "24", "--grey", "--flip",
                 "--valid", "0.25", "--test", "0.25", *TINY, "--model", "bisenet", "--no-arm", "--max-steps", "2",
                 "--no-progress", "--out", str(out)]) == 0
    assert main(["segment", str(out), "--evaluate"]) == 0
    text = capsys.readouterr().out
    assert "split test, 3 images" in text and "| 1 |" in text
    assert set(Segmenter.load(out).predict([split.images[0, 0]])[0].attention) == {"ffm"}


@pytest.mark.parametrize("argv, message", [
    (["--no-ffm", "--context-only"], "ffm does not apply to context_only True"),
    (["--model", "fcn", "--no-arm"], "arm does not apply to model fcn"),
    (["--widths", "4,8"], "widths must be 4 numbers"),
    (["--image-size", "32"], "does not apply to data scenes"),
    (["--data", "/no/such/folder"], "no such folder"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code = main(["train", "segment", *argv, "--max-steps", "1", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("qkv: error:") and len(err.splitlines()) == 1
    assert message.split()[0] in err and not (tmp_path / "run").exists()


def test_segment_command_errors(scenes_run, tmp_path, capsys):
    assert main(["segment", str(scenes_run)]) == 2
    assert "give image files" in capsys.readouterr().err
    assert main(["segment", str(scenes_run), str(tmp_path / "missing.png")]) == 2
    assert "no image file" in capsys.readouterr().err
    assert main(["segment", str(scenes_run), "--index", "99"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["segment", str(scenes_run), "--index", "1", "--data", "scenes"]) == 2
    assert "--data goes with --evaluate" in capsys.readouterr().err


def test_padding_defaults_to_circular_on_scenes_only():
    from qkv.apps.segment import model_spec

    assert model_spec(SegmentOptions(), num_classes=7, in_channels=1)["config"]["padding"] == "circular"
    assert model_spec(SegmentOptions(data="folder"), num_classes=3, in_channels=3)["config"]["padding"] == "zeros"
    spec = model_spec(SegmentOptions(model="fcn", padding="zeros"), num_classes=7, in_channels=1)
    assert spec == {"name": "fcn", "config": {"num_classes": 7, "in_channels": 1, "widths": [64, 128, 256, 512],
                                              "blocks": [2, 2, 2, 2], "head_dim": 64, "padding": "zeros"}}
