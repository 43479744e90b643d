"""Segmentation's options (:class:`SegmentOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import OptionError, check_options, option, ref

__all__ = ["SegmentOptions", "SegmentSettings", "train_defaults", "MODELS"]

MODELS = ("bisenet", "fcn")
_SCENES = {"data": ("scenes",)}
_BISENET = {"model": ("bisenet",)}


@dataclass
class SegmentOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("scenes", help="'scenes' (generated Fashion-MNIST scenes with label maps) or a folder of "
                       "images with label PNGs (images/ + labels/, or VOC's JPEGImages/ + SegmentationClass/)")
    n_train: int = option(10_000, low=1, applies=_SCENES, help="generated training scenes")
    n_valid: int = option(500, low=1, applies=_SCENES, help="generated validation scenes")
    n_test: int = option(1_000, low=1, applies=_SCENES, help="generated test scenes")
    scenes_root: str | None = option(None, applies=_SCENES, help="Fashion-MNIST IDX folder for the scenes "
                                     "(default: /usr/share/datasets/fashion-mnist, else scikit-learn digits)")
    image_size: int = option(128, low=8, excludes=_SCENES, help="folder: images and labels are resized to this "
                             "square (labels by nearest neighbour)")
    grey: bool = option(False, excludes=_SCENES, help="folder: read the images as grey (scenes always are)")
    num_classes: int | None = option(None, low=2, high=255, excludes=_SCENES,
                                     help="folder: classes 0..N-1 (default: classes.txt's lines, else the largest "
                                          "label + 1); a larger label is an error naming its PNG")
    ignore_index: int = option(255, low=0, high=255, help="the label of pixels not scored (VOC's borders)")
    valid: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_SCENES,
                          help="folder without train/ test/: share of the pairs for validation")
    test: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_SCENES,
                         help="folder without train/ test/: share of the pairs for the test")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_SCENES,
                           help="folder: a missing, corrupt or mismatched label PNG: raise (naming it) or skip and "
                                "count")
    flip: bool = option(False, excludes=_SCENES, help="folder: random left-right flips in training (scenes have "
                        "none: a flip would move items into their held-out cells)")
    data_seed: int = option(0, low=0, help="seed of the data's generation and split (not of training)")
    # model
    model: str = option("bisenet", choices=MODELS, help="bisenet (BiSeNet V1) or fcn (FCN-8s on the same backbone)")
    arm: bool = option(True, applies=_BISENET, help="bisenet: the attention refinement modules at 1/16 and 1/32 "
                       "(--no-arm: the ablation without them)")
    ffm: bool = option(True, applies=_BISENET, excludes={"context_only": (True,)},
                       help="bisenet: the feature fusion module (--no-ffm: the two paths concatenated)")
    context_only: bool = option(False, applies=_BISENET, help="bisenet: the context path only (no spatial path, no "
                                "fusion)")
    widths: tuple[int, ...] = option((64, 128, 256, 512), low=1, help="channels of the backbone's four stages")
    blocks: tuple[int, ...] = option((2, 2, 2, 2), low=1, help="residual blocks per stage (ResNet-18: 2,2,2,2)")
    spatial_widths: tuple[int, ...] = option((64, 64, 128), low=1, applies=_BISENET,
                                             excludes={"context_only": (True,)},
                                             help="bisenet: channels of the spatial path's three convolutions")
    dim: int = option(128, low=1, applies=_BISENET, help="bisenet: channels of the context path")
    head_dim: int = option(64, low=1, help="hidden channels of the segmentation heads")
    aux_weight: float = option(1.0, low=0, applies=_BISENET,
                               help="bisenet: weight of the two auxiliary heads' losses (0: no auxiliary heads)")
    padding: str | None = option(None, choices=("zeros", "circular"),
                                 help="the convolutions' padding; circular: an item gives the same features in "
                                      "every cell, so none can say where it is (default: circular on scenes, zeros "
                                      "otherwise)")
    eval_batch: int = option(64, low=1, help="images per forward pass in evaluation")

    def __post_init__(self):
        self.widths, self.blocks = tuple(self.widths), tuple(self.blocks)
        self.spatial_widths = tuple(self.spatial_widths)
        check_options(self)
        for name, n in (("widths", 4), ("blocks", 4), ("spatial_widths", 3)):
            if len(getattr(self, name)) != n:
                raise OptionError(ref(name) + " must be {n} numbers, got {given}", name, n=n, given=getattr(self, name))
        if self.num_classes is not None and self.ignore_index < self.num_classes:
            raise OptionError(ref("ignore_index") + " {i} is one of the {n} classes", "ignore_index",
                              i=self.ignore_index, n=self.num_classes)

    @property
    def padding_mode(self) -> str:
        """The padding actually used: ``padding``, or circular on scenes and zeros otherwise."""
        return self.padding or ("circular" if self.data == "scenes" else "zeros")

    @property
    def variant(self) -> str:
        """``bisenet``, ``bisenet-noarm``, ``bisenet-noffm``, ``bisenet-context`` (with the others' names joined
        when several are off) or ``fcn``."""
        if self.model == "fcn":
            return "fcn"
        off = [n for n, on in (("noarm", self.arm), ("noffm", self.ffm or self.context_only),
                               ("context", not self.context_only)) if not on]
        return "-".join(["bisenet", *off])


@dataclass
class SegmentSettings:
    """The settings of a segmentation run's ``predict`` and ``evaluate``: none (each image is read at its own
    size)."""


def train_defaults(options: SegmentOptions):
    """The trainer's settings for segmentation (the ``qkv train segment`` defaults)."""
    from ...train import TrainConfig

    return TrainConfig(epochs=20, batch_size=32, lr=2e-3, weight_decay=1e-4, schedule="cosine", warmup_steps=50,
                       monitor="miou")
