"""The captioning application end to end through `qkv.cli.main`: train on scenes (every model) and on a
Flickr8k-style folder, caption by index and by file with pictures, evaluate, resume, the predictor against the
model run by hand, and bad inputs (one line, exit code 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("matplotlib")

from qkv.apps.caption import Captioner, CaptionOptions, CaptionTask, caption_images, model_spec  # noqa: E402
from qkv.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--widths", "4,4,4,8", "--dropout", "0", "--batch-size", "16", "--no-progress", "--eval-max", "8"]
SCENES = ["--n-train", "48", "--n-valid", "8", "--n-test", "8"]
RNN = ["--embed-dim", "8", "--hidden-dim", "16"]
SIZES = {"soft": RNN + ["--attn-dim", "8"], "hard": RNN + ["--attn-dim", "8"], "fixed": RNN,
         "transformer": ["--dim", "8", "--num-heads", "2", "--num-layers", "1"]}


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train(out: Path, model: str, *extra: str) -> int:
    return main(["train", "caption", "--model", model, *SCENES, *SIZES[model], *SMALL, "--out", str(out), *extra])


@pytest.mark.parametrize("model", ["soft", "hard", "fixed", "transformer"])
@pytest.mark.slow
def test_train_and_caption_every_model(model, tmp_path, capsys):
    out = tmp_path / model
    local = ("--glimpse-features", "local") if model == "soft" else ()  # the glimpse on the third stage trains too
    assert train(out, model, "--max-steps", "2", *local) == 0
    final = {e["split"]: e["metrics"] for e in events(out) if e["event"] == "final"}
    if local:
        assert Captioner.load(out).model.glimpse_features == "local"
    for key in ("bleu1", "bleu4", "exact_match", "grounding", "grounding_above", "exact_match_items4",
                "layout_match"):
        assert key in final["test"]
    capsys.readouterr()
    assert main(["caption", str(out), "--index", "0", "--index", "3", "--beam", "2", "--plot",
                 str(tmp_path / "pics")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("test0\t") and any(line.startswith("test3\t") for line in lines)
    assert (tmp_path / "pics" / "test0.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_evaluate_resume_and_the_predictor(tmp_path, capsys):
    out = tmp_path / "soft"
    assert train(out, "soft", "--max-steps", "3", "--epochs", "2") == 0
    assert train(out, "soft", "--max-steps", "5", "--epochs", "2", "--resume") == 0
    assert [e["event"] for e in events(out)].count("resume") == 1
    assert max(e.get("global_step", 0) for e in events(out)) == 5
    capsys.readouterr()
    assert main(["caption", str(out), "--evaluate", "--beam", "1", "--json", str(tmp_path / "m.json")]) == 0
    text = capsys.readouterr().out
    assert "| BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | exact match | grounding |" in text
    assert "exact match by number of items: 1:" in text
    figures = json.loads((tmp_path / "m.json").read_text())
    assert figures["images"] == 8.0
    if figures["grounded_words"]:  # 5 steps may caption no item yet: grounding is then NaN (nothing to ground)
        assert 0 <= figures["grounding"] <= 1
    else:
        assert figures["grounding"] is None  # NaN, written null
    # the predictor equals the model run by hand (greedy, the first word's logits and map)
    cap = Captioner.load(out)
    images, refs = cap.test_images([1, 2])
    results = cap.predict(images, beam=1)
    by_hand = caption_images(cap.model, cap.tokenizer, images, beam=1, max_len=40)
    assert [r.text for r in results] == [r.text for r in by_hand] and len(refs[0]) >= 1
    with torch.no_grad():
        state = cap.model.encode(images.float() / 255.0)
        logits, attn, _ = cap.model.decode_step(torch.full((2,), 1), state)
    for i, r in enumerate(results):
        assert r.attention.shape == (len(r.words), 8, 8)
        if r.words:
            assert r.words[0] == cap.tokenizer.tokens_of_ids([int(logits[i].argmax())])[0]
            torch.testing.assert_close(r.attention[0].flatten(), attn[i])
    with pytest.raises(ValueError, match="images must be"):
        cap.predict(torch.zeros(2, 3, 64, 64))
    with pytest.raises(ValueError, match="hard_test"):
        cap.predict(images, hard_test="argmax")


@pytest.mark.slow
def test_hard_test_modes_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "hard"
    assert train(out, "hard", "--max-steps", "2", "--hard-test", "argmax", "--no-glimpse") == 0  # glimpse: a window
    cap = Captioner.load(out)
    assert cap.model.test_attention == "argmax" and cap.options.hard_test == "argmax"
    results = cap.predict(cap.test_images([0])[0], beam=1)
    assert all(float(m.max()) == 1.0 for m in results[0].attention)  # one location per word
    capsys.readouterr()
    assert main(["caption", str(out), "--index", "0", "--hard-test", "expectation"]) == 0


def _flickr(root: Path, n: int = 24) -> Path:
    from PIL import Image

    root.mkdir()
    lines = []
    for i in range(n):
        colour = "red" if i % 2 else "blue"
        Image.new("RGB", (40, 30), (200, 0, 0) if i % 2 else (0, 0, 200)).save(root / f"im{i}.png")
        lines += [f"im{i}.png#0\ta {colour} picture", f"im{i}.png#1\tthe picture is {colour}"]
    (root / "captions.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_flickr_style_folder(tmp_path, capsys):
    root = _flickr(tmp_path / "flickr")
    out = tmp_path / "run"
    args = ["train", "caption", "--data", str(root / "captions.txt"), "--image-size", "16", "--min-freq", "1",
            "--valid", "0.2", "--test", "0.2", *RNN, "--attn-dim", "8", *SMALL, "--max-steps", "2", "--out", str(out)]
    assert main(args) == 0
    final = {e["split"]: e["metrics"] for e in events(out) if e["event"] == "final"}
    assert "bleu4" in final["test"] and "grounding" not in final["test"]
    assert json.loads((out / "best" / "config.json").read_text())["config"]["channels"] == 3 \
        if (out / "best" / "config.json").is_file() else True
    capsys.readouterr()
    assert main(["caption", str(out), str(root / "im0.png"), str(root / "im1.png"), "--plot", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out.startswith("im0\t")
    assert (tmp_path / "p" / "im1.png").is_file()
    # a malformed line: one line naming file:line, exit 2, nothing written
    with open(root / "captions.txt", "a") as f:
        f.write("im3.png\tno number\n")
    bad = [a if a != str(out) else str(tmp_path / "bad") for a in args]
    assert main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "captions.txt:49:" in err and not (tmp_path / "bad").exists()
    assert main(bad + ["--on-error", "skip"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["train", "caption", "--images", "x"], "images"),
    (["train", "caption", "--model", "fixed", "--attn-dim", "8"], "--attn-dim"),
    (["train", "caption", "--model", "soft", "--num-heads", "3"], "--num-heads"),
    (["train", "caption", "--widths", "4,4"], "widths"),
    (["train", "caption", "--no-glimpse", "--glimpse-features", "local"], "--glimpse-features"),
    (["train", "caption", "--model", "transformer", "--glimpse-features", "grid"], "--glimpse-features"),
    (["train", "caption", "--data", "/nonexistent/captions.txt"], "no such captions file"),
])
def test_bad_training_options(argv, message, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error:") and message in err and "\n" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_bad_caption_inputs(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "fixed", "--max-steps", "1") == 0
    (tmp_path / "junk.png").write_bytes(PNG + b"junk")
    for argv, message in ((["--index", "99"], "out of range"), ([str(tmp_path / "none.png")], "no image file"),
                          ([str(tmp_path / "junk.png")], "cannot read image"), ([], "give image files"),
                          (["--index", "0", "--hard-test", "argmax"], "hard attention"),
                          (["--index", "0", "--data", "x"], "--evaluate")):
        capsys.readouterr()
        assert main(["caption", str(out), *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("qkv: error:") and message in err and "\n" not in err


def test_model_spec_is_json_and_rebuilds():
    from qkv.models import create

    for model in ("soft", "hard", "fixed", "transformer"):
        spec = model_spec(CaptionOptions(model=model), vocab_size=30, in_channels=1, image_size=64,
                          content_ids=[7, 9])
        assert json.loads(json.dumps(spec)) == spec and spec["name"] == f"caption-{model}"
        create(spec["name"], **spec["config"])
    spec = model_spec(CaptionOptions(deep_output="context"), vocab_size=30, in_channels=1, image_size=64,
                      content_ids=[7, 9])
    assert spec["config"]["content_ids"] == [7, 9] and spec["config"]["where"] and not spec["config"]["coords"]
    assert create(spec["name"], **spec["config"]).content.nonzero().flatten().tolist() == [7, 9]
    with pytest.raises(ValueError, match="item words"):
        model_spec(CaptionOptions(deep_output="context"), vocab_size=30, in_channels=1, image_size=64)
    assert CaptionTask(CaptionOptions()).unit == "words"


def test_context_output_gets_the_item_words(tmp_path):
    out = tmp_path / "ctx"
    assert train(out, "soft", "--max-steps", "1", "--deep-output", "context", "--coords") == 0
    cap = Captioner.load(out)
    ids = cap.model.content.nonzero().flatten().tolist()
    assert sorted(cap.tokenizer.tokens_of_ids(ids)) == sorted(cap.item_words) and len(ids) == 6
    assert cap.model.encoder.coords and cap.model.where


def test_least_loss_reference_per_image_against_brute_force(gen):
    from qkv.apps.caption.task import _least_per_owner

    for _ in range(20):
        counts = torch.randint(1, 4, (6,), generator=gen)
        owner = torch.repeat_interleave(torch.arange(6), counts)
        loss = torch.randint(0, 5, (len(owner),), generator=gen).double()  # ties: the first row wins
        keep = _least_per_owner(loss, owner)
        expected = [min((i for i in range(len(owner)) if owner[i] == b), key=lambda i: (loss[i], i)) for b in range(6)]
        assert keep.tolist() == expected


def test_best_reference_loss_trains_on_each_images_most_likely_reference():
    """references='best': the loss is the cross-entropy of the reference the model finds most likely, per image;
    'sample' draws one; the model's owner= forward equals a forward on the repeated images."""
    options = CaptionOptions(model="soft", n_train=8, n_valid=2, n_test=2, dropout=0.0, naming=0.0)
    assert options.references == "best" and CaptionOptions(data="x.txt").references == "sample"
    task = CaptionTask(options)
    task.setup()
    torch.manual_seed(0)
    model = task.build_model()
    examples = [task.train_examples()[i] for i in range(8)]
    batch = task.collate(examples)
    refs = [ids for _, r in examples for ids in r]
    assert len(batch["owner"]) == len(refs) > 8 and batch["owner"].tolist() == sorted(batch["owner"].tolist())
    images = batch["images"].float() / 255
    with torch.no_grad():
        model.eval()  # batch norm: in training its statistics would count an image once per reference
        torch.testing.assert_close(model(images, batch["tgt_in"], batch["owner"]).logits,
                                   model(images[batch["owner"]], batch["tgt_in"]).logits, rtol=1e-4, atol=1e-5)
        model.train()
        every = model(images, batch["tgt_in"], batch["owner"])
        ce = torch.nn.functional.cross_entropy(every.logits.transpose(1, 2), batch["tgt_out"], ignore_index=0,
                                               reduction="none", label_smoothing=options.label_smoothing).sum(1)
        loss, words, _ = task.loss(model, batch)
    best = [min(ce[i] for i in range(len(refs)) if batch["owner"][i] == b) for b in range(8)]
    assert float(loss) == pytest.approx(float(sum(best)), rel=1e-4)
    assert int(words) == sum(int(batch["mask"][i].sum()) for i in range(len(refs))
                             if float(ce[i]) in [float(x) for x in best])
    sample = CaptionTask(dataclasses.replace(options, references="sample"), task.data)
    sample.tokenizer = task.tokenizer
    assert len(sample.collate(examples)["owner"]) == 8


