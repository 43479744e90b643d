"""The images task end to end: `qkv train images` on scikit-learn's digits (and Fashion-MNIST when installed),
the library (options, model spec, `ImageClassifier`), checkpoints, exact resume with augmentation,
`qkv show-attention` for every kind of map, and clear errors."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from qkv.apps import ViewInput, application, application_of, load_predictor  # noqa: E402
from qkv.apps.base import model_from_spec
from qkv.apps.images import (  # noqa: E402
    ImageClassifier,
    ImageOptions,
    ImageTask,
    load_data,
    model_spec,
    train_defaults,
)
from qkv.apps.sentiment import SentimentClassifier  # noqa: E402
from qkv.capture import AttentionRecord  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.data.idx import FASHION_MNIST_ROOT, write_idx  # noqa: E402
from qkv.data.images import ImageData, load_image_splits, normalize, random_shift_flip, read_image  # noqa: E402
from qkv.models import create, resnet18  # noqa: E402
from qkv.train import TrainConfig, load_model, train  # noqa: E402
from qkv.train.checkpoint import load_weights  # noqa: E402
from tests.helpers import single_thread

PNG = b"\x89PNG\r\n\x1a\n"
FAST = ["--no-progress", "--batch-size", "32"]


def _fashion_mnist_installed() -> bool:
    return all((Path(FASHION_MNIST_ROOT) / f"{p}-{k}-idx{n}-ubyte.gz").is_file()
               for p in ("train", "t10k") for k, n in (("images", 3), ("labels", 1)))


needs_fashion_mnist = pytest.mark.skipif(
    not _fashion_mnist_installed(),
    reason=f"Fashion-MNIST is not installed in {FASHION_MNIST_ROOT} (apt-get install dataset-fashion-mnist)")


pytestmark = pytest.mark.usefixtures("one_thread")  # small convolutions run fastest on one thread


def final_metrics(out: Path) -> dict[str, dict[str, float]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["split"]: r["metrics"] for r in records if r["event"] == "final"}


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG


def from_spec(config: dict) -> torch.nn.Module:
    """A checkpoint config's model, built from its model entry with `qkv.models.create` alone."""
    return create(config["model"]["name"], **config["model"]["config"])


