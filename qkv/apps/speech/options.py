"""Speech recognition's options (:class:`SpeechOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import OptionError, check_options, option, ref
from ..option_groups import TRANSFORMER, LMFusionSettings, TransformerOptions, on_error_setting

__all__ = ["SpeechOptions", "SpeechSettings", "train_defaults", "MODELS", "GENERATED"]

MODELS = ("las", "ctc", "transformer")
GENERATED = ("digits", "sentences")
_GEN = {"data": GENERATED}
_LAS = {"model": ("las",)}
_LISTENER = {"model": ("las", "ctc")}
_ATTENTION = {"model": ("las", "transformer")}
#: per generated corpus: train, valid, test and long utterances
_SIZES = {"digits": (3000, 100, 200, 100), "sentences": (8000, 200, 300, 100)}


@dataclass
class SpeechOptions(TransformerOptions):
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("digits", help="'digits' or 'sentences' (spoken by espeak-ng and flite), a manifest "
                       "(TSV/CSV: audio path, transcript; Common Voice's columns work) or a LibriSpeech folder")
    text: str | None = option(None, applies={"data": ("sentences",)}, help="sentences: a text file, one sentence "
                              "per line (default: the English side of ../shared/data/tatoeba-eng-fra.tsv.gz)")
    cache: str | None = option(None, applies=_GEN, help="folder of the generated audio (default: "
                               "$QKV_CACHE/speech or ~/.cache/qkv/speech)")
    n_train: int | None = option(None, low=1, applies=_GEN, help="generated training utterances (default: 3000 "
                                 "digits, 8000 sentences)")
    n_valid: int | None = option(None, low=1, applies=_GEN, help="generated validation utterances (default 100/200)")
    n_test: int | None = option(None, low=1, applies=_GEN, help="generated test utterances, held-out voices and "
                                "texts (default 200/300)")
    n_long: int | None = option(None, low=0, applies=_GEN, help="generated 'long' utterances: 2-3 test texts "
                                "joined, longer than any training one (default 100)")
    on_error: str = option("raise", choices=("raise", "skip"), excludes=_GEN,
                           help="a bad manifest row or audio file (missing, corrupt, empty, too short): stop with "
                                "file:line, or skip and count it")
    valid: float = option(0.05, low=0, low_open=True, high=0.5, excludes=_GEN, help="share of speakers (or "
                          "sentences) for valid")
    test: float = option(0.05, low=0, low_open=True, high=0.5, excludes=_GEN, help="share of speakers (or "
                         "sentences) for test")
    data_seed: int = option(0, low=0, help="seed of the data's generation and split (not of training)")
    n_mels: int = option(40, low=8, high=256, help="log-mel channels (25 ms windows every 10 ms)")
    spec_augment: bool = option(False, help="SpecAugment on the training features: 2 frequency masks (<= 8 "
                                "channels) and 2 time masks (<= 20 frames); off by default: in budgets of minutes "
                                "it slows learning more than it helps on unseen voices")
    warp: float | None = option(None, low=0, high=0.3, help="training: stretch each utterance's features in time "
                                "and along the mel channels by factors drawn in [1 - warp, 1 + warp] (speed and vocal "
                                "tract length perturbation, on the features; 0: off; default: 0.1 for las, measured "
                                "on digits to make a tenth fewer errors on unseen voices over three seeds; 0 for "
                                "the others, not measured)")
    concat: float = option(0.0, low=0, high=1, help="share of training batches whose utterances are joined two by "
                           "two (features end to end, transcripts with a space): utterances twice as long in "
                           "training at the same cost, so that decoding holds on longer ones")
    concat_from: int = option(1000, low=0, help="--concat joins batches from this training batch on (counted "
                              "from the start of this process): attention finds its diagonal on single "
                              "utterances first (joined from the start, LAS had not aligned after 10 minutes)")
    # model
    model: str = option("las", choices=MODELS, help="las (Listen, Attend and Spell), ctc (no attention) or "
                        "transformer")
    score: str = option("location", choices=("content", "location"), applies=_LAS,
                        help="las: content-only (additive) or location-aware attention (Chorowski et al. 2015)")
    beta: float = option(1.0, low=0, low_open=True, applies=_LAS, help="las: sharpening, a factor on the scores")
    smoothing: bool = option(False, applies=_LAS, help="las: sigmoid(s)/sum sigmoid(s) instead of softmax")
    filters: int = option(10, low=1, applies=_LAS, help="las, location: convolution channels over the previous "
                          "weights")
    kernel_size: int = option(31, low=1, applies=_LAS, help="las, location: their width (odd)")
    listener: str = option("conv", choices=("pyramid", "conv"), applies=_LISTENER,
                           help="las/ctc: pyramidal BiLSTM or strided convolutions before the BiLSTMs")
    reduction: int = option(4, choices=(2, 4, 8), applies=_LISTENER, help="las/ctc: how many times shorter the "
                            "listener's frames are")
    hidden_dim: int = option(64, low=1, applies=_LISTENER, help="las/ctc: listener LSTM size per direction")
    num_layers: int = option(2, low=1, help="las/ctc: listener BiLSTM layers (a pyramid needs 1 + log2(reduction)); "
                            "transformer: encoder layers")
    embed_dim: int = option(32, low=1, applies=_LAS, help="las: character embedding size")
    decoder_dim: int = option(128, low=1, applies=_LAS, help="las: speller LSTM size")
    attn_dim: int = option(64, low=1, applies=_LAS, help="las: hidden size of the attention score")
    dim: int = option(96, low=2, applies=TRANSFORMER, help="transformer: model width")
    num_decoder_layers: int = option(2, low=1, applies=TRANSFORMER, help="transformer: decoder layers")
    dropout: float = option(0.1, low=0, high=0.99, help="dropout")
    # loss and evaluation
    ctc_weight: float | None = option(None, low=0, high=0.99, applies=_ATTENTION,
                                      help="las/transformer: weight of a CTC head's loss (> 0: the hybrid "
                                      "CTC/attention model, also used in its joint decoding; default: 0.3 for las, "
                                      "measured on digits: a seventh fewer errors over three seeds than without, "
                                      "and half as many on long utterances; 0 for the transformer, not "
                                      "measured)")
    guided: float | None = option(None, low=0, applies=_ATTENTION, help="las/transformer: weight of the "
                                  "guided-attention loss (Tachibana et al. 2017), the attention put far from the "
                                  "diagonal, in the first --guided-until training batches: a prior for the monotonic "
                                  "alignment (default: 1 for las, measured to align every seed tried; off for the "
                                  "transformer, not measured; 0: off)")
    guided_until: int = option(1000, low=0, applies=_ATTENTION, help="--guided applies to the training batches "
                               "before this one (counted from the start of this process)")
    label_smoothing: float = option(0.1, low=0, high=0.99, applies=_ATTENTION, help="label smoothing of the "
                                    "attention decoder's cross-entropy")
    eval_beam: int = option(1, low=1, help="beam of the evaluations during training (1 = greedy)")
    eval_max: int = option(200, low=1, help="utterances transcribed per evaluation")
    max_decode_len: int = option(300, low=1, help="longest transcript decoded, in characters")
    max_rate: float = option(40.0, low=0, low_open=True, help="decoding: at most this many characters per second "
                             "of audio (+5), so that a transcript that never ends stops (speech: 10-20 a second)")
    window: tuple[int, ...] = option((8, 32), low=0, applies={**_LAS, "score": ("location",), "ctc_weight": (0.0,)},
                                     help="las, location, no CTC head: decoding attends only to LEFT,RIGHT listener "
                                     "frames around the median of the previous attention (Chorowski et al.'s "
                                     "windowing; '' for none; hybrids decode jointly with CTC instead)")
    eos_threshold: float = option(0.0, low=0, high=1, applies=_ATTENTION, help="beam decoding: end a transcript "
                                  "only where p(<eos>) >= this x the best other character's (0: off)")
    length_penalty: float = option(1.0, low=0, applies=_ATTENTION, help="beam decoding: Wu et al.'s length "
                                   "normalisation alpha of the final ranking (0: off; 1, the default, removed a "
                                   "tenth of the errors of 0 on digits at beam 8, on the validation and the test "
                                   "split alike)")

    def __post_init__(self):
        if self.data in _SIZES:
            sizes = _SIZES[self.data]
            self.n_train = self.n_train or sizes[0]
            self.n_valid = self.n_valid or sizes[1]
            self.n_test = self.n_test or sizes[2]
            self.n_long = sizes[3] if self.n_long is None else self.n_long
        if self.guided is None and self.model == "las":  # the other models: None, off
            self.guided = 1.0
        if self.ctc_weight is None and self.model != "ctc":  # a CTC model: None (it is all CTC)
            self.ctc_weight = 0.3 if self.model == "las" else 0.0
        if self.warp is None:
            self.warp = 0.1 if self.model == "las" else 0.0
        check_options(self)
        if self.model == "las" and self.score == "content" and (self.filters, self.kernel_size) != (10, 31):
            raise OptionError(ref("filters") + " and " + ref("kernel_size") + " apply to the location-aware score "
                              "only (" + ref("score") + " location)", "filters", "kernel_size", "score")
        if self.model == "las" and self.kernel_size % 2 == 0:
            raise OptionError(ref("kernel_size") + " must be odd, got {n}", "kernel_size", n=self.kernel_size)
        if self.window and len(self.window) != 2:
            raise OptionError(ref("window") + " takes two frame counts LEFT,RIGHT, got {given}", "window",
                              given=",".join(map(str, self.window)))
        self.check_heads()
        if self.model in ("las", "ctc") and self.listener == "pyramid" and \
                self.num_layers < 1 + self.reduction.bit_length() - 1:
            raise OptionError("a pyramid listener with " + ref("reduction") + " {r} needs " + ref("num_layers") +
                              " >= {least}, got {n}", "reduction", "num_layers", r=self.reduction,
                              least=self.reduction.bit_length(), n=self.num_layers)

    @property
    def generated(self) -> bool:
        return self.data in GENERATED


@dataclass
class SpeechSettings(LMFusionSettings):
    """The settings of a speech run's ``predict`` and ``evaluate`` (:class:`~qkv.apps.speech.Transcriber`); those
    left at ``None`` are the run's own (:func:`~qkv.apps.speech.task.decoding_options`); and a language model
    fused into the beam (:class:`~qkv.apps.option_groups.LMFusionSettings`)."""

    beam: int = option(16, low=1, high=100, help="beam size (1 = greedy; 16, the default: with the word model in "
                       "the beam, on sentences and digits alike a tenth to a fifth fewer errors than 8)")
    max_len: int = option(300, low=1, help="longest transcript, in characters")
    ctc_weight: float | None = option(None, low=0, high=0.99, help="hybrid runs: weight of the CTC prefix scores "
                                      "in joint decoding (default: the trained weight; 0: attention alone)")
    window: tuple[int, ...] | None = option(None, low=0, metavar="LEFT,RIGHT", help="las runs: attend only to "
                                            "these listener frames around the previous attention's median (default: "
                                            "the run's, 8,32 for location-aware runs without CTC; '' for none)")
    max_rate: float | None = option(None, low=0, low_open=True, help="at most this many characters per second of "
                                    "audio, +5 (default: the run's, 40)")
    eos_threshold: float | None = option(None, low=0, high=1, help="end only where p(<eos>) >= this x the best "
                                         "other character's (default: the run's, 0 = off)")
    length_penalty: float | None = option(None, low=0, excludes={"beam": (1,)},
                                          help="beam > 1: Wu et al.'s length normalisation alpha, ranking the final "
                                               "beam (default: the run's, 1; 0 = off)")
    words: str | None = option(None, metavar="TEXT", help="a word trigram model in the beam and correcting its "
                               "transcripts: of a text file (one sentence per line, or a TSV's first column; .gz "
                               "read), of the run's training transcripts ('train'), or 'none'; the beam's own "
                               "transcript is kept as 'spelled' (default: the text the run keeps, its training "
                               "transcripts and its corpus's sentences that no split speaks; none for a run that "
                               "keeps none)")
    words_weight: float | None = option(None, low=0, help="the correction after the beam: the word model's "
                                        "log-probability against one character edit (default 0.2, chosen on "
                                        "generated sentences' valid split; 0: no correction)")
    words_fusion: float | None = option(None, low=0, help="attention models: the word model's weight in the beam "
                                        "(its log-probability spread over each word's characters with look-ahead; "
                                        "default 0.4, chosen on generated sentences' valid split; 0: not in the "
                                        "beam)")
    on_error: str | None = on_error_setting("bad audio files or manifest rows")


def train_defaults(options: SpeechOptions):
    """The trainer's settings for speech recognition (the ``qkv train speech`` defaults): the best model is the
    one of least character error rate on the validation split. The learning rate, 2e-3, took digits' test CER after
    10 minutes from 4.5 / 6.0 / 7.4% at 1e-3 to 3.6 / 3.6 / 2.6% and sentences' test WER after 30 minutes from
    35.3 / 35.5 / 36.2% to 31.9 / 32.2 / 31.6% (seeds 0 / 1 / 2, on the same machine, every training voice equally
    often; 3e-3 was worse on sentences)."""
    from ...train import TrainConfig

    return TrainConfig(epochs=30, batch_size=32, lr=2e-3, warmup_steps=100, schedule="cosine", weight_decay=0.01,
                       clip_norm=5.0, monitor="cer", mode="min")
