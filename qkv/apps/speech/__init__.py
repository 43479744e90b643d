"""Speech recognition with attention: options, data, models, the trainer's task and a :class:`Transcriber` that
transcribes audio and returns, for every output character, where in the audio it looked.

Data (:mod:`qkv.data.speech`, :mod:`qkv.apps.speech.synth`): ``digits`` and ``sentences`` spoken offline by
espeak-ng and flite (the test split's voices and texts are never heard in training; ``long`` joins 2-3 test texts),
a manifest (TSV/CSV, Common Voice's columns work) or a LibriSpeech folder. Log-mel features from librosa's
filterbank on ``torch.stft``, SpecAugment in training.

Models (:mod:`qkv.models.speech`, :mod:`qkv.models.speech_transformer`): ``las`` (Listen, Attend and Spell with
content-only or location-aware attention, :class:`qkv.LocationAware`; ``ctc_weight > 0`` adds a CTC head: the
hybrid, decoded jointly with CTC prefix scores), ``ctc`` (no attention; best path or CTC prefix beam search) and
``transformer``. Decoding holds on long utterances with a window around the previous attention's median (the
location-aware LAS's default), at most ``max_rate`` characters a second, an ``<eos>`` threshold and length
normalisation (:func:`transcribe_batch`); training can join utterances two by two (``concat``). A word trigram
model of the text the run keeps (its training transcripts and its corpus's unspoken sentences; or of any text)
scores the words in the beam, then corrects the decoded words (:class:`~qkv.apps.speech.words.WordModel`,
:class:`~qkv.apps.speech.words.WordScorer`; ``words``, ``words_fusion``, ``words_weight``).

Its parts under the contract of :mod:`qkv.apps.base`: :class:`SpeechTask` (the trainer's task),
:class:`Transcriber` (a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are
audio files) and :func:`evaluate_transcripts`, the one metric both evaluate with.

Example::

    from qkv.apps.speech import SpeechOptions, SpeechTask, Transcriber, train_defaults
    from qkv.train import train
    options = SpeechOptions(data="digits", model="las", score="location")
    train(SpeechTask(options), train_defaults(options).replace(max_minutes=10, out="runs/digits"))
    transcriber = Transcriber.load("runs/digits")
    [t.text for t in transcriber.predict(["clip.wav"], beam=4)]        # ['four two seven one']
    transcriber.evaluate(split="long")                                  # {'wer': ..., 'cer': ..., ...}
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .decode import Transcript, speech_metrics, transcribe_batch
from .options import MODELS, SpeechOptions, train_defaults
from .predictor import Transcriber
from .task import SpeechTask, evaluate_transcripts, load_data, model_spec

__all__ = ["APPLICATION", "SpeechOptions", "load_data", "model_spec", "train_defaults", "SpeechTask",
           "evaluate_transcripts", "Transcriber", "Transcript", "transcribe_batch", "speech_metrics", "MODELS"]


APPLICATION = Application(
    name="speech", commands=command.COMMANDS,
    train_defaults=train_defaults, task=SpeechTask, predictor=Transcriber, export=export.graphs)
