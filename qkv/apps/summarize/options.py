"""Summarisation's options (:class:`SummarizeOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import OptionError, check_options, option, ref
from ..option_groups import TRANSFORMER, LMFusionSettings, TransformerOptions, check_even_hidden, on_error_setting

__all__ = ["SummarizeOptions", "SummarizeSettings", "train_defaults", "MODELS", "DEBIAN_FILE"]

MODELS = ("pointer", "seq2seq", "transformer")
#: where ``--data debian`` reads the package descriptions unless ``--debian-file`` says otherwise
DEBIAN_FILE = "../shared/data/debian-descriptions.jsonl.gz"
_GENERATED = ("debian", "facts")
_RNN = {"model": ("pointer", "seq2seq")}
_FACTS = {"data": ("facts",)}


@dataclass
class SummarizeOptions(TransformerOptions):
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("debian", help="'debian' (package descriptions -> synopses), 'facts' (question + passage "
                                      "-> answer) or a JSON Lines / CSV / TSV file or a directory of CNN/DailyMail "
                                      ".story files")
    debian_file: str = option(DEBIAN_FILE, applies={"data": ("debian",)},
                              help="debian: the descriptions file (JSON Lines of package, summary, text)")
    format: str = option("auto", choices=("auto", "jsonl", "csv", "tsv", "stories"), excludes={"data": _GENERATED},
                         help="file: its format (auto: by the name; a directory is CNN/DailyMail stories)")
    source_column: str = option("text", excludes={"data": _GENERATED}, help="file: the column of the texts")
    target_column: str = option("summary", excludes={"data": _GENERATED}, help="file: the column of the summaries")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_FACTS,
                           help="bad rows: stop with file:line, or skip and count them")
    max_examples: int | None = option(None, low=1, excludes=_FACTS,
                                      help="read at most this many examples (whole near-duplicate families)")
    lang: str = option("both", choices=("en", "zh", "both"), applies=_FACTS,
                       help="facts: English, Chinese, or both mixed half and half")
    n_train: int = option(20_000, low=1, applies=_FACTS, help="facts: training questions")
    n_eval: int = option(1_000, low=2, applies=_FACTS, help="facts: questions in valid, test and test_phrasings each")
    data_seed: int = option(0, low=0, help="seed of the split (and of the facts' generation)")
    # tokens
    vocab_size: int = option(20_000, low=8, help="most frequent words kept (the rest are <unk>, or copied)")
    min_freq: int = option(2, low=1, help="words seen fewer times in training are outside the vocabulary")
    max_source: int = option(120, low=1, help="source words read (the rest are cut)")
    max_target: int = option(30, low=1, help="target words trained on (the rest are cut)")
    # model
    model: str = option("pointer", choices=MODELS,
                        help="pointer (See et al.'s pointer-generator), seq2seq (the same without copying) or "
                             "transformer (copy attention from its last cross-attention layer)")
    embed_dim: int = option(128, low=1, applies=_RNN, help="pointer/seq2seq: word embedding size")
    hidden_dim: int = option(256, low=2, applies=_RNN, help="pointer/seq2seq: decoder state and encoder output "
                                                            "(both directions together)")
    attn_dim: int | None = option(None, low=1, applies=_RNN, help="hidden size of the additive score "
                                                                  "(default: hidden-dim)")
    score: str | None = option(None, choices=("additive", "general"), applies=_RNN,
                               help="pointer/seq2seq: the attention score, Bahdanau's additive or Luong's general "
                                    "(s^T W h; not with coverage); default: general for facts without coverage "
                                    "(after 3 minutes: 39 against 29-30 per cent exact), additive otherwise")
    oov_slots: int | None = option(None, low=0, applies={"model": ("pointer",)},
                                   help="pointer: the first N distinct source words outside the vocabulary are read "
                                        "as N learned slots instead of all as <unk>, so a name of the question "
                                        "matches the same name in the passage (default: 32 for facts, 0 else)")
    reader_layers: int | None = option(None, low=0, applies={"model": ("pointer", "seq2seq")},
                                       help="pointer/seq2seq: Transformer layers (self-attention + feed-forward) over "
                                            "the encoder's outputs, so that a passage word can match the question's "
                                            "words (default: 0)")
    num_layers: int = option(2, low=1, applies=TRANSFORMER, help="transformer: layers in each stack")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # coverage
    coverage_from: float | None = option(None, low=0, applies={"model": ("pointer",)},
                                         help="pointer: when coverage enters the attention and the coverage loss "
                                              "is added: a training step (1 or more; 0: from the start), or a "
                                              "fraction below 1 of the training (of --max-minutes, else of the "
                                              "steps: 0.75 = the last quarter); none: no coverage")
    coverage_weight: float = option(1.0, low=0, applies={"model": ("pointer",)},
                                    help="pointer: weight of the coverage loss (See et al.: 1)")
    # evaluation
    eval_beam: int = option(1, low=1, help="beam of the evaluations during training (1 = greedy)")
    eval_max: int = option(500, low=1, help="examples decoded per evaluation")
    max_decode_len: int = option(40, low=1, help="longest output decoded, in words")

    def __post_init__(self):
        check_options(self)
        self.check_heads()
        check_even_hidden(self)
        c = self.coverage_from
        if c is not None and c >= 1 and c != int(c):
            raise OptionError(ref("coverage_from") + " must be a step (a whole number) or a fraction below 1, got {c}",
                              "coverage_from", c=c)
        if self.score == "general" and self.coverage_from is not None:
            raise OptionError(ref("coverage_from") + " needs " + ref("score") + " additive (coverage is a feature of "
                              "the additive score)", "coverage_from", "score")
        if self.coverage_weight != 1.0 and self.coverage_from is None:
            raise OptionError(ref("coverage_weight") + " needs " + ref("coverage_from") + " (the step from which "
                              "coverage is trained)", "coverage_weight", "coverage_from")

    @property
    def score_name(self) -> str:
        """``score``, or its default: general for ``facts`` without coverage, additive otherwise."""
        if self.score is not None:
            return self.score
        return "general" if self.data == "facts" and self.coverage_from is None else "additive"

    @property
    def slots(self) -> int:
        """``oov_slots``, or its default: 32 for ``facts``, 0 otherwise (and for models other than pointer)."""
        if self.model != "pointer":
            return 0
        return self.oov_slots if self.oov_slots is not None else 32 if self.data == "facts" else 0

    @property
    def coverage_fraction(self) -> float | None:
        """``coverage_from`` when it is a fraction of the training (between 0 and 1, both excluded), else None."""
        c = self.coverage_from
        return float(c) if c is not None and 0 < c < 1 else None

    @property
    def coverage(self) -> bool:
        """Whether the model has coverage (``coverage_from`` is set)."""
        return self.coverage_from is not None

    @property
    def generated(self) -> bool:
        return self.data in _GENERATED


@dataclass
class SummarizeSettings(LMFusionSettings):
    """The settings of a summarisation run's ``predict`` and ``evaluate`` (:class:`~qkv.apps.summarize.Summarizer`),
    and a language model fused into the beam (:class:`~qkv.apps.option_groups.LMFusionSettings`)."""

    beam: int = option(4, low=1, high=100, help="beam size (1 = greedy)")
    max_len: int | None = option(None, low=1, help="longest summary, in words (default: the run's max_decode_len)")
    min_len: int = option(0, low=0, help="predict: shortest summary, in words")
    length_penalty: float = option(0.0, low=0, excludes={"beam": (1,)},
                                   help="beam > 1: Wu et al.'s alpha, ranks longer summaries higher")
    coverage_penalty: float = option(0.0, low=0, excludes={"beam": (1,)},
                                     help="beam > 1: Wu et al.'s beta, ranks summaries that cover the source higher")
    no_repeat_ngram_size: int = option(3, low=0, flag="--no-repeat-ngram",
                                       help="forbid repeating any n-gram of this size (0: off)")
    baselines: bool = option(True, help="evaluate: the ROUGE of the lead sentence and of the first 8 words too")
    on_error: str | None = on_error_setting("bad rows")


def train_defaults(options: SummarizeOptions):
    """The trainer's settings for summarisation (the ``qkv train summarize`` defaults)."""
    from ...train import TrainConfig

    facts = options.data == "facts"
    return TrainConfig(epochs=10 if facts else 5, batch_size=32, lr=1e-3, warmup_steps=100, schedule="cosine",
                       weight_decay=0.0, clip_norm=2.0, monitor="exact_match" if facts else "rougeL",
                       final_splits=("valid", "test", "test_phrasings") if facts else ("valid", "test"))
