"""Captioning's options (:class:`CaptionOptions`, with the defaults that depend on the data) and the trainer's
preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...options import OptionError, check_options, option, ref
from ..option_groups import TRANSFORMER, TransformerOptions, on_error_setting

__all__ = ["CaptionOptions", "CaptionSettings", "train_defaults", "MODELS", "ATTENDING"]

MODELS = ("soft", "hard", "fixed", "transformer")
_RNN = {"model": ("soft", "hard", "fixed")}
ATTENDING = ("soft", "hard")  #: the recurrent captioners that attend
_ATTENDING_RNN = {"model": ATTENDING}
_SCENES = {"data": ("scenes",)}


def _soft_hard(default: Any, *, when: str = "", help: str, **kwargs: Any) -> Any:
    """An option of the LSTM captioners that attend (soft, hard), which its help says first (``when``: a further
    condition, the glimpse or the grounded output)."""
    return option(default, applies=_ATTENDING_RNN, help=f"soft/hard{', ' + when if when else ''}: {help}", **kwargs)


@dataclass
class CaptionOptions(TransformerOptions):
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
    keys: str | None = _soft_hard(
        None, choices=("features", "both", "positions"),
        help="the attention's keys: the features (the paper), the features plus an embedding of their grid position "
             "('both'), or the positions alone scored with the query plus a salience of the features that no query "
             "or position changes (default: positions on scenes, features otherwise)")
    init_state: str = _soft_hard(
        "mean", choices=("mean", "learned"),
        help="the LSTM's h_0, c_0 from the mean annotation (the paper) or learned (the decoder knows nothing of the "
             "image before it looks)")
    where: bool = _soft_hard(True, help="give the decoder the attended location (the alpha-weighted grid (y, x)) "
                                        "apart from the context")
    deep_output: str | None = _soft_hard(
        None, choices=("full", "context", "grounded"),
        help="item words from e + L_z z + L_h h (+ location) ('full'), from e + L_z z alone ('context'), or that and "
             "an LSTM that never sees the context or the item named ('grounded'; default on scenes, else full)")
    salience: str = _soft_hard(
        "features", choices=("features", "local"),
        help="the salience (keys=positions, grounded) from the grid features or from the CNN's second stage, "
             "averaged onto the grid: what each place holds itself")
    glimpse: bool | None = _soft_hard(
        None, when="grounded",
        help="the item words read the features in a Gaussian window at the attended location, weighted by salience "
             "(the same window in every cell; default: on for scenes)")
    glimpse_features: str | None = _soft_hard(
        None, when="glimpse", choices=("grid", "local", "mid"),
        help="what the window reads: the grid features (they see 54 pixels, so a place beside an item names it "
             "too), the CNN's third stage (local: 22 pixels, less than an item: an item word is right only with the "
             "window on the item), or the convolution after it (mid: 38 pixels, about an item); BENCHMARKS.md, "
             "captioning, compares them")
    naming: float | None = _soft_hard(
        None, when="glimpse", low=0,
        help="weight of a second reading of each item word in training, from the CNN's third stage (22 pixels seen) "
             "through the same window: it names the item only with the window on it, so its loss draws the "
             "attention onto the items (0 = off; default: 1 for soft with the glimpse)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="LSTMs: word embedding size")
    hidden_dim: int = option(128, low=1, applies=_RNN, help="LSTMs: decoder state size")
    attn_dim: int = option(128, low=1, applies=_ATTENDING_RNN, help="hidden size of the additive/MLP score")
    num_layers: int = option(2, low=1, applies=TRANSFORMER, help="transformer: decoder layers")
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
            raise OptionError(ref("widths") + " must be at least 4 channel counts (the grid has stride 8), got "
                              "{given}", "widths", given=self.widths)
        if self.image_size % 8:
            raise OptionError(ref("image_size") + " must be a multiple of 8, got {n}", "image_size", n=self.image_size)
        self.check_heads()

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
            if self.glimpse_features is None:
                self.glimpse_features = "grid"
            elif self.glimpse_features != "grid" and not self.glimpse:
                raise OptionError(ref("glimpse_features") + " {value!r} needs the glimpse (" + ref("glimpse") +
                                  "): it is what the glimpse reads", "glimpse_features", "glimpse",
                                  value=self.glimpse_features)
            if self.naming is None:
                self.naming = 1.0 if self.glimpse and self.model == "soft" else 0.0  # measured on soft
            if self.naming and not self.glimpse:
                raise OptionError(ref("naming") + " needs the glimpse (" + ref("glimpse") + "): the item words are "
                                  "read again through its window", "naming", "glimpse")
        if self.model == "soft" and self.doubly_stochastic is None:
            self.doubly_stochastic = 0.0 if scenes else 0.1

    @property
    def score_name(self) -> str:
        return self.score or ("scaled_dot" if self.model == "transformer" else "additive")


@dataclass
class CaptionSettings:
    """The settings of a captioning run's ``predict`` and ``evaluate`` (:class:`~qkv.apps.caption.Captioner`)."""

    beam: int = option(3, low=1, high=100, help="beam size (1 = greedy; evaluate's default: 1)")
    max_len: int = option(40, low=1, help="longest caption, in words")
    hard_test: str | None = option(None, choices=("expectation", "argmax"),
                                   help="hard attention: the expected context or the most likely location "
                                        "(default: as trained)")
    on_error: str | None = on_error_setting("bad captions (naming missing or unreadable images)")


def train_defaults(options: CaptionOptions):
    """The trainer's settings for captioning (the ``qkv train caption`` defaults)."""
    from ...train import TrainConfig

    return TrainConfig(epochs=8, batch_size=64, lr=3e-3, warmup_steps=100, schedule="cosine", weight_decay=0.01,
                       clip_norm=5.0, monitor="exact_match" if options.data == "scenes" else "bleu4")
