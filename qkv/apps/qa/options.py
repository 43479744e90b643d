"""Question answering's options (:class:`QAOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import OptionError, check_options, option, ref
from ..option_groups import TransformerOptions, check_even_hidden, on_error_setting

__all__ = ["QAOptions", "QASettings", "train_defaults", "MODELS"]

MODELS = ("reader", "bidaf", "transformer")
_RNN = {"model": ("reader", "bidaf")}
_FACTS = {"data": ("facts",)}


@dataclass
class QAOptions(TransformerOptions):
    """What to train on and which reader; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("facts", help="'facts' (generated) or a SQuAD v1.1 .json / context<TAB>question<TAB>answer "
                                     "file, .gz allowed")
    lang: str = option("both", choices=("en", "zh", "both"), applies=_FACTS,
                       help="facts: English, Chinese, or both mixed half and half (one model reads both)")
    n_train: int = option(20_000, low=1, applies=_FACTS, help="facts: training questions")
    n_eval: int = option(1_000, low=1, applies=_FACTS, help="facts: questions in valid, test and test_phrasings each")
    entities: int = option(600, low=30, applies=_FACTS, help="facts: training names of each kind")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_FACTS,
                           help="answers that are not spans of their context: stop, or skip and count them")
    valid: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_FACTS, help="file: fraction of contexts "
                          "for validation")
    test: float = option(0.1, low=0, low_open=True, high=0.5, excludes=_FACTS, help="file: fraction of contexts "
                         "for the test")
    data_seed: int = option(0, low=0, help="seed of the facts' generation and of a file's split")
    # tokens
    tokenizer: str = option("auto", choices=("auto", "word", "char"),
                            help="auto = word: Latin words and numbers whole, every CJK character a token of its "
                                 "own, full-width forms normalised (one model reads English and Chinese); char = "
                                 "every character")
    min_freq: int = option(1, low=1, help="words seen fewer times in training become <unk>")
    max_context: int = option(400, low=1, help="context tokens read at once: a longer context is read in "
                                                "overlapping windows of this many tokens")
    doc_stride: int | None = option(None, low=1, help="long contexts: tokens from one window's start to the next's "
                                                      "(default max_context // 2: windows overlap by half)")
    max_question: int = option(64, low=1, help="question tokens read (a longer question is cut, with a warning)")
    word_dropout: float = option(0.1, low=0, high=0.9, help="training: each distinct token of an example becomes "
                                 "<unk> with this probability (as unseen names will be)")
    rare_dropout: float = option(0.0, low=0, help="training: a token seen n times in the training texts also becomes "
                                 "<unk> with probability a / (a + n) for this a (Kiperwasser and Goldberg 2016): rare "
                                 "words, names above all, are met unknown as unseen names will be; 0: off")
    match_feature: bool = option(True, help="flag the context tokens that occur in the question")
    case_feature: bool = option(True, help="flag the context tokens that start with a capital letter: where a name "
                                "the vocabulary has never seen begins and ends")
    # model
    model: str = option("reader", choices=MODELS, help="reader (Attentive Reader), bidaf or transformer")
    score: str | None = option(None, help="attention score, any qkv score name (default: general for the RNN "
                                          "readers, scaled_dot for the transformer)")
    embed_dim: int = option(64, low=1, applies=_RNN, help="RNN readers: token embedding size")
    hidden_dim: int = option(128, low=2, applies=_RNN, help="RNN readers: BiGRU output, both directions together")
    num_layers: int | None = option(None, low=1, help="BiGRU layers (default 1) or transformer layers (default 3)")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # evaluation
    max_answer_len: int = option(20, low=1, help="longest answer decoded, in tokens")
    eval_max: int = option(1000, low=1, help="questions answered per evaluation")

    def __post_init__(self):
        check_options(self)
        self.check_heads()
        check_even_hidden(self)
        if self.doc_stride is not None and self.doc_stride > self.max_context:
            raise OptionError(ref("doc_stride") + " ({stride}) must be at most " + ref("max_context") + " ({most}): "
                              "windows further apart would skip tokens", "doc_stride", "max_context",
                              stride=self.doc_stride, most=self.max_context)

    @property
    def score_name(self) -> str:
        return self.score or ("scaled_dot" if self.model == "transformer" else "general")

    @property
    def stride(self) -> int:
        """Tokens between the starts of a long context's windows."""
        return self.doc_stride or max(1, self.max_context // 2)

    @property
    def layers(self) -> int:
        return self.num_layers or (3 if self.model == "transformer" else 1)


@dataclass
class QASettings:
    """The settings of a question-answering run's ``evaluate`` (:class:`~qkv.apps.qa.Reader`); ``predict`` takes
    none."""

    on_error: str | None = on_error_setting("bad answers (not spans of their context)")


def train_defaults(options: QAOptions):
    """The trainer's settings for question answering (the ``qkv train qa`` defaults)."""
    from ...train import TrainConfig

    splits = ("valid", "test", "test_phrasings") if options.data == "facts" else ("valid", "test")
    # the facts vary verbs, names and phrasings: 8 epochs of them (the Transformer learns to point more slowly)
    epochs = 10 if options.model == "transformer" else 8 if options.data == "facts" else 3
    return TrainConfig(epochs=epochs, batch_size=32, lr=2e-3, warmup_steps=100, schedule="cosine", weight_decay=0.01,
                       monitor="exact_match", final_splits=splits)