def test_a_run_saved_before_the_scene_options_reports_the_model_it_built(tmp_path):
    """A run whose saved config predates padding/keys/glimpse/references loads with the options its model was
    built and trained with, not today's scene defaults."""
    out = tmp_path / "old"
    assert train(out, "soft", "--max-steps", "1", "--padding", "zeros", "--keys", "features", "--deep-output", "full",
                 "--no-glimpse", "--references", "sample") == 0
    for folder in (out / "best", out / "checkpoint"):
        path = folder / "config.json"
        if not path.is_file():
            continue
        saved = json.loads(path.read_text())
        for key in ("padding", "keys", "init_state", "glimpse", "glimpse_features"):
            saved["config"]["model"]["config"].pop(key)
            saved["config"]["options"].pop(key)
        saved["config"]["options"].pop("references")
        path.write_text(json.dumps(saved))
    cap = Captioner.load(out)
    o = cap.options
    assert (o.padding, o.keys, o.init_state, o.glimpse, o.references) == ("zeros", "features", "mean", False, "sample")
    assert cap.model.encoder.padding == "zeros" and cap.model.keys == "features" and not cap.model.glimpse
    assert o.glimpse_features == "grid" and not hasattr(cap.model, "read")
    fresh = CaptionOptions()
    assert (fresh.padding, fresh.keys, fresh.glimpse, fresh.references) == ("circular", "positions", True, "best")
    assert fresh.glimpse_features == "grid"