def same_architecture(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return type(a) is type(b) and \
        {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


def write_idx_folder(root: Path, sizes: dict[str, int], side: int = 12, seed: int = 0) -> Path:
    """An MNIST-style IDX folder of three classes (brightness decides), ``sizes`` = images per file prefix."""
    g = torch.Generator().manual_seed(seed)
    root.mkdir()
    for prefix, n in sizes.items():
        labels = torch.arange(n, dtype=torch.uint8) % 3
        labels = labels[torch.randperm(n, generator=g)]
        images = (labels[:, None, None] * 80 + torch.randint(0, 30, (n, side, side), generator=g)).to(torch.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte", labels)
    return root


# --------------------------------------------------------------------------------------------- data

def test_digits_splits_are_deterministic_disjoint_and_complete():
    a = load_data(ImageOptions(data="digits"))
    b = load_image_splits("digits")  # the data helper the options describe
    c = load_data(ImageOptions(data="digits", data_seed=1))
    assert isinstance(a, ImageData)
    sizes = {s: len(a.splits[s][1]) for s in ("train", "valid", "test")}
    assert sum(sizes.values()) == 1797 and sizes["test"] == round(0.2 * 1797)
    assert a.image_size == (16, 16) and a.class_names == [str(i) for i in range(10)]
    for s in ("train", "valid", "test"):
        assert torch.equal(a.splits[s][0], b.splits[s][0])
        assert a.splits[s][0].dtype == torch.uint8
    assert not torch.equal(a.splits["test"][0], c.splits["test"][0])
    # no image appears in two splits (digits has a few exact duplicates, so compare by count)
    flat = {s: {bytes(x.flatten().tolist()) for x in a.splits[s][0]} for s in a.splits}
    everything = {bytes(x.flatten().tolist()) for s in a.splits for x in a.splits[s][0]}
    assert len(everything) == len(flat["train"] | flat["valid"] | flat["test"])
    # a tiny valid fraction still holds out one image (no empty split)
    tiny = load_data(ImageOptions(data="digits", valid=1e-4))
    assert {s: len(tiny.splits[s][1]) for s in tiny.splits} == {"train": 1437, "valid": 1, "test": 359}


def test_random_shift_flip_moves_images_within_the_shift():
    torch.manual_seed(0)
    x = torch.zeros(64, 12, 12, dtype=torch.uint8)
    x[:, 5, 6] = 255  # one bright pixel per image
    out = random_shift_flip(x, shift=2, flip=False)
    assert out.shape == x.shape and out.dtype == torch.uint8
    ys, xs = (out == 255).nonzero()[:, 1], (out == 255).nonzero()[:, 2]
    assert len(ys) == 64 and set(ys.tolist()) <= set(range(3, 8)) and set(xs.tolist()) <= set(range(4, 9))
    assert len(set(zip(ys.tolist(), xs.tolist(), strict=True))) > 10  # many different shifts
    flipped = random_shift_flip(x, shift=0, flip=True)
    cols = (flipped == 255).nonzero()[:, 2]
    assert set(cols.tolist()) == {6, 5} and 10 < (cols == 5).sum() < 54  # 11 - 6 = 5 when flipped
    assert torch.equal(random_shift_flip(x, shift=0), x)
    torch.manual_seed(1)
    first = random_shift_flip(x, 2, True)
    torch.manual_seed(1)
    assert torch.equal(random_shift_flip(x, 2, True), first)  # only the torch RNG: reproducible


def test_normalize_shapes_and_scales():
    x = torch.tensor([[[0, 255]]], dtype=torch.uint8)
    out = normalize(x, 0.5, 0.25)
    assert out.shape == (1, 1, 1, 2)
    torch.testing.assert_close(out, torch.tensor([[[[-2.0, 2.0]]]]))
    torch.testing.assert_close(normalize(x.float() / 255, 0.5, 0.25), out)


def test_options_errors_are_clear():
    with pytest.raises(ValueError, match="unknown vision block 'fancy'"):
        ImageOptions(attn="fancy")
    with pytest.raises(ValueError, match="fuses two paths"):
        ImageOptions(attn="ffm")
    with pytest.raises(ValueError, match="needs data_root"):
        ImageOptions(data="mnist")
    with pytest.raises(ValueError, match="valid must be <= 0.9"):
        ImageOptions(valid=1.0)
    with pytest.raises(ValueError, match="valid must be > 0"):
        ImageOptions(valid=0.0)
    with pytest.raises(ValueError, match="need an attention block"):
        ImageOptions(attn_kwargs={"reduction": 4})
    assert ImageOptions(attn="Non-Local").attn == "non_local"
    assert ImageOptions().augmentation == "flip" and ImageOptions(data="digits").augmentation == "none"
    # an option set for a model (or data) it does not apply to is an error, never silently ignored
    for kwargs, message in ((dict(arch="resnet18", widths=(8, 8, 8)), "widths does not apply to arch resnet18"),
                            (dict(arch="resnet18", dropout=0.2), "dropout does not apply to arch resnet18"),
                            (dict(stem="imagenet"), "stem does not apply to arch small-cnn"),
                            (dict(data="digits", data_root="x"), "data_root does not apply to data digits"),
                            (dict(augment="none", shift=3), "shift does not apply to augment none"),
                            (dict(test=0.3), "test does not apply to data fashion-mnist")):
        with pytest.raises(ValueError, match=message):
            ImageOptions(**kwargs)
    assert ImageOptions(arch="resnet18", stem="imagenet").stem == "imagenet"


def test_resnet_cifar_stem_keeps_small_images_large():
    opts = ImageOptions(data="digits", arch="resnet18", attn="se")
    task = ImageTask(opts)
    task.setup()
    model = task.build_model()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.in_channels == 1
    feats = model.forward_features(torch.randn(2, 1, 16, 16))
    assert feats.shape == (2, 512, 2, 2)  # 16 -> 16, 8, 4, 2 (the ImageNet stem would give 1x1 at stage 3)
    config = json.loads(json.dumps(task.config()))
    assert config["model"]["name"] == "resnet18" and config["model"]["config"]["stem"] == "cifar"
    again = from_spec(config)
    assert again.conv1.kernel_size == (3, 3) and same_architecture(again, model)
    plain = resnet18(num_classes=10, in_channels=1, attn="se", stem="cifar")
    assert plain.conv1.kernel_size == (3, 3) and isinstance(plain.maxpool, torch.nn.Identity)
    assert same_architecture(plain, model)
    imagenet = resnet18(num_classes=10, in_channels=1, stem="imagenet")
    assert imagenet.conv1.kernel_size == (7, 7) and imagenet.conv1.stride == (2, 2)


@pytest.mark.parametrize("options", [
    ImageOptions(data="digits", attn="cbam", widths=(16, 24, 32), dropout=0.2),
    ImageOptions(data="digits", attn="se", attn_kwargs={"reduction": 4}),
    ImageOptions(data="digits", arch="resnet18", attn="eca", stem="imagenet"),
    ImageOptions(data="digits", arch="resnet18"),
], ids=["small-cnn-cbam", "small-cnn-se-kwargs", "resnet18-imagenet", "resnet18-plain"])
def test_build_model_is_the_spec(options):
    spec = model_spec(options, num_classes=7)
    assert spec["name"] == options.arch and json.loads(json.dumps(spec)) == spec  # JSON only
    cfg = spec["config"]
    assert cfg["num_classes"] == 7 and cfg["in_channels"] == 1
    assert cfg["attn"] == (None if options.attn == "none" else options.attn)
    assert cfg["attn_kwargs"] == (options.attn_kwargs or None)
    if options.arch == "small-cnn":
        assert cfg["widths"] == list(options.widths) and cfg["dropout"] == options.dropout and "stem" not in cfg
    else:
        assert cfg["stem"] == options.stem and "widths" not in cfg
    model = model_from_spec(model_spec(options, num_classes=7))
    assert same_architecture(model, create(spec["name"], **cfg))
    assert same_architecture(model, from_spec({"model": spec}))


def test_channels_last_is_a_memory_layout_not_another_model():
    cl = ImageTask(ImageOptions(data="digits", attn="cbam"))
    cl.setup()
    plain = ImageTask(ImageOptions(data="digits", attn="cbam", channels_last=False), data=cl.data)
    plain.setup()
    model_cl = cl.build_model()
    conv = model_cl.stages[1][0][0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    model_plain = plain.build_model()
    assert model_plain.stages[1][0][0].weight.is_contiguous()
    model_plain.load_state_dict(model_cl.state_dict())
    examples = [plain.train_examples()[i] for i in range(8)]
    torch.manual_seed(0)
    x_cl, y = cl.collate(examples)
    torch.manual_seed(0)
    x, y2 = plain.collate(examples)
    assert x_cl.is_contiguous(memory_format=torch.channels_last) and x.is_contiguous()
    assert torch.equal(x_cl, x) and torch.equal(y, y2)  # same values, same augmentation draws
    model_cl.eval(), model_plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(model_cl(x_cl), model_plain(x), rtol=1e-4, atol=1e-5)
        acc_cl, acc = (t.evaluate(m, "test")["accuracy"] for t, m in ((cl, model_cl), (plain, model_plain)))
    assert acc_cl == pytest.approx(acc, abs=2 / len(cl.data.splits["test"][1]))


def test_flip_tta_averages_the_probabilities_of_each_image_and_its_mirror():
    task = ImageTask(ImageOptions(data="digits", tta="flip"))
    task.setup()
    torch.manual_seed(1)
    model = task.build_model().eval()
    with torch.no_grad():
        model.fc.weight.mul_(50.0)  # confident, so that averaging with the mirror changes the loss visibly
    images, labels = task.data.splits["test"]
    x = normalize(images, task.mean, task.std)
    with torch.no_grad():
        probs = (model(x).double().softmax(-1) + model(x.flip(-1)).double().softmax(-1)) / 2
        got = task.evaluate(model, "test")
    assert got["accuracy"] == pytest.approx(float((probs.argmax(-1) == labels).double().mean()),
                                            abs=1 / len(labels))  # a near tie may break the other way in float32
    assert got["loss"] == pytest.approx(float(-probs[torch.arange(len(labels)), labels].log().mean()), rel=1e-4)
    plain = ImageTask(ImageOptions(data="digits"), data=task.data)
    plain.setup()
    with torch.no_grad():
        assert plain.evaluate(model, "test")["loss"] != pytest.approx(got["loss"], rel=1e-4)
    with pytest.raises(ValueError, match="tta must be one of none, flip"):
        ImageOptions(tta="rotate")


# --------------------------------------------------------------------------------------------- training

@pytest.mark.slow
def test_digits_cbam_reaches_85_percent_in_one_epoch(tmp_path, capsys, caplog):
    out = tmp_path / "cbam"
    with caplog.at_level(logging.INFO, logger="qkv.apps.images.task"):  # the size of the model is logged (-v)
        rc = main(["train", "images", "--data", "digits", "--attn", "cbam", "--epochs", "1", "--out", str(out),
                   *FAST])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "test: accuracy" in printed
    assert re.search(r"small-cnn with attention cbam: [\d,]+ parameters", caplog.text)
    metrics = final_metrics(out)
    assert metrics["test"]["accuracy"] >= 0.85, metrics
    assert metrics["valid"]["accuracy"] >= 0.85, metrics
    assert (out / "best" / "model.safetensors").is_file()


@pytest.mark.slow
def test_checkpoint_round_trip_gives_identical_logits(tmp_path):
    opts = ImageOptions(data="digits", attn="sk")
    task = ImageTask(opts)
    run = tmp_path / "run"
    result = train(task, TrainConfig(max_steps=4, eval_every=2, batch_size=32, out=str(run), monitor="accuracy",
                                     progress=False))
    model, ckpt = load_model(run, from_spec, task="images")  # best/ (evaluations at steps 2 and 4 chose it)
    assert ckpt.path.name == "best" and ckpt.version == 2
    config = ckpt.config
    assert config["model"]["name"] == "small-cnn" and config["model"]["config"]["attn"] == "sk"
    assert config["options"]["attn"] == "sk" and config["image_size"] == [16, 16]
    assert config["model"] == model_spec(opts, num_classes=10)
    # the model entry alone rebuilds the trained model: `create`, then the weights of best/model.safetensors
    rebuilt = create(config["model"]["name"], **config["model"]["config"])
    rebuilt.load_state_dict(load_weights(run / "best" / "model.safetensors"))
    rebuilt.eval()
    x = normalize(task.data.splits["test"][0][:50], config["mean"], config["std"])
    result.model.eval()
    for m in (model, rebuilt):
        m.to(memory_format=torch.channels_last)  # the layout it was trained in (a layout, not a weight)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert torch.equal(model(x), result.model(x))
        assert torch.equal(rebuilt(x), result.model(x))
    with pytest.raises(ValueError, match="not a 'translate' one"):
        load_model(run, from_spec, task="translate")
    with pytest.raises(ValueError, match="holds a 'images' model, not a 'sentiment' one"):
        SentimentClassifier.load(run)


def test_resume_with_augmentation_is_exact(tmp_path):
    common = ["train", "images", "--data", "digits", "--augment", "shift-flip", "--attn", "se", "--epochs", "2",
              *FAST]
    assert main([*common, "--out", str(tmp_path / "straight"), "--max-steps", "8"]) == 0
    assert main([*common, "--out", str(tmp_path / "resumed"), "--max-steps", "4"]) == 0
    assert main([*common, "--out", str(tmp_path / "resumed"), "--max-steps", "8", "--resume"]) == 0
    log = events(tmp_path / "resumed")
    assert [e["event"] for e in log if e["event"] in ("start", "resume")] == ["start", "resume"]
    assert log[-1]["global_step"] == 8
    a = load_weights(tmp_path / "straight" / "checkpoint" / "model.safetensors")
    b = load_weights(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_any_mnist_style_idx_folder(tmp_path):
    root = write_idx_folder(tmp_path / "idx", {"train": 60, "t10k": 20})
    out = tmp_path / "run"
    assert main(["train", "images", "--data", "mnist", "--data-root", str(root), "--max-steps", "2", "--out",
                 str(out), "--attn", "eca", *FAST]) == 0
    config = json.loads((out / "checkpoint" / "config.json").read_text())["config"]
    assert config["class_names"] == ["0", "1", "2"] and config["image_size"] == [12, 12]
    assert config["options"]["augment"] == "auto"
    assert ImageOptions(**config["options"]).augmentation == "shift"  # never flip digits
    # the trainer's settings not given are the task's presets (train_defaults)
    start = events(out)[0]
    assert start["event"] == "start"
    preset = train_defaults(ImageOptions(**config["options"]))
    for name in ("lr", "weight_decay", "schedule", "warmup_steps", "epochs", "monitor"):
        assert start["train_config"][name] == getattr(preset, name), name
    assert start["train_config"]["max_steps"] == 2 and start["train_config"]["batch_size"] == 32


def test_data_too_small_to_split_is_a_one_line_error(tmp_path, capsys):
    root = write_idx_folder(tmp_path / "idx", {"train": 1, "t10k": 2})
    with pytest.raises(ValueError, match="1 training and 2 test images"):
        load_data(ImageOptions(data="mnist", data_root=str(root)))
    out = tmp_path / "run"
    assert main(["train", "images", "--data", "mnist", "--data-root", str(root), "--max-steps", "2", "--out",
                 str(out), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and "\n" not in err, err
    assert "1 training and 2 test images" in err and "valid (0.1)" in err
    assert not (out / "best").exists() and not (out / "checkpoint").exists()
    assert not list(tmp_path.rglob("model.safetensors"))


# --------------------------------------------------------------------------------------------- show-attention

EXPECTED = {"cbam": ("spatial", "channel"), "se": ("channel",), "sk": ("sk",), "non_local": ("nonlocal",)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A briefly trained digits model per kind of attention."""
    root = tmp_path_factory.mktemp("models")
    with single_thread():
        for attn in EXPECTED:
            assert main(["train", "images", "--data", "digits", "--attn", attn, "--max-steps", "3", "--out",
                         str(root / attn), *FAST]) == 0
    return root


@pytest.fixture
def digit_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.datasets import load_digits

    path = tmp_path / "my digit.png"
    plt.imsave(path, load_digits().images[7], cmap="gray")  # an RGBA PNG, 8x8
    return path


@pytest.mark.parametrize("attn", list(EXPECTED))
@pytest.mark.slow
def test_show_attention_writes_pngs(trained, attn, digit_png, tmp_path, capsys):
    out = tmp_path / "pictures"
    rc = main(["show-attention", str(trained / attn), str(digit_png), "--index", "0", "--index", "12", "--out",
               str(out), *(["--query-pixel", "3,9"] if attn == "non_local" else [])])
    assert rc == 0
    printed = capsys.readouterr().out
    names = ["my digit", "test0", "test12"]
    for name in names:
        for kind in EXPECTED[attn]:
            path = out / f"{name}-{kind}.png"
            assert is_png(path), path
            assert f"wrote {path}" in printed
    assert "(true: " in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}-{k}.png" for n in names for k in EXPECTED[attn])


@pytest.mark.slow
def test_show_attention_never_overwrites_images_of_the_same_name(trained, tmp_path, capsys):
    import matplotlib.pyplot as plt
    from sklearn.datasets import load_digits

    paths = [tmp_path / "a" / "x.png", tmp_path / "b" / "x.png"]
    for path, k in zip(paths, (3, 8), strict=True):
        path.parent.mkdir()
        plt.imsave(path, load_digits().images[k], cmap="gray")  # two different digits
    out = tmp_path / "pictures"
    assert main(["show-attention", str(trained / "cbam"), *map(str, paths), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 2 * len(EXPECTED["cbam"])  # one set per image, none overwritten
    assert written == sorted(f"{n}-{k}.png" for n in ("x", "x-2") for k in EXPECTED["cbam"])
    for kind in EXPECTED["cbam"]:
        first, second = out / f"x-{kind}.png", out / f"x-2-{kind}.png"
        assert is_png(first) and is_png(second) and first.read_bytes() != second.read_bytes()
        assert f"wrote {first}" in printed and f"wrote {second}" in printed  # and it says where each went
    assert printed.startswith("x: ") and "\nx-2: " in printed


def test_read_image_converts_to_grey_at_the_model_size(digit_png):
    x = read_image(digit_png, (16, 16))
    assert x.shape == (16, 16) and x.min() >= 0.0 and x.max() <= 1.0
    torch.testing.assert_close(read_image(digit_png, (16, 16), invert=True), 1.0 - x)


@pytest.mark.slow
def test_image_classifier_predicts_and_attends_as_the_model(trained, digit_png):
    clf = ImageClassifier.load(trained / "cbam")
    assert clf.options.attn == "cbam" and clf.image_size == (16, 16) and clf.class_names == [str(i) for i in range(10)]
    images, labels = clf.test_images()
    want_images, want_labels = load_data(clf.options).splits["test"]
    assert torch.equal(images, want_images) and torch.equal(labels, want_labels) and len(labels) == 359
    x = images[:24]
    with torch.no_grad():
        logits, maps = clf.model(normalize(x, clf.mean, clf.std), return_attention=True)
    probs = logits.softmax(-1)
    predictions = clf.predict(x)
    assert [p.label for p in predictions] == [clf.class_names[int(k)] for k in probs.argmax(-1)]
    for p, row in zip(predictions, probs, strict=True):
        assert p.probability == pytest.approx(float(row.max()), abs=1e-6)
        assert list(p.probabilities) == clf.class_names
        assert [p.probabilities[n] for n in clf.class_names] == pytest.approx(row.tolist(), abs=1e-6)
    as_float = clf.predict(x.float() / 255.0)  # uint8 or [0, 1] floats: the same pictures
    assert [p.probabilities for p in as_float] == [pytest.approx(p.probabilities, abs=1e-6) for p in predictions]

    view = clf.attention(x)
    torch.testing.assert_close(view.probabilities, probs)
    assert set(view.spatial) == {f"{name}.spatial" for name in maps}
    assert set(view.channel) == {f"{name}.channel" for name in maps}
    for name, m in maps.items():
        torch.testing.assert_close(view.spatial[f"{name}.spatial"], m.spatial[:, 0])
        torch.testing.assert_close(view.channel[f"{name}.channel"], m.channel.flatten(1))
    assert not view.branches and not view.non_local

    picture = clf.read(digit_png)
    assert torch.equal(picture, read_image(digit_png, (16, 16)))
    torch.testing.assert_close(clf.read(digit_png, invert=True), 1.0 - picture)
    (p,) = clf.predict(picture[None])
    with torch.no_grad():
        row = clf.model(normalize(picture[None], clf.mean, clf.std)).softmax(-1)[0]
    assert p.label == clf.class_names[int(row.argmax())] and p.probability == pytest.approx(float(row.max()))
    with pytest.raises(ValueError, match=r"images must be \(N, 16, 16\)"):
        clf.predict(x[:, :8, :8])
    with pytest.raises(ValueError, match="images must be"):
        clf.attention(x[0])


@pytest.mark.parametrize("attn", ["sk", "non_local"])
@pytest.mark.slow
def test_image_classifier_attention_of_3d_maps(trained, attn):
    clf = ImageClassifier.load(trained / attn)
    x = clf.test_images()[0][:4]
    with torch.no_grad():
        logits, maps = clf.model(normalize(x, clf.mean, clf.std), return_attention=True)
    view = clf.attention(x)
    torch.testing.assert_close(view.probabilities, logits.softmax(-1))
    got = view.branches if attn == "sk" else view.non_local
    assert got and set(got) == set(maps)
    for name, m in maps.items():
        torch.testing.assert_close(got[name], m)
    if attn == "sk":
        assert all(len(view.branch_labels[n]) == m.shape[1] for n, m in got.items())
    else:
        assert all(h * w == m.shape[1] and kh * kw == m.shape[2] for n, m in got.items()
                   for (h, w), (kh, kw) in [view.grids[n]])


def test_show_attention_errors(trained, tmp_path, capsys):
    ckpt = str(trained / "cbam")
    assert main(["show-attention", ckpt, str(tmp_path / "missing.png"), "--out", str(tmp_path)]) == 2
    assert "no image file" in capsys.readouterr().err
    assert main(["show-attention", ckpt, "--index", "100000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--index 100000 is out of range" in err and "359 images" in err
    assert main(["show-attention", ckpt, "--index", "0", "--query-pixel", "40,1", "--out", str(tmp_path)]) == 2
    assert "outside the model's 16x16 input" in capsys.readouterr().err
    assert main(["show-attention", ckpt, "--out", str(tmp_path)]) == 2
    assert "give image files" in capsys.readouterr().err
    (tmp_path / "bad.png").write_bytes(b"not a picture")
    assert main(["show-attention", ckpt, str(tmp_path / "bad.png"), "--out", str(tmp_path)]) == 2
    assert "cannot read image" in capsys.readouterr().err
    assert main(["show-attention", str(tmp_path / "nowhere"), "--index", "0"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_train_errors(tmp_path, capsys):
    assert main(["train", "images", "--data", "digits", "--attn", "fancy", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown vision block 'fancy'" in err and "cbam" in err
    assert main(["train", "images", "--data", "fashion-mnist", "--data-root", str(tmp_path), "--max-steps", "1"]) == 2
    assert "Fashion-MNIST not found" in capsys.readouterr().err
    assert main(["train", "images", "--data", "digits", "--attn-arg", "reduction"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "images", "--arch", "vgg"])


def test_model_without_attention_has_nothing_to_show(tmp_path, capsys):
    out = tmp_path / "plain"
    assert main(["train", "images", "--data", "digits", "--max-steps", "1", "--out", str(out), *FAST]) == 0
    assert main(["show-attention", str(out), "--index", "0", "--out", str(tmp_path / "p")]) == 2
    assert "no attention maps" in capsys.readouterr().err
    clf = ImageClassifier.load(out)
    x = clf.test_images()[0][:3]
    assert len(clf.predict(x)) == 3  # it still predicts
    with pytest.raises(ValueError, match="no attention maps"):
        clf.attention(x)


# --------------------------------------------------------------------------------------------- the contract

def test_images_is_an_application_of_the_registry(trained):
    import qkv.apps.images.command as command

    app = application("images")
    assert (app.options, app.task, app.predictor) == (ImageOptions, ImageTask, ImageClassifier)
    assert not hasattr(command, "train")  # `qkv train images` is the registry's (qkv.cli.train)
    assert application_of(trained / "se") is app and isinstance(load_predictor(trained / "se"), ImageClassifier)


def test_predict_takes_a_tensor_or_a_list_of_files_and_tensors(trained, digit_png):
    clf = ImageClassifier.load(trained / "cbam")
    x = clf.test_images()[0][:2]
    batch = clf.predict(torch.stack([x[0].float() / 255, clf.read(digit_png), x[1].float() / 255]))
    listed = clf.predict([x[0], str(digit_png), x[1].float() / 255])  # uint8, a file, a float tensor
    for a, b in zip(batch, listed, strict=True):
        assert a.label == b.label and a.probabilities == pytest.approx(b.probabilities, abs=1e-6)
    inverted = clf.predict([digit_png], invert=True)[0]
    assert inverted.probabilities == pytest.approx(clf.predict((1 - clf.read(digit_png))[None])[0].probabilities,
                                                   abs=1e-6)
    with pytest.raises(ValueError, match="must be a batch"):
        clf.predict(str(digit_png))
    with pytest.raises(ValueError, match=r"image 2 must be a file or an \(16, 16\) tensor, got \(8, 8\)"):
        clf.predict([x[0], x[1, :8, :8]])
    with pytest.raises(ValueError, match="no images to classify"):
        clf.predict([])


def test_evaluate_is_accuracy_and_loss_of_predict(trained):
    clf = ImageClassifier.load(trained / "se")
    images, labels = clf.test_images()
    predictions = clf.predict(images[:50])
    truth = [clf.class_names[int(y)] for y in labels[:50]]
    accuracy = sum(p.label == t for p, t in zip(predictions, truth, strict=True)) / 50
    loss = -sum(math.log(p.probabilities[t]) for p, t in zip(predictions, truth, strict=True)) / 50
    got = clf.evaluate(limit=50)
    assert set(got) == {"accuracy", "loss", "examples"} and got["examples"] == 50
    assert got["accuracy"] == pytest.approx(accuracy, abs=1.01 / 50)  # a near tie may break the other way
    assert got["loss"] == pytest.approx(loss, rel=1e-4)
    valid = clf.evaluate(split="valid")
    assert valid["examples"] == len(clf.dataset().splits["valid"][1]) == 144
    with pytest.raises(ValueError, match="no split 'train'"):
        clf.evaluate(split="train")
    with pytest.raises(ValueError, match="beam does not apply to images runs"):
        clf.evaluate(beam=2)


def test_evaluate_on_another_idx_folder(trained, tmp_path):
    clf = ImageClassifier.load(trained / "se")
    root = write_idx_folder(tmp_path / "idx", {"train": 30, "t10k": 20}, side=16)
    got = clf.evaluate(str(root))
    images, labels = clf.dataset(str(root)).splits["test"]
    assert got["examples"] == 20 and torch.equal(labels, load_image_splits("mnist", root=str(root)).splits["test"][1])
    hits = sum(p.label == clf.class_names[int(y)] for p, y in zip(clf.predict(images), labels, strict=True))
    assert got["accuracy"] == pytest.approx(hits / 20, abs=1.01 / 20)
    with pytest.raises(ValueError, match="its images are 12x12, the model's 16x16"):
        clf.evaluate(str(write_idx_folder(tmp_path / "small", {"train": 30, "t10k": 20}, side=12)))
    with pytest.raises(ValueError, match="neither a folder of IDX files nor one of fashion-mnist"):
        clf.evaluate(str(tmp_path / "nowhere"))


def test_view_records_the_prediction(trained, digit_png):
    clf = ImageClassifier.load(trained / "cbam")
    page = clf.view(ViewInput(index=3))
    (pred,) = clf.predict(clf.test_images()[0][3:4])
    assert page.title == f"{pred.label} ({pred.probability:.2f})" and page.image.shape == (16, 16)
    assert page.records and all(isinstance(r, AttentionRecord) for r in page.records)
    assert {r.kind for r in page.records} >= {"channel", "spatial"}
    from_file = clf.view(ViewInput(image=str(digit_png)))
    torch.testing.assert_close(from_file.image, clf.read(digit_png))
    assert [r.name for r in from_file.records] == [r.name for r in page.records]
    with pytest.raises(ValueError, match=r"needs image \(a file\) or index"):
        clf.view(ViewInput(text="a digit"))
    with pytest.raises(ValueError, match="index 999 is out of range: the test split has 359 images"):
        clf.view(ViewInput(index=999))


def test_qkv_evaluate_images_runs(trained, capsys):
    assert main(["evaluate", str(trained / "se"), str(trained / "cbam"), "--max-examples", "40"]) == 0
    out = capsys.readouterr().out
    want = [ImageClassifier.load(trained / k).evaluate(limit=40) for k in ("se", "cbam")]
    assert "| metric | se | cbam |" in out and "| examples | 40 | 40 |" in out
    assert f"| accuracy | {want[0]['accuracy']:.4f} | {want[1]['accuracy']:.4f} |" in out


# --------------------------------------------------------------------------------------------- Fashion-MNIST

@needs_fashion_mnist
@pytest.mark.slow
def test_fashion_mnist_splits_and_a_few_steps(tmp_path, capsys):
    data = load_data(ImageOptions())
    assert {s: len(data.splits[s][1]) for s in data.splits} == {"train": 54000, "valid": 6000, "test": 10000}
    assert data.image_size == (28, 28) and data.class_names[0] == "T-shirt/top"
    task = ImageTask(ImageOptions(attn="cbam"), data=data)
    train(task, TrainConfig(max_steps=2, batch_size=32, out=str(tmp_path / "fm"), eval_split=None, final_splits=(),
                            progress=False))
    assert 0.2 < task.mean < 0.4 and 0.25 < task.std < 0.45  # Fashion-MNIST: mean 0.286, std 0.353
    x, y = task.collate([task.train_examples()[i] for i in range(8)])
    assert x.shape == (8, 1, 28, 28) and y.shape == (8,)
    assert main(["show-attention", str(tmp_path / "fm"), "--index", "0", "--out", str(tmp_path / "p")]) == 0
    assert "(true: Ankle boot)" in capsys.readouterr().out  # the first test image of Fashion-MNIST
    assert is_png(tmp_path / "p" / "test0-spatial.png")
