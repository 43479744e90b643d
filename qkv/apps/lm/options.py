"""The language model's options (:class:`LMOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...models.lm import LM_POSITIONS
from ...options import OptionError, check_options, option, ref
from ...train.rng import MAX_SEED

__all__ = ["LMOptions", "LMSettings", "train_defaults", "budget_defaults", "ARCHITECTURE"]

#: the options that a run going on from another (``init``) takes from it: its tokenizer and its model's shape
ARCHITECTURE = ("tokenizer", "vocab_size", "context", "dim", "num_heads", "kv_heads", "num_layers", "ffn_dim",
                "positions", "score", "reverse")


@dataclass
class LMOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("tatoeba", help="'tatoeba' or 'debian' (the corpora beside the project), or a text file "
                       "(one document per line), .jsonl or .tsv; .gz allowed")
    column: str | None = option(None, help=".jsonl: the field of the text (default text); .tsv: its 0-based column "
                                "(default 0)")
    max_documents: int | None = option(None, low=3, help="read at most this many documents")
    data_seed: int = option(0, low=0, help="seed of the split into train/valid/test (not of training)")
    tokenizer: str = option("char", choices=("char", "bpe", "unigram", "word"),
                            help="characters (bits per character are exact), or subwords/words")
    vocab_size: int = option(2000, low=8, excludes={"tokenizer": ("char", "word")}, help="subword vocabulary size")
    # model
    context: int = option(128, low=2, help="tokens the model reads at once (training windows; the most it reads "
                          "with learned or sinusoidal positions; 64 under a budget of 10 minutes or less)")
    dim: int = option(128, low=2, help="model width (96 under a budget of 10 minutes or less)")
    num_heads: int = option(4, low=1, help="attention heads")
    kv_heads: int | None = option(None, low=1, help="key/value heads (grouped-query attention; default num-heads)")
    num_layers: int = option(4, low=1, help="Transformer layers (3 under a budget of 10 minutes or less)")
    ffn_dim: int | None = option(None, low=1, help="feed-forward width (default: 4 x dim)")
    positions: str = option("learned", choices=LM_POSITIONS, help="learned or sinusoidal positions added to the "
                            "embeddings, or ALiBi (a bias on the scores; reads past the context)")
    score: str = option("scaled_dot", help="attention score, any qkv score name")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout (0 under a budget of 10 minutes or less)")
    reverse: bool = option(False, help="a backward model: every document read from its last token to its first "
                           "(ULMFiT's second model, averaged with a forward one for classification); qkv generate "
                           "then writes what comes before the prompt, and a classifier from it (--init) reads texts "
                           "backwards")
    init: str | None = option(None, help="a language-model run (qkv train lm) to go on from: its tokenizer, "
                              "architecture and weights, trained further on --data (the text of a target domain "
                              "before fine-tuning a classifier on it: ULMFiT's second stage); the architecture and "
                              "tokenizer options are the run's")
    # evaluation
    eval_tokens: int = option(100_000, low=1, help="at most this many tokens of a split scored per evaluation")

    def __post_init__(self):
        check_options(self)
        if self.dim % self.num_heads:
            raise OptionError(ref("num_heads") + " ({heads}) must divide " + ref("dim") + " ({d})", "num_heads",
                              "dim", heads=self.num_heads, d=self.dim)
        if self.kv_heads is not None and self.num_heads % self.kv_heads:
            raise OptionError(ref("kv_heads") + " ({kv}) must divide " + ref("num_heads") + " ({heads})", "kv_heads",
                              "num_heads", kv=self.kv_heads, heads=self.num_heads)


@dataclass
class LMSettings:
    """The settings of a language model's ``predict`` (generation) and ``evaluate`` (bits per character)
    (:class:`~qkv.apps.lm.LanguageModel`)."""

    max_new_tokens: int = option(200, low=1, help="the most tokens written after each prompt")
    temperature: float = option(1.0, low=0, low_open=True, applies={"greedy": (False,)},
                                help="sampling: divide the logits by this (below 1: safer, above: more varied)")
    top_k: int | None = option(None, low=1, applies={"greedy": (False,)},
                               help="sampling: only the k most likely tokens")
    top_p: float | None = option(None, low=0, low_open=True, high=1, applies={"greedy": (False,)},
                                 help="sampling: only the most likely tokens whose probability reaches p (nucleus)")
    greedy: bool = option(False, help="the most likely token at each step instead of sampling")
    seed: int | None = option(0, low=0, high=MAX_SEED, help="sampling: the same seed writes the same text (None: a "
                              "fresh draw)")
    max_tokens: int | None = option(None, low=1, help="evaluate: at most this many tokens (default: the run's "
                                    "eval_tokens)")


def train_defaults(options: LMOptions):
    """The trainer's settings for the language model (the ``qkv train lm`` defaults): AdamW with warm-up and a
    cosine decay; the best run is the one of lowest bits per character (or per token) on valid."""
    from ...train import TrainConfig

    return TrainConfig(epochs=10, batch_size=32, lr=2e-3, warmup_steps=100, schedule="cosine", weight_decay=0.1,
                       monitor="bpc", mode="min", eval_every=500)


def budget_defaults(options: LMOptions, config) -> dict:
    """The model's size for the run's budget, ``config`` a :class:`qkv.train.TrainConfig` (``qkv train lm`` applies it
    under the flags given): a budget of at most 10 minutes gets width 96, 3 layers, a context of 64 and no dropout (a
    model that sees each character a few times underfits: dropout only slows it), which reach 1.74 test bits per
    character on Tatoeba in 5 minutes of one core where dropout 0.1 reaches 2.14, and the dataclass defaults (128, 4
    layers, context 128) 3.1 (``benchmarks/lm.py``, BENCHMARKS.md); longer budgets, or none, keep the defaults. A run
    that goes on from another (``init``) has that run's size."""
    if options.init is not None:
        return {}
    if config.max_minutes is not None and config.max_minutes <= 10:
        return {"dim": 96, "num_layers": 3, "context": 64, "dropout": 0.0}
    return {"dim": 128, "num_layers": 4, "context": 128}