def test_the_glimpse_reads_grid_features_by_default_and_local_on_request():
    """Scenes: the attending models' glimpse reads the grid features, or with --glimpse-features local the CNN's
    third stage (features that see less than an item), built into the model the run saves; nothing to read without
    the glimpse."""
    from qkv.models import create

    for model in ("soft", "hard"):
        for what in ("local", "mid", "grid"):
            o = CaptionOptions(model=model, **({} if what == "grid" else {"glimpse_features": what}))
            assert o.glimpse_features == what
            spec = model_spec(o, vocab_size=30, in_channels=1, image_size=64, content_ids=[7, 9])
            assert spec["config"]["glimpse_features"] == what
            built = create(spec["name"], **spec["config"])
            assert built.glimpse_features == what and hasattr(built, "read") == (what != "grid")
    assert CaptionOptions(glimpse=False).glimpse_features == "grid"
    with pytest.raises(ValueError, match="glimpse"):
        CaptionOptions(glimpse=False, glimpse_features="local")


def test_evaluate_on_another_captions_file_naming_missing_images(tmp_path, capsys):
    """`qkv caption RUN --evaluate --data FILE`: a line naming a missing image is a one-line error at file:line, or
    skipped and counted with --on-error skip; --on-error without --data is refused."""
    root = _flickr(tmp_path / "flickr")
    out = tmp_path / "run"
    assert main(["train", "caption", "--data", str(root / "captions.txt"), "--image-size", "16", "--min-freq", "1",
                 "--valid", "0.2", "--test", "0.2", *RNN, "--attn-dim", "8", *SMALL, "--max-steps", "1",
                 "--out", str(out)]) == 0
    other = _flickr(tmp_path / "other", n=12)
    with open(other / "captions.txt", "a") as f:
        f.write("gone.png#0\ta red picture\n")  # line 25
    capsys.readouterr()
    args = ["caption", str(out), "--evaluate", "--data", str(other / "captions.txt"), "--beam", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "captions.txt:25" in err and "gone.png" in err
    assert main([*args, "--on-error", "skip"]) == 0
    assert "| BLEU-1 |" in capsys.readouterr().out
    assert main(["caption", str(out), "--index", "0", "--on-error", "skip"]) == 2
    assert "--on-error goes with --evaluate --data" in capsys.readouterr().err


def test_naming_adds_its_weighted_cross_entropy_at_the_item_words():
    """--naming W: the loss is the captions' cross-entropy plus W times the second reading's at the item words
    only; the option needs the glimpse."""
    options = CaptionOptions(model="soft", n_train=8, n_valid=2, n_test=2, dropout=0.0, references="sample",
                             naming=2.0)
    task = CaptionTask(options)
    task.setup()
    torch.manual_seed(0)
    model = task.build_model().train()
    batch = task.collate([task.train_examples()[i] for i in range(8)])
    images, target, mask = batch["images"].float() / 255, batch["tgt_out"], batch["mask"]
    with torch.no_grad():
        out = model(images, batch["tgt_in"])
        ce = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), target, ignore_index=0,
                                               label_smoothing=options.label_smoothing, reduction="sum")
        items = model.content[target] & mask
        naming = torch.nn.functional.cross_entropy(out.naming.transpose(1, 2), target, reduction="none")[items]
        loss, _, stats = task.loss(model, batch)
    assert 0 < int(items.sum()) < int(mask.sum())
    assert float(loss) == pytest.approx(float(ce + 2.0 * naming.sum()), rel=1e-5)
    assert float(stats["naming"]) == pytest.approx(float(naming.sum()), rel=1e-5)
    with pytest.raises(ValueError, match="naming"):
        CaptionOptions(glimpse=False, naming=1.0)
    # on by default where it was measured: the soft model with the glimpse (scenes)
    assert (CaptionOptions().naming, CaptionOptions(model="hard").naming, CaptionOptions(glimpse=False).naming,
            CaptionOptions(data="x.txt").naming) == (1.0, 0.0, 0.0, 0.0)
    assert model_spec(CaptionOptions(), vocab_size=30, in_channels=1, image_size=64,
                      content_ids=[7, 9])["config"]["naming"] is True
