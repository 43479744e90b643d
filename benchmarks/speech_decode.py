"""Decoding settings side by side on a trained speech run: the length limits of
:func:`qkv.apps.speech.transcribe_batch` (windowed attention, characters per second, <eos> threshold, length
normalisation, beam, joint CTC weight) on the ``test`` split (in-length) and the ``long`` split (2-3 test texts
joined, longer than any training utterance).

    python benchmarks/speech_decode.py runs/las-location                       # the default grid
    python benchmarks/speech_decode.py runs/las --settings "beam=1" "beam=1,window=2:24" "beam=4,eos_threshold=0.5"

A setting is ``key=value`` pairs joined by commas: ``beam``, ``window`` (``LEFT:RIGHT`` listener frames, or
``none``, the default here, whatever the run's own: ``qkv transcribe`` and ``benchmarks/speech.py`` decode a
location-aware LAS with its window 8:32 unless told otherwise), ``max_rate`` (characters per second, ``none`` for
no limit but ``--max-len``), ``eos_threshold``, ``length_penalty``, ``ctc_weight``, ``words`` (a word model in the
beam and correcting the transcripts: ``train``, the run's training transcripts, ``none``, or a text file; by
default the text the run keeps), ``words_fusion`` (its weight in the beam) and ``words_weight`` (the correction's).
``--held-out-text FILE`` writes the sentences of the run's text source (Tatoeba's English by default) without those
of its valid, test and long splits, a word model's text that has not seen them. Printed: a Markdown table of
WER and CER (%, jiwer) per split, and the seconds each took on one thread; ``--by-speaker`` adds a table of WER and
CER per voice (which held-out voices the errors come from).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qkv.apps.speech import Transcriber, speech_metrics  # noqa: E402
from qkv.apps.speech.task import read_features  # noqa: E402

DEFAULT = ("beam=1,max_rate=none", "beam=1", "beam=1,window=2:24", "beam=1,window=4:32", "beam=4",
           "beam=4,window=2:24", "beam=4,window=2:24,eos_threshold=0.5,length_penalty=1")


def parse(setting: str) -> dict:
    out: dict = {"beam": 1, "window": (), "max_rate": None}
    for part in filter(None, setting.split(",")):
        key, _, value = part.partition("=")
        if key == "window":
            out[key] = () if value == "none" else tuple(int(v) for v in value.split(":"))
        elif key == "max_rate":
            out[key] = 1e9 if value == "none" else float(value)
        elif key in ("beam",):
            out[key] = int(value)
        elif key in ("eos_threshold", "length_penalty", "ctc_weight", "words_weight", "words_fusion"):
            out[key] = float(value)
        elif key == "words":
            out[key] = value
        else:
            raise SystemExit(f"unknown setting {key!r} in {setting!r}")
    return out


def write_held_out_text(t: Transcriber, path: str) -> None:
    """The sentences of ``t``'s text source (normalised as the corpus's) less every valid, test and long text, one
    per line."""
    from qkv.apps.speech.synth import sentence_texts

    held = {u.text for s in ("valid", "test", "long") for u in t.dataset().split(s)}
    texts = sentence_texts(t.options.text, min_words=1, max_words=1000)
    kept = [x for x in texts if x not in held]
    Path(path).write_text("\n".join(kept) + "\n")
    print(f"# {path}: {len(kept)} sentences of the text source, {len(texts) - len(kept)} held out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("--settings", nargs="+", default=DEFAULT)
    parser.add_argument("--splits", default="test,long")
    parser.add_argument("--max-test", type=int, default=200, help="utterances per split")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--by-speaker", action="store_true",
                        help="also the WER and CER of each speaker (voice) per split")
    parser.add_argument("--held-out-text", default=None, metavar="FILE", help="write the run's text source without "
                        "the texts of its valid, test and long splits to FILE (for words=FILE)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t = Transcriber.load(args.run, "cpu")
    if args.held_out_text:
        write_held_out_text(t, args.held_out_text)
    splits = args.splits.split(",")
    data = {}
    for s in splits:
        utts = t.dataset().split(s)[: args.max_test]
        feats, kept, _ = read_features(utts, t.options.n_mels)
        data[s] = (feats, [utts[i].text for i in kept], [utts[i].speaker for i in kept])
    kind = f"{t.options.model} ({t.options.score})" if t.options.model == "las" else t.options.model
    print(f"# {args.run}: {kind}, "
          + ", ".join(f"{len(v[0])} {k}" for k, v in data.items()))
    print("| decoding | " + " | ".join(f"{s} WER | {s} CER" for s in splits) + " | seconds |")
    print("|---|" + "---|---|" * len(splits) + "---|")
    per_speaker = []
    for setting in args.settings:
        kw = parse(setting)
        started, cells = time.time(), []
        for s in splits:
            feats, refs, speakers = data[s]
            hyps = [h.text for h in t.transcribe(feats, max_len=300, **kw)]
            m = speech_metrics(hyps, refs)
            cells.append(f"{m['wer']:.1f} | {m['cer']:.1f}")
            for who in sorted(set(speakers)) if args.by_speaker else ():
                mine = [i for i, v in enumerate(speakers) if v == who]
                m = speech_metrics([hyps[i] for i in mine], [refs[i] for i in mine])
                per_speaker.append((setting, s, who, len(mine), m["wer"], m["cer"]))
        print(f"| {setting} | {' | '.join(cells)} | {time.time() - started:.0f} |", flush=True)
    if args.by_speaker:
        print("\n| decoding | split | speaker | utterances | WER | CER |\n|---|---|---|---|---|---|")
        for setting, s, who, n, wer, cer in per_speaker:
            print(f"| {setting} | {s} | {who} | {n} | {wer:.1f} | {cer:.1f} |")


if __name__ == "__main__":
    main()
