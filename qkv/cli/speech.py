"""``qkv transcribe``: audio files transcribed by a speech run, with its alignment pictures, or the run evaluated
(WER and CER) on a split of its data or on a manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..options import option
from ..tasks import speech as task
from ..viz.files import write_atomic
from .common import add_command, safe, unique_names
from .options import options_from_args


@dataclass
class TranscribeCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory of `qkv train speech`")
    audio: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="AUDIO",
                              help="audio files (WAV, FLAC, OGG; any rate, any channels)")
    beam: int = option(1, low=1, high=100, help="beam size (1 = greedy)")
    ctc_weight: float | None = option(None, low=0, high=0.99, help="hybrid runs: weight of the CTC prefix scores "
                                      "in joint decoding (default: the trained weight; 0: attention alone)")
    max_len: int = option(300, low=1, help="longest transcript, in characters")
    max_rate: float | None = option(None, low=0, low_open=True, help="at most this many characters per second of "
                                    "audio, +5 (default: the run's, 40)")
    window: tuple[int, ...] | None = option(None, low=0, metavar="LEFT,RIGHT", help="las runs: attend only to "
                                            "these listener frames around the previous attention's median (default: "
                                            "the run's, 8,32 for location-aware runs without CTC; '' for none)")
    eos_threshold: float | None = option(None, low=0, high=1, help="beam: end only where p(<eos>) >= this x the "
                                         "best other character's (default: the run's, 0 = off)")
    length_penalty: float | None = option(None, low=0, help="beam: Wu et al.'s length normalisation alpha "
                                          "(default: the run's, 0 = off)")
    plot: str | None = option(None, metavar="DIR", help="write a picture per file: the log-mel spectrogram, each "
                              "character's attention over the frames and (hybrid) the CTC alignment")
    evaluate: str | None = option(None, metavar="MANIFEST_OR_SPLIT", help="print WER and CER on a split of the "
                                  "run's data (test, long, valid) or on a manifest or LibriSpeech folder")
    on_error: str = option("raise", choices=("raise", "skip"), help="--evaluate: unreadable audio files or bad "
                           "manifest rows stop with file:line, or are skipped and counted")
    max_utterances: int | None = option(None, low=1, help="--evaluate at most this many utterances")
    json: str | None = option(None, help="write the --evaluate figures as JSON")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def _limits(o: TranscribeCommand) -> dict:
    return {"window": o.window, "max_rate": o.max_rate, "eos_threshold": o.eos_threshold,
            "length_penalty": o.length_penalty}


def _evaluate(transcriber: task.Transcriber, o: TranscribeCommand) -> None:
    target = o.evaluate
    is_path = Path(target).exists()
    if not is_path and target not in transcriber.data().splits:
        raise ValueError(f"--evaluate {target}: no such manifest or folder, and not a split of the run's data "
                         f"({', '.join(transcriber.data().splits)})")
    m = transcriber.evaluate(target if is_path else None, split="test" if is_path else target,
                             limit=o.max_utterances, beam=o.beam, max_len=o.max_len, ctc_weight=o.ctc_weight,
                             on_error=o.on_error, **_limits(o))
    print(f"{safe(target)}: {int(m['utterances'])} utterances, beam {o.beam}"
          + (f", {int(m['skipped'])} skipped" if m.get("skipped") else ""))
    print(f"WER {m['wer']:.2f}%\nCER {m['cer']:.2f}%")
    if o.json:
        print(f"wrote {write_atomic(o.json, json.dumps(m, indent=2) + chr(10), option='--json')}")


def transcribe(args) -> int:
    from ..viz.speech import speech_alignment

    o = options_from_args(args, TranscribeCommand)
    if o.plot and Path(o.plot).exists() and not Path(o.plot).is_dir():
        raise ValueError(f"--plot {o.plot} is a file: give a folder for the pictures (one PNG per audio file)")
    if not (o.audio or o.evaluate):
        raise ValueError("give audio files, or --evaluate MANIFEST_OR_SPLIT")
    if o.plot and not o.audio:
        raise ValueError("--plot draws the transcribed audio files: give some")
    transcriber = task.Transcriber.load(o.run, o.device)
    if o.ctc_weight and not transcriber.has_ctc:
        raise ValueError("--ctc-weight needs a hybrid run (trained with --ctc-weight > 0)")
    if o.evaluate:
        _evaluate(transcriber, o)
    if not o.audio:
        return 0
    results = transcriber.predict(o.audio, beam=o.beam, max_len=o.max_len, ctc_weight=o.ctc_weight, **_limits(o))
    for path, r in zip(o.audio, results, strict=True):
        print(f"{safe(path)}\t{safe(r.text)}")
    if o.plot:
        names = unique_names([Path(p).stem for p in o.audio])
        for name, r in zip(names, results, strict=True):
            written = speech_alignment(r.features, r.tokens, r.attention, ctc=r.ctc,
                                       vocab=transcriber.tokenizer.tokens_of_ids(
                                           range(transcriber.tokenizer.vocab_size)),
                                       title=f"{name}: {r.text}", path=Path(o.plot) / f"{name}.png")
            print(f"wrote {safe(str(written))}")
    return 0


def register(commands, train_commands) -> None:
    add_command(commands, "transcribe", "transcribe audio files with a speech run (PATH<TAB>transcript), draw each "
                "character's attention over the audio, or --evaluate WER and CER", TranscribeCommand, transcribe)
