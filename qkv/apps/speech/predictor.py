"""A trained speech recognition run read back: :class:`Transcriber` (``load`` / ``predict`` / ``evaluate`` /
``view``); its result is :class:`~qkv.apps.speech.decode.Transcript`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...options import OptionError, ref
from ..base import PageInput, Predictor, ViewInput, check_index, file_inputs, jsonable
from ..fusion import LanguageModelFusion
from ..stopped import stopped_note
from .decode import Transcript, transcribe_batch, utterance_features
from .options import SpeechSettings
from .task import SpeechTask, decoding_options, evaluate_transcripts, read_features

__all__ = ["Transcriber", "Transcript"]

logger = logging.getLogger(__name__)


class Transcriber(LanguageModelFusion, Predictor):
    """A trained speech recogniser: ``Transcriber.load("runs/digits").predict(["clip.wav"])``."""

    task_class = SpeechTask
    view_inputs = ("text", "index")
    input_kind = "audio file"
    settings = SpeechSettings

    @property
    def has_ctc(self) -> bool:
        return getattr(self.model, "ctc_head", None) is not None

    def features(self, audio: str | os.PathLike | Tensor) -> Tensor:
        """The model's input ``(F, n_mels)`` of an audio file (any rate, any channels) or a 16 kHz ``(T,)`` wave."""
        from .audio import load_audio

        wave = audio if isinstance(audio, Tensor) else load_audio(audio)
        if wave.dim() != 1 or wave.numel() == 0:
            raise ValueError(f"a wave must be a non-empty (T,) tensor at 16 kHz, got {tuple(wave.shape)}")
        return utterance_features(wave.float(), self.options.n_mels)

    def predict(self, inputs: list[str | os.PathLike | Tensor], *, beam: int = 16, max_len: int = 300,
                ctc_weight: float | None = None, window: tuple[int, ...] | None = None, max_rate: float | None = None,
                eos_threshold: float | None = None, length_penalty: float | None = None, lm: Any = None,
                lm_weight: float | None = None, length_reward: float = 0.0, words: Any = None,
                words_weight: float | None = None, words_fusion: float | None = None) -> list[Transcript]:
        """Transcripts of audio files or 16 kHz waves. ``ctc_weight``: joint CTC/attention decoding's weight (default:
        the trained one for a hybrid, none otherwise); the limits ``window``, ``max_rate``, ``eos_threshold``,
        ``length_penalty`` (:func:`~qkv.apps.speech.decode.transcribe_batch`; default: the run's options), and a
        language model fused into the beam: ``lm`` (a run directory of ``qkv train lm`` or its loaded
        :class:`~qkv.apps.lm.LanguageModel`), ``lm_weight``, ``length_reward``; and a word model in the beam and
        correcting the transcripts after it: ``words`` (a text file, ``"train"`` for the run's training transcripts,
        ``"none"``, or a loaded :class:`~qkv.apps.speech.words.WordModel`; default: the text the run keeps,
        :meth:`word_model`), ``words_fusion`` (its weight in the beam) and ``words_weight`` (the correction's). An
        empty input, or a bad file, is a ``ValueError``."""
        limits = {"window": None if window is None else tuple(window), "max_rate": max_rate,
                  "eos_threshold": eos_threshold, "length_penalty": length_penalty, "lm": lm,
                  "lm_weight": lm_weight, "length_reward": length_reward, "words": words,
                  "words_weight": words_weight, "words_fusion": words_fusion}
        self.check_settings({"beam": beam, "max_len": max_len, "ctc_weight": ctc_weight, **_given(limits)}, "predict")
        if not inputs:
            raise ValueError("no audio to transcribe")
        features = [self.features(a) for a in inputs]
        results = self.transcribe(features, beam=beam, max_len=max_len, ctc_weight=ctc_weight, **_given(limits))
        for r, a in zip(results, inputs, strict=True):
            r.source = str(a) if not isinstance(a, Tensor) else ""
        return results

    def inputs_from_strings(self, strings: list[str], **given: Any) -> list[str]:
        """Each string an audio file (WAV, FLAC...: read by :meth:`predict`)."""
        self.check_settings(given, "predict")
        return file_inputs(strings, "audio")

    def _limits(self, limits: dict[str, Any], beam: int) -> dict[str, Any]:
        """The decoding limits and language model of :meth:`predict` (``window`` as a tuple), checked as its settings
        with the ``beam`` they go with (:meth:`check_settings`); a language model given by its run directory is
        loaded."""
        if limits.get("window") is not None:
            limits = {**limits, "window": tuple(limits["window"])}
        limits = self.check_settings({**_given(limits), "beam": beam}, "predict")
        limits.pop("beam")
        if limits.get("lm") is not None:
            limits["lm"] = self.language_model(limits["lm"])
        from .words import DEFAULT_WORDS_FUSION

        fusion = limits.get("words_fusion")
        off = limits.get("words_weight") == 0 and not (DEFAULT_WORDS_FUSION if fusion is None else fusion)
        limits["words"] = None if off else self.word_model(limits.get("words"))
        return limits

    def word_model(self, words: Any) -> Any:
        """``words`` for :meth:`predict`: a text file's :class:`~qkv.apps.speech.words.WordModel` (read once), that
        of the run's training transcripts for ``"train"`` (:meth:`training_transcripts`), none for ``"none"``, or a
        loaded model as it is; ``None``, the default: that of the text the run keeps (:meth:`kept_text`: its
        training transcripts and its corpus's sentences that no split speaks), none for a run that keeps none (a
        run of an earlier release)."""
        from .words import WordModel

        if isinstance(words, WordModel):
            return words
        if words is None:  # the default: the text the run keeps, if it keeps any
            if self._kept("transcripts") is None:
                return None
            words = _KEPT
        if str(words) == "none":
            return None
        key, cache = str(words), vars(self).setdefault("_word_models", {})
        if key not in cache:
            cache[key] = WordModel(self.training_transcripts()) if key == "train" else \
                WordModel(self.kept_text()) if key == _KEPT else WordModel.from_file(key)
        return cache[key]

    def training_transcripts(self) -> list[str]:
        """The transcripts the run was trained on: kept with the run (``assets/transcripts.json``), or, for a run
        without them, those of its data's training split."""
        kept = self._kept("transcripts")
        return kept if kept is not None else [u.text for u in self.dataset().split("train")]

    def kept_text(self) -> list[str]:
        """The default word model's sentences: the training transcripts (:meth:`training_transcripts`) and the
        sentences of a generated corpus's text source that no split speaks (``assets/texts.json``; text only,
        never a valid or test text)."""
        return self.training_transcripts() + (self._kept("texts") or [])

    def _kept(self, name: str) -> list[str] | None:
        """The json asset ``name`` of the run (read once), None where it has none."""
        import json

        cache = vars(self).setdefault("_kept_assets", {})
        if name not in cache:
            path = self.assets_dir / f"{name}.json" if self.assets_dir is not None else None
            cache[name] = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() \
                else None
        return cache[name]

    def note(self, result: Transcript, settings) -> str | None:
        return stopped_note(result.stopped, len(result.tokens), "transcript", "characters")

    def result_row(self, result: Transcript) -> dict[str, Any]:
        """``output`` (the transcript), the ``source`` file, the decoder's ``score`` and why it ``stopped``
        (``end``, or the limit it reached: ``max_len``, ``max_rate``, ``frames``, ``positions``); with a word model,
        the beam's own ``spelled`` transcript, before the correction."""
        row = {"output": result.text, "source": result.source, "score": result.score, "stopped": result.stopped}
        if result.spelled:  # a word model corrected the beam's transcript
            row["spelled"] = result.spelled
        return jsonable(row)

    def transcribe(self, features: list[Tensor], *, beam: int = 16, max_len: int = 300,
                   ctc_weight: float | None = None, **limits) -> list[Transcript]:
        """:meth:`predict` on features already read (each ``(F, n_mels)``)."""
        if ctc_weight is None:
            ctc_weight = self.options.ctc_weight if self.has_ctc and hasattr(self.model, "decode_step") else 0.0
        return transcribe_batch(self.model, self.tokenizer, [f.to(self.device) for f in features], beam=beam,
                                max_len=max_len, ctc_weight=ctc_weight,
                                **decoding_options(self.options, **self._limits(limits, beam)))

    def utterances(self, data: str | None = None, split: str = "test", on_error: str = "raise"):
        """The utterances of ``split`` of the run's data, or every utterance of another manifest or LibriSpeech
        folder ``data``."""
        return self._utterances(data, split, on_error)[0]

    def _utterances(self, data: str | None, split: str, on_error: str) -> tuple[list, int]:
        """:meth:`utterances` and how many rows of the manifest were skipped (``on_error="skip"``)."""
        from ...data.speech import read_librispeech, read_manifest

        if data is None:
            return self.dataset().split(split), 0
        path = Path(data)
        if path.is_dir() or path.is_file():
            utterances, skipped = (read_librispeech if path.is_dir() else read_manifest)(path, on_error=on_error)
            if skipped:
                logger.warning("%s: skipped %s", path, ", ".join(f"{n} ({why})" for why, n in skipped.items()))
            return utterances, sum(skipped.values())
        if data in ("digits", "sentences"):
            return self.dataset(data).split(split), 0
        raise ValueError(f"no such manifest or folder: {data}")

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None, beam: int = 16,
                 max_len: int = 300, ctc_weight: float | None = None, on_error: str = "raise",
                 window: tuple[int, ...] | None = None, max_rate: float | None = None,
                 eos_threshold: float | None = None, length_penalty: float | None = None, lm: Any = None,
                 lm_weight: float | None = None, length_reward: float = 0.0, words: Any = None,
                 words_weight: float | None = None, words_fusion: float | None = None) -> dict[str, float]:
        """WER and CER (%, ``jiwer``), exact match and the count on ``split`` of the run's data (``test``: held-out
        voices and texts; ``long``: longer than training) or on another manifest or LibriSpeech folder ``data``;
        ``on_error="skip"``: unreadable files are skipped and counted (``skipped``); the limits, language model and
        word model as in :meth:`predict`."""
        limits = {"window": None if window is None else tuple(window), "max_rate": max_rate,
                  "eos_threshold": eos_threshold, "length_penalty": length_penalty, "lm": lm,
                  "lm_weight": lm_weight, "length_reward": length_reward, "words": words,
                  "words_weight": words_weight, "words_fusion": words_fusion}
        self.check_settings({"beam": beam, "max_len": max_len, "ctc_weight": ctc_weight, "on_error": on_error,
                             **_given(limits)})
        utterances, rows_skipped = self._utterances(data, split, on_error)
        utterances = utterances[:limit]
        feats, kept, bad = read_features(utterances, self.options.n_mels, on_error)
        bad += rows_skipped
        if not feats:
            raise ValueError(f"no utterance could be read ({bad} skipped)")
        if ctc_weight is None:
            ctc_weight = self.options.ctc_weight if self.has_ctc and hasattr(self.model, "decode_step") else 0.0
        figures = evaluate_transcripts(self.model, self.tokenizer, feats, [utterances[i].text for i in kept],
                                       self.options, beam=beam, max_len=max_len, ctc_weight=ctc_weight,
                                       **self._limits(limits, beam))
        if bad:
            figures["skipped"] = float(bad)
        return figures

    def view_input(self, given: ViewInput) -> tuple[str, Tensor]:
        """One utterance, ``(audio file, its features)``: the file given as the text, or ``given.index`` in the test
        split."""
        audio = given.text  # an audio file's path
        if given.index is not None:
            part = self.dataset().split("test")
            audio = part[check_index(given.index, len(part), "utterances")].audio
        if not audio:
            raise OptionError("a speech run needs an audio file (the text) or " + ref("index") +
                              " (an utterance of its test split)", "index")
        if not hasattr(self.model, "decode_step"):
            raise ValueError("a CTC run has no attention to show; its alignment is drawn by the transcriber's plot "
                             "(Transcriber.plot, or transcribing with a plot folder)")
        return audio, self.features(audio)

    def view_predict(self, x: tuple[str, Tensor], **options: Any) -> Transcript:
        """The greedy transcript of the utterance: the decoding itself is recorded."""
        (result,) = self.transcribe([x[1]], beam=1, ctc_weight=0.0, **{"words": "none", **options})
        return result

    def view_page(self, records: list, x: tuple[str, Tensor], result: Transcript) -> PageInput:
        """Every attention of the model transcribing the utterance; source positions are the listener's frames."""
        audio, features = x
        frames = _frames(self.model, features.shape[0])
        hop = features.shape[0] / max(frames, 1) * 0.01
        tokens: dict[str, list[str]] = {"source": [f"{t * hop:.2f}s" for t in range(frames)]}
        if hasattr(self.model, "decode_step"):
            tokens["target"] = [*result.tokens, "<eos>"]
        notes = [f"{self.options.model} speech model ({self.options.score} attention)" if self.options.model == "las"
                 else f"{self.options.model} speech model", "greedy decoding; source positions are listener frames"]
        notes += [n for n in [self.note(result, {})] if n]
        return PageInput(records, tokens, title=f"{Path(str(audio)).name} \u2192 {result.text}", notes=notes)


#: the word models' cache key of the text the run keeps (no file's name)
_KEPT = "\0kept"


def _given(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without those left at ``None`` (the run's own)."""
    return {k: v for k, v in settings.items() if v is not None}


def _frames(model: nn.Module, frames: int) -> int:
    """How many frames the model's encoder makes of ``frames`` feature frames."""
    listener = getattr(model, "listener", None)
    if listener is not None:
        return int(listener.out_lengths(torch.tensor([frames]))[0])
    for _ in range(2):
        frames = (frames + 1) // 2
    return frames
