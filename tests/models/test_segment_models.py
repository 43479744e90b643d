"""BiSeNet V1, its ablations and the FCN baseline: logits at the input's size for odd sizes, the paths at
their strides, each ablation without its block (no module, no parameter) and exactly the full network with that
block made the identity; the attention maps returned are those capture_attention records; and the segmentation
metrics against a hand-computed confusion matrix and a brute-force count."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qkv
from qkv.metrics import confusion_matrix, segmentation_metrics
from qkv.models import create
from qkv.models.bisenet import BiSeNet
from qkv.vision import AttentionRefinement, FeatureFusion

TINY = {"widths": [4, 8, 8, 16], "blocks": [1, 1, 1, 1], "spatial_widths": [4, 4, 8], "dim": 8, "head_dim": 8}
VARIANTS = {"bisenet": {}, "noarm": {"arm": False}, "noffm": {"ffm": False}, "context": {"spatial": False}}


def tiny(name="bisenet", **kw):
    torch.manual_seed(0)
    config = {**TINY, **kw} if name == "bisenet" else {k: TINY[k] for k in ("widths", "blocks", "head_dim")}
    return create(name, num_classes=5, in_channels=3, **config).eval()


@pytest.mark.parametrize("size", [(37, 53), (64, 64), (9, 17), (1, 1)])
@pytest.mark.parametrize("variant", [*VARIANTS, "fcn"])
def test_logits_at_the_input_size(variant, size, gen):
    model = tiny("fcn") if variant == "fcn" else tiny(**VARIANTS[variant])
    x = torch.randn(2, 3, *size, generator=gen)
    logits = model(x)
    assert logits.shape == (2, 5, *size) and torch.isfinite(logits).all()
    out, aux = model(x, return_aux=True)
    assert torch.equal(out, logits) and all(a.shape == logits.shape for a in aux)
    assert len(aux) == (0 if variant == "fcn" else 2)


def _out(h, stride):
    """A stride-2 3x3 (padding 1) or 7x7 (padding 3) convolution, or 3x3 max-pool (padding 1): ceil(h / 2)."""
    for _ in range(int(math.log2(stride))):
        h = (h + 1) // 2
    return h


def test_paths_run_at_their_strides(gen):
    model = tiny()
    x = torch.randn(1, 3, 37, 53, generator=gen)
    s = model.spatial_path(x)
    c8, c16 = model.context_path(x)
    f8, f16, f32 = model.backbone(x)
    assert s.shape[-2:] == c8.shape[-2:] == f8.shape[-2:] == (_out(37, 8), _out(53, 8)) == (5, 7)
    assert c16.shape[-2:] == f16.shape[-2:] == (_out(37, 16), _out(53, 16))
    assert f32.shape[-2:] == (_out(37, 32), _out(53, 32)) == (2, 2)
    assert s.shape[1] == 8 and c8.shape[1] == c16.shape[1] == 8


def _has(model, cls):
    return any(isinstance(m, cls) for m in model.modules())


def test_each_ablation_removes_its_block():
    full, noarm, noffm, context = (tiny(**VARIANTS[v]) for v in VARIANTS)
    assert _has(full, AttentionRefinement) and _has(full, FeatureFusion)
    assert not _has(noarm, AttentionRefinement) and _has(noarm, FeatureFusion)
    assert _has(noffm, AttentionRefinement) and not _has(noffm, FeatureFusion)
    assert not _has(context, FeatureFusion) and context.spatial_path is None
    names = {k: {n for n, _ in m.named_parameters()} for k, m in
             (("full", full), ("noarm", noarm), ("noffm", noffm), ("context", context))}
    assert {n for n in names["full"] if n.startswith("arm")} and not {n for n in names["noarm"] if "arm" in n}
    assert names["full"] - names["noarm"] == {n for n in names["full"] if n.startswith("arm")}
    assert not {n for n in names["noffm"] if n.startswith("ffm")}
    assert not {n for n in names["context"] if n.startswith(("ffm", "spatial_path"))}
    count = {k: sum(p.numel() for p in m.parameters()) for k, m in
             (("full", full), ("noarm", noarm), ("noffm", noffm), ("context", context))}
    assert count["noarm"] == count["full"] - sum(p.numel() for p in full.arm16.parameters()) * 2
    assert count["context"] < count["noffm"] < count["full"]


class _IdentityGate(nn.Module):
    """What an ARM is reduced to when its gate is always 1: the identity."""

    def forward(self, x, *, return_attention=False):
        return (x, torch.ones(*x.shape[:2], 1, 1)) if return_attention else x


def test_the_no_arm_network_is_the_full_one_with_identity_arms(gen):
    full, noarm = tiny(), tiny(arm=False)
    missing, unexpected = noarm.load_state_dict(full.state_dict(), strict=False)
    assert not missing and unexpected and all(k.startswith(("arm16.", "arm32.")) for k in unexpected)
    x = torch.randn(2, 3, 40, 40, generator=gen)
    with torch.no_grad():
        assert not torch.allclose(full(x), noarm(x))  # the ARMs change the output
        full.arm16, full.arm32 = _IdentityGate(), _IdentityGate()
        torch.testing.assert_close(full(x), noarm(x))


def test_the_no_ffm_network_feeds_the_concatenation_to_the_head(gen):
    model = tiny(ffm=False)
    x = torch.randn(2, 3, 33, 41, generator=gen)
    with torch.no_grad():
        c8, _ = model.context_path(x)
        joined = torch.cat([model.spatial_path(x), c8], dim=1)
        torch.testing.assert_close(model(x), model.head(joined, x.shape[-2:]))
        assert not torch.allclose(model(x), tiny()(x))


def test_attention_maps_are_what_capture_records(gen):
    model = tiny()
    x = torch.randn(3, 3, 48, 40, generator=gen)
    with torch.no_grad(), qkv.capture_attention(model) as records:
        logits, aux, maps = model(x, return_aux=True, return_attention=True)
    assert list(maps) == ["arm16", "arm32", "ffm"] and len(aux) == 2
    by_name = {r.name: r for r in records}
    assert set(by_name) == {"arm16", "arm32", "ffm"} and {r.kind for r in records} == {"channel"}
    for name, w in maps.items():
        assert w.shape == (3, 16 if name == "ffm" else 8, 1, 1) and ((w > 0) & (w < 1)).all()
        torch.testing.assert_close(by_name[name].weights, w.flatten(1))
    assert tiny("fcn")(x, return_attention=True)[1] == {}


def test_bad_configurations_are_value_errors():
    with pytest.raises(ValueError, match="needs the spatial path"):
        BiSeNet(3, spatial=False, ffm=False)
    with pytest.raises(ValueError, match="widths must be 4"):
        create("bisenet", num_classes=3, widths=[4, 8])
    with pytest.raises(ValueError, match="num_classes"):
        create("fcn", num_classes=1)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        tiny()(torch.zeros(3, 8, 8))


def test_full_width_bisenet_and_fcn_are_of_similar_size():
    b = sum(p.numel() for p in create("bisenet", num_classes=19).parameters())
    f = sum(p.numel() for p in create("fcn", num_classes=19).parameters())
    assert 0.8 < f / b < 1.2 and 12e6 < b < 14e6  # ResNet-18's 11.2M backbone and the heads


# --- metrics -----------------------------------------------------------------------------------------------------

def test_confusion_matrix_and_iou_by_hand():
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 255, 1]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 0, 2, 0]])
    c = confusion_matrix(pred, target, 3, ignore_index=255)
    assert c.tolist() == [[1, 1, 0], [1, 2, 0], [1, 0, 1]]  # rows: true class; the ignored pixel not counted
    m = segmentation_metrics(c, ["bg", "a", "b"])
    # IoU = TP / (TP + FP + FN): bg 1 / (1 + 2 + 1), a 2 / (2 + 1 + 1), b 1 / (1 + 0 + 1)
    assert m["iou/bg"] == pytest.approx(1 / 4) and m["iou/a"] == pytest.approx(1 / 2)
    assert m["iou/b"] == pytest.approx(1 / 2)
    assert m["miou"] == pytest.approx((1 / 4 + 1 / 2 + 1 / 2) / 3)
    assert m["pixel_accuracy"] == pytest.approx(4 / 7) and m["pixels"] == 7


def test_a_class_absent_and_never_predicted_is_left_out_of_the_mean():
    c = confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), 3)
    m = segmentation_metrics(c)
    assert math.isnan(m["iou/2"]) and m["miou"] == pytest.approx((1 / 2 + 1 / 2) / 2)


def test_metrics_against_a_brute_force_count(gen):
    k = 4
    target = torch.randint(0, k + 1, (3, 9, 11), generator=gen)
    target[target == k] = 255
    pred = torch.randint(0, k, (3, 9, 11), generator=gen)
    m = segmentation_metrics(confusion_matrix(pred, target, k, ignore_index=255))
    pairs = [(int(t), int(p)) for t, p in zip(target.flatten(), pred.flatten(), strict=True) if t != 255]
    ious = []
    for c in range(k):
        tp = sum(t == c and p == c for t, p in pairs)
        union = sum(t == c or p == c for t, p in pairs)
        ious.append(tp / union)
        assert m[f"iou/{c}"] == pytest.approx(tp / union)
    assert m["miou"] == pytest.approx(sum(ious) / k)
    assert m["pixel_accuracy"] == pytest.approx(sum(t == p for t, p in pairs) / len(pairs))


def test_labels_outside_the_classes_are_errors():
    with pytest.raises(ValueError, match="target label outside 0..2"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0, 7]), 3, ignore_index=255)
    with pytest.raises(ValueError, match="differ in shape"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0]), 3)


def test_circular_padding_makes_the_features_shift_with_the_canvas(gen):
    """Shifting a 64x64 canvas by one scene cell (32 pixels, the backbone's stride) shifts every feature map by as
    many cells: with circular padding no feature can tell where it is; with zeros the borders tell."""
    x = torch.randn(2, 3, 64, 64, generator=gen)
    shifted = x.roll(32, dims=-1)
    circular, zeros = tiny(padding="circular"), tiny()
    with torch.no_grad():
        for f, g, stride in zip(circular.backbone(x), circular.backbone(shifted), (8, 16, 32), strict=True):
            torch.testing.assert_close(f.roll(32 // stride, dims=-1), g)
        torch.testing.assert_close(circular.spatial_path(x).roll(4, dims=-1), circular.spatial_path(shifted))
        f8, g8 = zeros.backbone(x)[0], zeros.backbone(shifted)[0]
        assert not torch.allclose(f8.roll(4, dims=-1), g8, atol=1e-3)
    with pytest.raises(ValueError, match="padding must be one of zeros, circular"):
        tiny(padding="reflect")
