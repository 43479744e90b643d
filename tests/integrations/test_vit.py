"""ViT image classifiers from ``transformers`` (built from a ``ViTConfig``) through qkv's backend: the weights equal
``eager``'s, and ``qkv view DIR --image FILE`` draws the class token's attention and its rollout over the patches."""

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'qkv[hf]')")

import qkv  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.integrations.transformers import register  # noqa: E402
from qkv.integrations.transformers_view import view_image_input  # noqa: E402
from tests.integrations import hf_models as hf  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    register()
    root = tmp_path_factory.mktemp("vit")
    hf.save("vit", root / "vit")
    from PIL import Image

    img = Image.new("RGB", (40, 30), (255, 255, 255))
    img.paste((200, 0, 0), (5, 5, 20, 20))
    img.save(root / "square.png")
    return root


def test_vit_attention_equals_eager(gen, one_thread):
    register()
    ours, eager = hf.model("vit", "qkv"), hf.model("vit", "eager")
    x = torch.randn(2, 3, 32, 32, generator=gen)
    with torch.no_grad(), qkv.capture_attention(ours) as records:
        logits = ours(pixel_values=x).logits
    with torch.no_grad():
        ref = eager(pixel_values=x, output_attentions=True)
    assert len(records) == 2
    for r, e in zip(records, ref.attentions, strict=True):
        torch.testing.assert_close(r.weights, e, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-4)


def test_the_class_token_and_its_rollout_over_the_patches(saved, one_thread):
    view = view_image_input(saved / "vit", saved / "square.png")
    cls = [r for r in view.records if r.kind == "pooling"]
    assert [r.name for r in cls][-1] == "class token of the rollout" and len(cls) == 3
    selfs = [r for r in view.records if r.kind == "self"]
    for r in cls:
        assert r.weights.shape[-1] == 16 and r.grid == ((1, 1), (4, 4))
    for r, s in zip(cls, selfs, strict=False):  # the rollout has no layer of its own
        torch.testing.assert_close(r.weights[0, :, 0], s.weights[0, :, 0, 1:])  # row 0, the patches
    rolled = qkv.attention_rollout([s.weights for s in selfs])
    torch.testing.assert_close(cls[-1].weights[0, 0, 0], rolled[0, 0, 1:])
    assert re.match(r"square.png: (circle|square|cross) \(0\.\d\d\)", view.title)


def test_qkv_view_of_an_image_model(saved, tmp_path, capsys, one_thread):
    out = tmp_path / "vit.html"
    assert main(["view", str(saved / "vit"), "--image", str(saved / "square.png"), "--out", str(out),
                 "--device", "cpu"]) == 0
    data = json.loads(re.search(r'id="qkv-data">(.*?)</script>', out.read_text(encoding="utf-8"), re.S).group(1))
    assert data["image"]["src"].startswith("data:image/png")
    pooled = [r for r in data["records"] if r["kind"] == "pooling"]
    assert pooled and all(r["grid"] == [4, 4] for r in pooled)
    capsys.readouterr()
    assert main(["view", str(saved / "vit"), "some text", "--out", str(out)]) == 2
    (tmp_path / "bad.png").write_bytes(b"not an image")
    assert main(["view", str(saved / "vit"), "--image", str(tmp_path / "bad.png"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--image FILE only" in err[0] and "bad.png" in err[1]
