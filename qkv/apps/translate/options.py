"""Translation's options (:class:`TranslateOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import check_options, option
from ..option_groups import TRANSFORMER, LMFusionSettings, TransformerOptions

__all__ = ["TranslateOptions", "TranslateSettings", "train_defaults", "budget_defaults", "MODELS", "RNN_MODELS"]

MODELS = ("fixed", "bahdanau", "luong", "transformer")
RNN_MODELS = ("fixed", "bahdanau", "luong")
_RNN = {"model": RNN_MODELS}
_CORPUS = {"data": ("dates",)}  # as excludes: options of a corpus file


@dataclass
class TranslateOptions(TransformerOptions):
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("dates", help="'dates' (generated) or a source<TAB>target[<TAB>...] file, .gz allowed")
    src_lang: str | None = option(None, excludes=_CORPUS, help="source language of a corpus (picks the direction)")
    reverse: bool = option(False, excludes=_CORPUS, help="swap the corpus columns")
    max_pairs: int | None = option(None, low=1, excludes=_CORPUS, help="cap on corpus pairs (whole source groups)")
    max_length: int | None = option(20, low=1, excludes=_CORPUS, help="drop corpus pairs longer than this (words)")
    tokenizer: str = option("auto", choices=("auto", "char", "bpe", "unigram", "word"),
                            help="auto = char for dates, bpe for corpora")
    vocab_size: int = option(4000, low=8, excludes={"tokenizer": ("char", "word")},
                             help="subword vocabulary size of each side")
    n_train: int = option(50_000, low=1, applies={"data": ("dates",)}, help="generated training dates")
    n_eval: int = option(1_000, low=1, applies={"data": ("dates",)}, help="generated valid and test dates, each")
    data_seed: int = option(0, low=0, help="seed of the data's generation and split (not of training)")
    # model
    model: str = option("bahdanau", choices=MODELS, help="fixed (no attention), bahdanau, luong or transformer")
    score: str | None = option(None, applies={"model": ("bahdanau", "luong", "transformer")},
                               help="attention score, any qkv score name (default: additive for bahdanau, "
                                    "general for luong, scaled_dot for the transformer)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="RNNs: token embedding size")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNNs: decoder state and encoder output size")
    attn_dim: int | None = option(None, low=1, applies={"model": ("bahdanau", "luong")},
                                  help="hidden size of the additive/MLP score (default: hidden-dim)")
    cell: str = option("gru", choices=("gru", "lstm"), applies=_RNN, help="RNNs: recurrent cell")
    positions: str = option("sinusoidal", choices=("sinusoidal", "learned", "alibi", "relative"),
                            applies=TRANSFORMER, help="transformer: position encoding: added to the embeddings "
                            "(sinusoidal, learned) or a bias on the self-attention scores (alibi, relative = T5's)")
    num_layers: int = option(1, low=1, help="RNN layers, or transformer layers in each stack")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # loss and evaluation
    label_smoothing: float = option(0.1, low=0, high=0.99, help="label smoothing of the cross-entropy")
    eval_beam: int = option(1, low=1, help="beam of the evaluations during training (1 = greedy)")
    eval_max: int = option(1000, low=1, help="source sentences decoded per evaluation (each scored against all of "
                                            "its translations in the split)")
    max_decode_len: int = option(64, low=1, help="longest translation decoded in evaluations")

    def __post_init__(self):
        check_options(self)
        self.check_heads()

    @property
    def score_name(self) -> str:
        if self.score:
            return self.score
        return {"bahdanau": "additive", "luong": "general", "transformer": "scaled_dot"}.get(self.model, "additive")

    @property
    def tokenizer_kind(self) -> str:
        if self.tokenizer != "auto":
            return self.tokenizer
        return "char" if self.data == "dates" else "bpe"


@dataclass
class TranslateSettings(LMFusionSettings):
    """The settings of a translation run's ``predict`` and ``evaluate`` (:class:`~qkv.apps.translate.Translator`),
    and a language model fused into the beam (:class:`~qkv.apps.option_groups.LMFusionSettings`)."""

    beam: int = option(5, low=1, high=100, help="beam size (1 = greedy)")
    max_len: int | None = option(None, low=1, help="longest translation, in tokens (default: 100; evaluate: the "
                                 "run's max_decode_len)")
    length_penalty: float = option(0.6, low=0, help="the beam's length normalisation alpha (GNMT's)")
    buckets: str | None = option("0,10,20,30,40,60", help="evaluate: edges of the source-length buckets")
    length_unit: str = option("tokens", choices=("tokens", "words"), help="evaluate: unit of the source lengths")


def train_defaults(options: TranslateOptions):
    """The trainer's settings for translation (the ``qkv train translate`` defaults)."""
    from ...train import TrainConfig

    # corpora: the recorded search (benchmarks/translate_presets.py, BENCHMARKS.md) kept this peak and warm-up: 3e-3
    # helped with 8,000 subwords but, with the 4,000 of the defaults, trained worse (loss 4.19 against 3.56 at step
    # 2,000, twice the gradient norm)
    return TrainConfig(epochs=10, batch_size=64, lr=2e-3, warmup_steps=200, schedule="cosine", weight_decay=0.01,
                       monitor="exact_match" if options.data == "dates" else "bleu")


def budget_defaults(options: TranslateOptions, config) -> dict:
    """The Transformer's size for a corpus and the run's budget, ``config`` a :class:`qkv.train.TrainConfig`
    (``qkv train translate`` applies it under the flags given).

    Any budget (``max_minutes`` or ``max_steps``) keeps the dataclass defaults (width 128, one layer each side): in 5
    and in 30 minutes on one core they reached more BLEU than two layers of width 256, which take about four times as
    long over a step and were no better at the same 3,214 steps. With no budget (the epochs end the run: hours on a
    CPU) the larger model has the steps it needs. Found by ``benchmarks/translate_presets.py`` (BENCHMARKS.md).
    Dates and RNNs: one size for all."""
    if options.data == "dates" or options.model != "transformer":
        return {}
    if config.max_minutes is not None or config.max_steps is not None:
        return {}
    return {"dim": 256, "num_layers": 2}
