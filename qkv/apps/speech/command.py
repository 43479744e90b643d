"""``qkv transcribe``: audio files transcribed by a speech run (:mod:`.predict`'s way), with its alignment
pictures, or the run evaluated (WER and CER) on a split of its data or on a manifest (``--evaluate``:
:func:`qkv.cli.evaluate.evaluation`, as ``qkv evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...options import option
from ..command import (
    LimitOption,
    LMFusionOption,
    PlotOption,
    RunInputs,
    evaluation,
    finish,
    input_paths,
    plot_folder,
    settings_of,
)
from ..console import safe, unique_names
from .options import SpeechSettings
from .predictor import Transcriber


@dataclass
class TranscribeCommand(SpeechSettings, LMFusionOption, LimitOption, PlotOption, RunInputs):
    audio: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="AUDIO",
                              help="audio files (WAV, FLAC, OGG; any rate, any channels)")
    evaluate: str | None = option(None, metavar="MANIFEST_OR_SPLIT", help="print WER and CER on a split of the "
                                  "run's data (test, long, valid) or on a manifest or LibriSpeech folder")
    on_error: str = option("raise", choices=("raise", "skip"), requires=("evaluate",),
                           help="--evaluate: unreadable audio files or bad manifest rows stop with file:line, or are "
                                "skipped and counted")

    FLAG_HELP = {"plot": "a folder: a picture per file, the log-mel spectrogram, each character's attention over "
                         "the frames and (hybrid) the CTC alignment",
                 "limit": "--evaluate at most this many utterances",
                 "json": "write the transcripts as JSON rows, or with --evaluate the figures (NaN written null)",
                 "file": "a file of audio file names, one per line",
                 "lm": "a language-model run (qkv train lm, characters) fused into the beam of an attention model "
                       "(shallow fusion)",
                 "length_reward": "added per character with --lm, against the early ends a language model favours"}
    FLAG_ALIASES = {"limit": ("--max-utterances",)}


def _settings(o: TranscribeCommand, transcriber, method: str = "predict") -> dict:
    return settings_of(o, transcriber, method, **o.fusion(transcriber))


def _evaluate(transcriber, o: TranscribeCommand) -> None:
    target = o.evaluate
    is_path = Path(target).exists()
    if not is_path and target not in transcriber.dataset().splits:
        raise ValueError(f"--evaluate {target}: no such manifest or folder, and not a split of the run's data "
                         f"({', '.join(transcriber.dataset().splits)})")
    def table(m: dict[str, float]) -> None:
        print(f"{safe(target)}: {int(m['utterances'])} utterances, beam {o.beam}"
              + (f", {int(m['skipped'])} skipped" if m.get("skipped") else ""))
        print(f"WER {m['wer']:.2f}%\nCER {m['cer']:.2f}%")

    evaluation(transcriber, target if is_path else None, split="test" if is_path else target, limit=o.limit,
               name=target, json_path=o.json, report=table, **_settings(o, transcriber, "evaluate"))


def transcribe(o: TranscribeCommand) -> int:
    from .pictures import speech_alignment

    plots = plot_folder(o.plot) if o.plot else None  # settled first: printed == written
    audio = input_paths(o, o.audio, "audio file")
    transcriber = Transcriber.load(o.run, o.device)
    if o.ctc_weight and not transcriber.has_ctc:
        raise ValueError("--ctc-weight needs a hybrid run (trained with --ctc-weight > 0)")
    if o.evaluate:
        _evaluate(transcriber, o)
        return 0
    settings = _settings(o, transcriber)
    results = transcriber.predict(audio, **settings)
    for path, r in zip(audio, results, strict=True):
        print(f"{safe(path)}\t{safe(r.text)}")
    if plots:
        names = unique_names([Path(p).stem for p in audio])
        for name, r in zip(names, results, strict=True):
            # the rows are the characters the decoder spelt; a word model's correction follows the arrow
            heard = f"{r.spelled} \u2192 {r.text}" if r.spelled and r.spelled != r.text else r.text
            written = speech_alignment(r.features, r.tokens, r.attention, ctc=r.ctc,
                                       vocab=transcriber.tokenizer.tokens_of_ids(
                                           range(transcriber.tokenizer.vocab_size)),
                                       title=f"{name}: {heard}", path=plots / f"{name}.png")
            print(f"wrote {safe(str(written))}")
    finish(transcriber, audio, results, o.json, **settings)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"transcribe": (TranscribeCommand, transcribe)}
