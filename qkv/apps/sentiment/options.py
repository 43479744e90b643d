"""Sentiment analysis's options (:class:`SentimentOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import OptionError, check_options, option, ref

__all__ = ["SentimentOptions", "SentimentSettings", "train_defaults", "MODELS"]

MODELS = ("bigru", "bilstm", "transformer", "bigram", "lm")
_RNN = {"model": ("bigru", "bilstm")}
_OWN_WORDS = {"model": ("bigru", "bilstm", "transformer", "bigram")}  # a vocabulary and vectors of their own
_LM = {"model": ("lm",)}
_NOT_TRANSFORMER = {"model": ("bigru", "bilstm", "bigram")}
_TRANSFORMER = {"model": ("transformer",)}


@dataclass
class SentimentOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("", help="movie-review file (id<TAB>rating<TAB>text) or a CSV/TSV file, .gz allowed")
    text_col: str | None = option(None, help="CSV/TSV: the text column (name or 0-based index)")
    label_col: str | None = option(None, help="CSV/TSV: the label column (name or 0-based index)")
    delimiter: str | None = option(None, help="CSV/TSV delimiter (default: tab for .tsv, else comma)")
    header: bool = option(True, help="CSV/TSV: the first row names the columns")
    labels: str | None = option(None, help="CSV/TSV: comma-separated known labels (others are bad rows)")
    on_error: str = option("raise", choices=("raise", "skip"), help="bad rows: stop, or skip and count them")
    regression: bool = option(False, help="predict the rating (MSE) instead of classes")
    # splits
    valid: float = option(0.1, low=0, low_open=True, high=0.5, help="fraction for validation")
    test: float = option(0.1, low=0, high=0.5, applies={"folds": (0,)},
                         help="fraction held out for the test (without folds)")
    folds: int = option(0, low=0, help="k-fold cross-validation: k runs, each testing on one fold (0 = one split)")
    fold: int = option(0, low=0, cli=False, help="the fold this task trains (set by the k-fold loop)")
    data_seed: int = option(0, low=0, help="seed of the splits (not of training)")
    # tokens
    min_freq: int = option(1, low=1, applies=_OWN_WORDS,
                           help="words seen fewer times in the training split become <unk>")
    max_vocab: int | None = option(30000, low=5, applies=_OWN_WORDS, help="vocabulary cap, special tokens included")
    max_len: int = option(100, low=1, help="tokens kept per text (lm: at most the language model's context - 1)")
    lowercase: bool = option(True, applies=_OWN_WORDS, help="lower-case the words")
    # model
    model: str | None = option(None, choices=MODELS, help="bigru, bilstm (attention pooling), transformer, bigram "
                               "(attention pooling over word + hashed bigram vectors, no recurrence), or lm (a "
                               "pretrained language model's body, from --init) (default: bigru; lm with --init)")
    init: str | None = option(None, help="lm: a language-model run (qkv train lm) to start from: its "
                              "tokenizer and Transformer body, fine-tuned with a classification head")
    lr_decay: float = option(1.0, low=1, applies=_LM, help="lm: discriminative learning rates: each layer below the "
                             "head learns at the rate of the one above divided by this (ULMFiT's 2.6; 1 = one rate, "
                             "the default: better on the language models trained here in minutes, BENCHMARKS.md)")
    unfreeze: float = option(0.0, low=0, applies=_LM, help="lm: gradual unfreezing: the head trains alone for this "
                             "many epochs, then one more layer from the top every this many epochs (ULMFiT's 1; 0 = "
                             "all at once, the default)")
    embed_dim: int | None = option(None, low=1, applies=_OWN_WORDS, help="word vector size (default: 128; bigram: 64; "
                                   "from the vectors file when given)")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNNs: output size, both directions together")
    attn_dim: int | None = option(None, low=1, applies=_NOT_TRANSFORMER, help="size of the attention-pooling "
                                  "keys (default: hidden-dim / 2 for the RNNs, embed-dim for bigram)")
    mlp_dim: int | None = option(None, low=1, applies=_NOT_TRANSFORMER, help="a hidden layer before the output")
    buckets: int | None = option(None, low=0, applies=_NOT_TRANSFORMER, help="hashed bigram vectors added to the word "
                          "vectors: their table's rows (0 = none; default: 30000 for bigram, 0 for the RNNs)")
    word_dropout: float = option(0.0, low=0, high=0.99, applies={"model": ("bigram",)},
                                 help="bigram: in training, leave each word out of the pooling with this probability")
    count_init: bool = option(False, applies={"model": ("bigram",)},
                              help="bigram: start the first vector dimensions from the words' and bigrams' naive-"
                              "Bayes log-count ratios in the training split (Wang & Manning 2012; classes only)")
    nbsvm: bool = option(False, applies=_OWN_WORDS, excludes={"regression": (True,)},
                         help="add a naive-Bayes-weighted bag of words and bigrams (Wang & Manning's NBSVM) to the "
                         "model's logits, learned with it (on the movie reviews it lifts the BiGRU above a bag-of-"
                         "words model: BENCHMARKS.md); the attention then explains the rest of the decision")
    nbsvm_buckets: int = option(300_000, low=1, requires=("nbsvm",),
                                help="the NBSVM path's hashed bigram rows (fewer rows: more bigrams share one)")
    bigram_hidden: int | None = option(None, low=1, applies={"model": ("bigram",)},
                                       help="bigram: a position-wise tanh layer of this size before the pooling")
    dim: int = option(64, low=2, applies=_TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=_TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=_TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")
    pooling: str = option("cls", choices=("cls", "attention"), applies=_TRANSFORMER,
                          help="transformer: a [CLS]-style query, or attention pooling")
    num_layers: int = option(1, low=1, applies=_OWN_WORDS, help="RNN or transformer layers")
    hops: int = option(1, low=1, help="attention-pooling queries (Lin et al. 2017 when > 1)")
    penalty: float = option(0.0, low=0, help="weight of Lin et al.'s ||AA^T - I||^2 penalty (needs hops > 1)")
    dropout: float = option(0.5, low=0, high=0.99, help="dropout")
    embed_dropout: float = option(0.5, low=0, high=0.99, applies=_OWN_WORDS, help="dropout on the word vectors")
    vectors: str | None = option(None, applies=_OWN_WORDS, help="pretrained word vectors (GloVe/word2vec text file)")
    freeze_vectors: bool = option(False, applies=_OWN_WORDS, help="keep the pretrained vectors fixed (needs "
                                  "vectors)")

    def __post_init__(self):
        if self.model is None:
            self.model = "lm" if self.init else "bigru"
        check_options(self)
        if self.init and self.model != "lm":
            raise OptionError(ref("init") + " goes with model lm (a language model's body), not model {model}", "init",
                              model=self.model)
        if self.model == "lm" and not self.init:
            raise OptionError(ref("model") + " lm starts from a language model: give " + ref("init") +
                              " (a run of the lm application)", "model", "init")
        if (self.text_col is None) != (self.label_col is None):
            raise OptionError("give both " + ref("text_col") + " and " + ref("label_col") + " (or neither, for the "
                              "movie-review format)", "text_col", "label_col")
        if self.text_col is None and (self.delimiter is not None or not self.header or self.labels is not None):
            raise OptionError(ref("delimiter") + ", header and labels are for CSV/TSV files: give " + ref("text_col") +
                              " and " + ref("label_col"), "delimiter", "text_col", "label_col")
        if self.folds and not (self.folds >= 2 and self.fold < self.folds):
            raise OptionError(ref("folds") + " must be >= 2 with 0 <= fold < folds, got " + ref("folds") + "={n}, "
                              + ref("fold") + "={k}", "folds", "fold", n=self.folds, k=self.fold)
        if self.model == "transformer" and self.pooling == "cls" and self.hops != 1:
            raise OptionError(ref("hops") + " needs attention pooling: add " + ref("pooling") + " attention for the "
                              "transformer", "hops", "pooling")
        if self.penalty and self.hops < 2:
            raise OptionError(ref("penalty") + "={p} needs hops > 1 (the penalty is on several attention rows)",
                              "penalty", p=self.penalty)
        if self.freeze_vectors and not self.vectors:
            raise OptionError(ref("freeze_vectors") + " needs " + ref("vectors") + " (a word-vector file)",
                              "freeze_vectors", "vectors")
        if self.model == "transformer" and self.dim % self.num_heads:
            raise OptionError(ref("num_heads") + " ({heads}) must divide dim ({dim})", "num_heads",
                              heads=self.num_heads, dim=self.dim)
        if self.count_init and (self.bigram_hidden or self.hops != 1):
            raise OptionError(ref("count_init") + " needs the bigram model without " + ref("bigram_hidden") +
                              " and with " + ref("hops") + "=1", "count_init", "bigram_hidden", "hops")
        if self.model == "bigram" and self.num_layers != 1:
            raise OptionError(ref("num_layers") + "={n}: the bigram model has no layers to stack (RNN or transformer "
                              "only)", "num_layers", n=self.num_layers)
        if self.model in ("bigru", "bilstm") and self.hidden_dim % 2:
            raise OptionError(ref("hidden_dim") + " ({n}) must be even: it is split between two directions",
                              "hidden_dim", n=self.hidden_dim)


@dataclass
class SentimentSettings:
    """The settings of a sentiment run's ``predict`` and ``evaluate``: none (a classifier reads a text one way)."""


def train_defaults(options: SentimentOptions):
    """The trainer's settings for sentiment (the ``qkv train sentiment`` defaults), per model: the bigram model's
    from the search recorded in BENCHMARKS.md (``benchmarks/sentiment.py --set``), the language model's body a short
    fine-tuning, the others the BiGRU's."""
    from ...train import TrainConfig

    if options.model == "lm":  # fine-tuning a pretrained body: few epochs, a short warm-up, 1e-3 (BENCHMARKS.md)
        return TrainConfig(epochs=4, batch_size=32, lr=1e-3, weight_decay=0.01, schedule="cosine", warmup_steps=50,
                           patience=0, monitor="accuracy")
    if options.model == "bigram":
        return TrainConfig(epochs=20, batch_size=100, lr=1e-2, weight_decay=0.05, schedule="cosine", patience=0,
                           monitor="accuracy")
    return TrainConfig(epochs=12, batch_size=50, lr=3e-3, weight_decay=0.05, schedule="cosine", patience=3,
                       monitor="accuracy")
