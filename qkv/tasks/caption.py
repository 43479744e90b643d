"""Image captioning with visual attention (Show, Attend and Tell): options, data, model, the trainer's task and
a :class:`Captioner` that captions images and returns where it looked for every word.

Data: ``scenes`` (generated, :mod:`qkv.data.scenes`: 1-4 Fashion-MNIST items on a 64x64 canvas, several
references per scene, every item's box, some item/cell combinations only in the test split) or a captions file
(Flickr8k ``image.jpg#N<TAB>caption`` lines or a COCO captions JSON, :mod:`qkv.data.captions`) with its image
folder, split into train/valid/test images by a seeded permutation.

Models (:mod:`qkv.models.captioning`): ``soft`` (Xu et al.'s deterministic attention with the gate beta and the
doubly stochastic penalty), ``hard`` (a sampled location per word, REINFORCE with a moving-average baseline and
an entropy bonus; evaluated with the expected context or the argmax location, ``hard_test``), ``fixed`` (the
mean-pooled image, no attention) and ``transformer`` (cross-attention to the grid).

Example::

    from qkv.tasks.caption import CaptionOptions, CaptionTask, Captioner, train_defaults
    from qkv.train import train
    options = CaptionOptions(data="scenes", model="soft")
    train(CaptionTask(options), train_defaults(options).replace(max_minutes=10, out="runs/scenes"))
    captioner = Captioner.load("runs/scenes")
    images, _ = captioner.test_images([0, 1])
    [c.text for c in captioner.predict(images, beam=3)]    # ['a bag at the top left and a boot at the ...', ...]
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..options import check_options, option
from ..train.task import Task
from .base import load_run
from .caption_data import Caption, CaptionData, CaptionExamples, caption_images, caption_metrics, load_caption_data

logger = logging.getLogger(__name__)

__all__ = ["CaptionOptions", "load_data", "model_spec", "build_model", "train_defaults", "CaptionTask",
           "Caption", "Captioner", "caption_images", "caption_metrics", "MODELS"]

MODELS = ("soft", "hard", "fixed", "transformer")
_RNN = {"model": ("soft", "hard", "fixed")}
_ATTENDING_RNN = {"model": ("soft", "hard")}
_TRANSFORMER = {"model": ("transformer",)}
_SCENES = {"data": ("scenes",)}


@dataclass
class CaptionOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("scenes", help="'scenes' (generated) or a captions file: Flickr8k lines "
                       "(image.jpg#N<TAB>caption) or a COCO captions JSON")
    images: str | None = option(None, excludes=_SCENES, help="folder of the images (default: the captions file's)")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_SCENES,
                           help="a malformed caption line or a missing image: raise (file:line) or skip and count")
    image_size: int = option(128, low=16, excludes=_SCENES, help="images are resized and centre-cropped to this "
                             "(a multiple of 8; scenes are 64x64)")
    grey: bool = option(False, excludes=_SCENES, help="read images as grey (scenes always are)")
    min_freq: int = option(5, low=1, excludes=_SCENES, help="words seen fewer times become <unk>")
    valid: float = option(0.05, low=0, low_open=True, high=0.5, excludes=_SCENES, help="share of images for valid")
    test: float = option(0.05, low=0, low_open=True, high=0.5, excludes=_SCENES, help="share of images for test")
    n_train: int = option(10_000, low=1, applies=_SCENES, help="generated training scenes")
    n_valid: int = option(500, low=1, applies=_SCENES, help="generated validation scenes")
    n_test: int = option(1_000, low=1, applies=_SCENES, help="generated test scenes")
    scenes_root: str | None = option(None, applies=_SCENES, help="Fashion-MNIST IDX folder for the scenes "
                                     "(default: /usr/share/datasets/fashion-mnist, else scikit-learn digits)")
    data_seed: int = option(0, low=0, help="seed of the data's generation and split (not of training)")
    # model
    model: str = option("soft", choices=MODELS, help="soft or hard attention, fixed (mean-pooled image, no "
                        "attention) or transformer")
    score: str | None = option(None, applies={"model": ("soft", "hard", "transformer")},
                               help="attention score, any qkv score name (default: additive for soft/hard, "
                                    "scaled_dot for the transformer)")
    widths: tuple[int, ...] = option((16, 32, 64, 128), low=1, help="channels of the CNN's stages (4 or more; "
                                     "the last is the features' size D)")
    coords: bool = option(False, help="append the pixels' (y, x) to the CNN's input (CoordConv): features then "
                          "code what and where jointly")
    padding: str | None = option(None, choices=("zeros", "circular", "replicate", "reflect"),
                                 help="the CNN's padding mode; 'circular': an item gives the same features in every "
                                      "cell (exactly, for shifts by multiples of 8 pixels; default: circular for "
                                      "models that attend on scenes, zeros otherwise)")
    keys: str | None = option(None, choices=("features", "both", "positions"), applies=_ATTENDING_RNN,
                              help="soft/hard: the attention's keys: the features (the paper), the features plus an "
                                   "embedding of their grid position ('both'), or the positions alone scored with "
                                   "the query plus a salience of the features that no query or position changes "
                                   "(default: positions on scenes, features otherwise)")
    init_state: str = option("mean", choices=("mean", "learned"), applies=_ATTENDING_RNN,
                             help="soft/hard: the LSTM's h_0, c_0 from the mean annotation (the paper) or learned "
                                  "(the decoder knows nothing of the image before it looks)")
    where: bool = option(True, applies=_ATTENDING_RNN, help="soft/hard: give the decoder the attended location "
                         "(the alpha-weighted grid (y, x)) apart from the context")
    deep_output: str | None = option(None, choices=("full", "context", "grounded"), applies=_ATTENDING_RNN,
                                     help="soft/hard: item words from e + L_z z + L_h h (+ location) ('full'), from "
                                          "e + L_z z alone ('context'), or that and an LSTM that never sees the "
                                          "context or the item named ('grounded'; default on scenes, else full)")
    salience: str = option("features", choices=("features", "local"), applies=_ATTENDING_RNN,
                           help="soft/hard: the salience (keys=positions, grounded) from the grid features or from "
                                "the CNN's second stage, averaged onto the grid: what each place holds itself")
    glimpse: bool | None = option(None, applies=_ATTENDING_RNN, help="soft/hard, grounded: the item words read the "
                                  "features in a Gaussian window at the attended location, weighted by salience "
                                  "(the same window in every cell; default: on for scenes)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="LSTMs: word embedding size")
    hidden_dim: int = option(128, low=1, applies=_RNN, help="LSTMs: decoder state size")
    attn_dim: int = option(128, low=1, applies=_ATTENDING_RNN, help="hidden size of the additive/MLP score")
    dim: int = option(128, low=2, applies=_TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=_TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=_TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")
    num_layers: int = option(2, low=1, applies=_TRANSFORMER, help="transformer: decoder layers")
    dropout: float = option(0.2, low=0, high=0.99, help="dropout")
    # loss and evaluation
    doubly_stochastic: float | None = option(None, low=0, applies={"model": ("soft",)},
                                             help="lambda of the penalty sum_i (1 - sum_t alpha_ti)^2 (default: 0 "
                                                  "on scenes, 0.1 otherwise)")
    reward_weight: float = option(1.0, low=0, applies={"model": ("hard",)}, help="hard: lambda_r of REINFORCE")
    entropy_weight: float = option(0.01, low=0, applies={"model": ("hard",)}, help="hard: lambda_e, the entropy "
                                   "bonus of the attention")
    baseline_decay: float = option(0.9, low=0, high=0.999, applies={"model": ("hard",)},
                                   help="hard: the baseline's moving-average decay")
    hard_expected: float = option(0.5, low=0, high=1, applies={"model": ("hard",)},
                                  help="hard: share of the captions trained on the expected context instead of a "
                                       "sampled location (Xu et al.: 0.5)")
    hard_test: str = option("expectation", choices=("expectation", "argmax"), applies={"model": ("hard",)},
                            help="hard: at test time the expected context or the most likely location")
    references: str | None = option(None, choices=("sample", "best"), help="which reference of an image a step "
                                    "trains on: one drawn at random, or the one the model finds most likely now "
                                    "(the least loss of all of them; default: best on scenes, sample otherwise)")
    label_smoothing: float = option(0.1, low=0, high=0.99, help="label smoothing of the cross-entropy")
    eval_beam: int = option(1, low=1, help="beam of the evaluations during training (1 = greedy)")
    eval_max: int = option(1000, low=1, help="images captioned per evaluation")
    max_decode_len: int = option(40, low=1, help="longest caption decoded, in words")

    def __post_init__(self):
        self.widths = tuple(self.widths)
        self._resolve_defaults()
        check_options(self)
        if len(self.widths) < 4:
            raise ValueError(f"widths must be at least 4 channel counts (the grid has stride 8), got {self.widths}")
        if self.image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {self.image_size}")
        if self.model == "transformer" and self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")

    def _resolve_defaults(self) -> None:
        """The defaults that depend on the data: on scenes, what lets a model name an item at a place it never
        saw it there (BENCHMARKS.md, captioning); on captions files, Xu et al.'s model."""
        scenes, attending = self.data == "scenes", self.model in _ATTENDING_RNN["model"]
        if self.padding is None:
            self.padding = "circular" if scenes and self.model != "fixed" else "zeros"
        if self.references is None:
            self.references = "best" if scenes else "sample"
        if attending:
            self.keys = self.keys or ("positions" if scenes else "features")
            self.deep_output = self.deep_output or ("grounded" if scenes else "full")
            if self.glimpse is None:
                self.glimpse = self.deep_output == "grounded" and scenes
        if self.model == "soft" and self.doubly_stochastic is None:
            self.doubly_stochastic = 0.0 if scenes else 0.1

    @property
    def score_name(self) -> str:
        return self.score or ("scaled_dot" if self.model == "transformer" else "additive")


def train_defaults(options: CaptionOptions):
    """The trainer's settings for captioning (the ``qkv train caption`` defaults)."""
    from ..train import TrainConfig

    return TrainConfig(epochs=8, batch_size=64, lr=3e-3, warmup_steps=100, schedule="cosine", weight_decay=0.01,
                       clip_norm=5.0, monitor="exact_match" if options.data == "scenes" else "bleu4")


def load_data(options: CaptionOptions) -> CaptionData:
    """The train/valid/test splits ``options`` describe (every split must hold an image)."""
    o = options
    return load_caption_data(o.data, images=o.images, on_error=o.on_error, image_size=o.image_size, grey=o.grey,
                             valid=o.valid, test=o.test, n_train=o.n_train, n_valid=o.n_valid, n_test=o.n_test,
                             scenes_root=o.scenes_root, seed=o.data_seed)


def model_spec(options: CaptionOptions, *, vocab_size: int, in_channels: int, image_size: int,
               content_ids: list[int] | None = None) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`; ``content_ids``: token ids of the item words
    (``deep_output="context"``)."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "in_channels": in_channels, "widths": list(o.widths),
                              "dropout": o.dropout, "coords": o.coords, "padding": o.padding}
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim, num_layers=o.num_layers,
                      score=o.score_name, max_len=o.max_decode_len + 2, grid=(image_size // 8) ** 2)
    else:
        config.update(embed_dim=o.embed_dim, hidden_dim=o.hidden_dim)
        if o.model != "fixed":
            config.update(attn_dim=o.attn_dim, score=o.score_name, where=o.where, deep_output=o.deep_output,
                          keys=o.keys, init_state=o.init_state, glimpse=o.glimpse, salience=o.salience)
            if o.deep_output != "full":
                if not content_ids:
                    raise ValueError(f"deep_output {o.deep_output!r} needs the item words' ids (captions data "
                                     "with items)")
                config["content_ids"] = list(content_ids)
        if o.model == "hard":
            config.update(test_attention=o.hard_test, expected_share=o.hard_expected)
    return {"name": f"caption-{o.model}", "config": config}


def build_model(options: CaptionOptions, **sizes) -> nn.Module:
    """A new captioner (see :func:`model_spec`)."""
    from ..models import create

    spec = model_spec(options, **sizes)
    return create(spec["name"], **spec["config"])


class CaptionTask(Task):
    """Teacher-forced cross-entropy over caption words (one reference of each image drawn per batch), plus the
    doubly stochastic penalty (soft) or the REINFORCE terms (hard); metrics from :func:`caption_metrics`."""

    name = "caption"
    unit = "words"

    def __init__(self, options: CaptionOptions, data: CaptionData | None = None):
        self.options = options
        self.data = data
        self.tokenizer = None

    def setup(self) -> None:
        from ..data import train_tokenizer

        if self.data is None:
            self.data = load_data(self.options)
        logger.info("data %s: %s", self.options.data,
                    ", ".join(f"{len(s)} {name}" for name, s in self.data.splits.items()))
        if self.tokenizer is None:
            texts = (c for refs in self.data.splits["train"].references for c in refs)
            self.tokenizer = train_tokenizer("word", texts, min_freq=1 if self.options.data == "scenes"
                                             else self.options.min_freq)

    def train_examples(self):
        return CaptionExamples(self.data.splits["train"], self.tokenizer, self.options.max_decode_len)

    def collate(self, examples):
        from ..data import BOS_ID, EOS_ID, pad_sequences

        images = torch.stack([x for x, _ in examples])
        if self.options.references == "best":  # every reference; the loss keeps each image's most likely one
            picks = [ids for _, refs in examples for ids in refs]
            owner = torch.tensor([i for i, (_, refs) in enumerate(examples) for _ in refs])
        else:  # one reference per image, drawn at random
            picks = [refs[int(torch.randint(len(refs), ()))] for _, refs in examples]
            owner = torch.arange(len(examples))
        tgt_in, _, _ = pad_sequences([[BOS_ID] + ids for ids in picks])
        tgt_out, _, mask = pad_sequences([ids + [EOS_ID] for ids in picks])
        return {"images": images, "tgt_in": tgt_in, "tgt_out": tgt_out, "mask": mask, "owner": owner}

    def save_assets(self, directory: Path) -> None:
        self.tokenizer.save(directory / "tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ..data import load_tokenizer

        self.tokenizer = load_tokenizer(directory / "tokenizer")

    def _sizes(self) -> dict[str, Any]:
        ids = [self.tokenizer.encode(w) for w in self.data.item_words]
        return {"vocab_size": self.tokenizer.vocab_size, "in_channels": self.data.channels,
                "image_size": self.data.image_size, "content_ids": sorted({i[0] for i in ids if len(i) == 1})}

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, **self._sizes()), "options": dataclasses.asdict(self.options),
                "image_size": self.data.image_size, "channels": self.data.channels,
                "item_words": self.data.item_words}

    def build_model(self) -> nn.Module:
        return build_model(self.options, **self._sizes())

    def loss(self, model, batch):
        o = self.options
        images, tgt_in, target, mask, owner = (batch[k] for k in ("images", "tgt_in", "tgt_out", "mask", "owner"))
        images = images.float() / 255.0
        if len(owner) > len(images):  # references="best": train on each image's reference of least loss now
            with torch.no_grad():
                every = model(images, tgt_in, owner)
                nll = F.cross_entropy(every.logits.float().transpose(1, 2), target, ignore_index=0,
                                      reduction="none", label_smoothing=o.label_smoothing).sum(1)
            keep = _least_per_owner(nll, owner)  # one row per image, in image order
            tgt_in, target, mask = tgt_in[keep], target[keep], mask[keep]
        out = model(images, tgt_in)
        ce = F.cross_entropy(out.logits.float().transpose(1, 2), target, ignore_index=0, reduction="none",
                             label_smoothing=o.label_smoothing)  # (B, T)
        loss = ce.sum()
        stats: dict[str, Any] = {"token_acc": ((out.logits.argmax(-1) == target) & mask).sum()}
        if o.model == "soft" and o.doubly_stochastic:
            from ..models.captioning import doubly_stochastic_penalty

            penalty = doubly_stochastic_penalty(out.attention.float(), mask)
            loss = loss + o.doubly_stochastic * penalty
            stats["penalty"] = penalty.detach()
        if o.model == "hard" and out.sample_log_prob is not None:
            from ..models.captioning import reinforce_loss

            module = getattr(model, "module", model)  # the DDP wrapper's model
            log_likelihood = -ce.detach().sum(1)
            if not bool(module.baseline_ready):
                module.update_baseline(log_likelihood, o.baseline_decay)
            loss = loss + reinforce_loss(log_likelihood, out.sample_log_prob.float(), out.entropy.float(), mask,
                                         module.baseline, reward_weight=o.reward_weight,
                                         entropy_weight=o.entropy_weight)
            module.update_baseline(log_likelihood, o.baseline_decay)
        return loss, mask.sum(), stats

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        part = self.data.splits[split].head(self.options.eval_max)
        captions = caption_images(model, self.tokenizer, part.batch(range(len(part))), beam=self.options.eval_beam,
                                  max_len=self.options.max_decode_len)
        return caption_metrics([c.text for c in captions], part.references, captions=captions, scenes=part.scenes,
                               item_words=self.data.item_words, image_size=self.data.image_size)


def _least_per_owner(loss: Tensor, owner: Tensor) -> Tensor:
    """Indices of the rows of least ``loss (R,)`` per value of ``owner (R,)`` (0..B-1, every value present), in
    owner order: Guzman-Rivera et al.'s multiple choice learning, over an image's references."""
    order = torch.argsort(loss, stable=True)
    first = torch.full((int(owner.max()) + 1,), len(loss), dtype=torch.long, device=loss.device)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=loss.device)
    first.scatter_reduce_(0, owner, rank, reduce="amin")
    return order[first]


# ----------------------------------------------------------------------------------------------- inference

#: model options a run saved before they existed, as the model built then (the constructors' defaults)
_BUILT_BEFORE = {"padding": "zeros", "keys": "features", "init_state": "mean", "glimpse": False}


def _as_built(options: CaptionOptions, model_config: dict[str, Any]) -> CaptionOptions:
    """``options`` with the model options the saved model was built with (a run saved before an option existed
    gets the value its model has, not today's default for its data)."""
    built = {k: model_config.get(k, old) for k, old in _BUILT_BEFORE.items()}
    if options.model not in _ATTENDING_RNN["model"]:
        built = {"padding": built["padding"]}
    return dataclasses.replace(options, **built)


def _upgrade_v1(config: dict[str, Any], state_dict: dict) -> tuple[dict, dict]:
    raise ValueError("captioning runs exist only in format version 2 and later")


class Captioner:
    """A trained captioning run: ``Captioner.load(run_dir).predict(images, beam=3)``."""

    task = CaptionTask.name

    def __init__(self, model: nn.Module, tokenizer, config: dict[str, Any], options: CaptionOptions):
        self.model, self.tokenizer, self.options = model.eval(), tokenizer, options
        self.image_size, self.channels = int(config["image_size"]), int(config["channels"])
        self.item_words = list(config.get("item_words") or [])
        self._data: CaptionData | None = None

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> Captioner:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory."""
        from ..data import load_tokenizer

        run = load_run(run_dir, cls.task, _upgrade_v1, CaptionOptions, device)
        options = _as_built(run.options, run.config["model"]["config"])
        if "references" not in run.config.get("options", {}):  # saved before the option: trained on one drawn
            options = dataclasses.replace(options, references="sample")
        return cls(run.model, load_tokenizer(run.checkpoint.assets / "tokenizer"), run.config, options)

    def read(self, path: str | os.PathLike) -> Tensor:
        """An image file as this model's input ``(C, S, S)`` uint8 (resized and centre-cropped)."""
        from ..data.captions import load_image

        if not Path(path).is_file():
            raise ValueError(f"no image file {str(path)!r}")
        return load_image(path, self.image_size, grey=self.channels == 1)

    def data(self, data: str | None = None) -> CaptionData:
        """The run's data (generated or read again), or another captions file ``data``."""
        if data is not None:
            from .base import upgrade_options

            return load_data(upgrade_options(CaptionOptions, {**dataclasses.asdict(self.options), "data": data}))
        if self._data is None:
            self._data = load_data(self.options)
        return self._data

    def test_images(self, index: list[int], split: str = "test") -> tuple[Tensor, list[list[str]]]:
        """Images ``(N, C, S, S)`` uint8 of ``split`` by index, and their references."""
        part = self.data().splits[split]
        for n in index:
            if not 0 <= n < len(part):
                raise ValueError(f"--index {n} is out of range: the {split} split has {len(part)} images "
                                 f"(0 to {len(part) - 1})")
        return part.batch(index), [part.references[n] for n in index]

    def predict(self, images: Tensor, *, beam: int = 3, max_len: int = 40, hard_test: str | None = None,
                batch_size: int = 100) -> list[Caption]:
        """Captions of ``images (N, C, S, S)`` (uint8, or float in [0, 1]), each with one attention map per word.

        ``hard_test`` (hard attention only): ``"expectation"`` or ``"argmax"`` instead of the trained setting.
        """
        if images.dim() == 3 and self.channels == 1:
            images = images[:, None]
        if images.dim() != 4 or tuple(images.shape[1:]) != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"images must be (N, {self.channels}, {self.image_size}, {self.image_size}), got "
                             f"{tuple(images.shape)}")
        if len(images) == 0:
            raise ValueError("no images to caption")
        if beam < 1 or max_len < 1:
            raise ValueError(f"beam and max_len must be >= 1, got {beam} and {max_len}")
        if hard_test is not None:
            if not hasattr(self.model, "test_attention"):
                raise ValueError("hard_test applies to hard attention models only")
            if hard_test not in ("expectation", "argmax"):
                raise ValueError(f"hard_test must be 'expectation' or 'argmax', got {hard_test!r}")
            self.model.test_attention = hard_test
        return caption_images(self.model, self.tokenizer, images, beam=beam, max_len=max_len, batch_size=batch_size)

    def evaluate(self, split: str = "test", *, data: str | None = None, beam: int = 1, max_images: int | None = None,
                 max_len: int = 40) -> dict[str, float]:
        """:func:`caption_metrics` of ``split`` (of the run's data, or of another captions file ``data``)."""
        d = self.data(data)
        part = d.splits[split].head(max_images or len(d.splits[split]))
        captions = self.predict(part.batch(range(len(part))), beam=beam, max_len=max_len)
        return caption_metrics([c.text for c in captions], part.references, captions=captions, scenes=part.scenes,
                               item_words=d.item_words, image_size=d.image_size)
