"""Speech recognition on generated speech: the recognisers side by side, and Debian's pocketsphinx beside them.

    python benchmarks/speech.py                                  # digits, every model, 4 minutes each
    python benchmarks/speech.py --data sentences --minutes 30 --models las-location,hybrid
    python benchmarks/speech.py --quick                          # a few steps, a smoke test
    python benchmarks/speech.py --data sentences --models ''     # pocketsphinx alone
    python benchmarks/speech.py --models las-location --minutes 10 --options '{"concat": 0.5}' --beam 4

``--options`` (JSON) sets any :class:`qkv.apps.speech.SpeechOptions` field of every model (``concat``: training
batches joined two by two; ``window``, ``max_rate``, ``eos_threshold``, ``length_penalty``: decoding limits), and
``--train`` (JSON) any :class:`qkv.train.TrainConfig` field (``lr``, ``batch_size``...).

Each model trains with the project's trainer and the ``qkv train speech`` defaults (batch 32, lr 1e-3, cosine) on
``--threads`` CPU threads (default 1) for ``--minutes`` (the trainer's ``max_minutes``: the schedule ends with the
budget); the best weights on the validation split (unseen texts, training voices) are then scored (greedy, or
``--beam``) on

* ``test``: unseen texts spoken by voices never heard in training (speaker-independent);
* ``long``: 2-3 test texts joined, longer than any training utterance (Chorowski et al.'s claim: content-only
  attention loses its place there, location-aware attention keeps it).

Models: ``las-content``, ``las-location`` (Listen, Attend and Spell with either score, no CTC head), ``hybrid``
(las-location with a CTC head, ``--ctc-weight 0.3``: the ``qkv train speech`` default; decoded jointly with CTC
prefix scores, at beam 4 when ``--beam`` is 1), ``ctc`` (no attention),
``transformer``. ``pocketsphinx`` (``pocketsphinx_continuous`` with ``pocketsphinx-en-us``, a recogniser trained on
real speech with a general English language model) transcribes the same test audio when it is installed.
Printed: WER and CER (%, jiwer) per split, the training time and steps, and the parameters.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from record import record_flag  # noqa: E402

from qkv.apps.speech import (  # noqa: E402
    SpeechOptions,
    SpeechTask,
    Transcriber,
    load_data,
    speech_metrics,
    train_defaults,
)
from qkv.train import train  # noqa: E402

MODELS = {
    "las-content": {"model": "las", "score": "content", "ctc_weight": 0.0},
    "las-location": {"model": "las", "score": "location", "ctc_weight": 0.0},
    "hybrid": {"model": "las", "score": "location", "ctc_weight": 0.3},
    "ctc": {"model": "ctc"},
    "transformer": {"model": "transformer"},
}


def pocketsphinx(utterances) -> dict[str, float] | None:
    """WER/CER of ``pocketsphinx_continuous`` (US English model) on the utterances; None when not installed."""
    tool = shutil.which("pocketsphinx_continuous")
    if tool is None:
        return None
    hyps = []
    for u in utterances:
        done = subprocess.run([tool, "-infile", u.audio, "-logfn", "/dev/null"], capture_output=True, text=True)
        hyps.append(" ".join(done.stdout.split()).lower())
    return speech_metrics(hyps, [u.text for u in utterances])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="digits", choices=("digits", "sentences"))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--minutes", type=float, default=4.0, help="training budget per model")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each model's training")
    parser.add_argument("--n-train", type=int, default=None)
    parser.add_argument("--max-test", type=int, default=200, help="utterances scored per split")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-pocketsphinx", action="store_true", help="skip the pocketsphinx baseline")
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--options", default="{}", help="JSON: SpeechOptions fields for every model")
    parser.add_argument("--train", default="{}", help="JSON: TrainConfig fields for every model")
    record_flag(parser, "speech")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]  # --models '': the pocketsphinx baseline alone
    if set(names) - set(MODELS):
        parser.error(f"--models: unknown {', '.join(sorted(set(names) - set(MODELS)))} (one of {', '.join(MODELS)})")
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    extra = {"n_train": 200, "n_valid": 20, "n_test": 20, "n_long": 10} if args.quick else \
        ({"n_train": args.n_train} if args.n_train else {})
    data = load_data(SpeechOptions(data=args.data, **extra))
    print(f"# speech, {args.data}: {', '.join(f'{len(u)} {s}' for s, u in data.splits.items())}; "
          f"{platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), {args.minutes} min per model; "
          f"options {args.options}, train {args.train}, beam {args.beam}")
    results = {}
    tmp = tempfile.mkdtemp(prefix="qkv-speech-")
    root = Path(args.out or tmp)
    print("| model | params | steps | minutes | test WER | test CER | long WER | long CER |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.options).items()}
        options = SpeechOptions(data=args.data, **extra, **{**MODELS[name], **given})
        config = train_defaults(options).replace(max_minutes=args.minutes, out=str(root / name), progress=False,
                                                 epochs=1000).replace(**json.loads(args.train))
        if args.quick:
            config = config.replace(max_steps=5, eval_every=0)
        started = time.time()
        result = train(SpeechTask(options, data), config)
        minutes = (time.time() - started) / 60
        transcriber = Transcriber.load(root / name, "cpu")
        transcriber._data[None] = data  # the corpus already read
        beam = 4 if name == "hybrid" and args.beam == 1 else args.beam
        row = {s: transcriber.evaluate(split=s, limit=args.max_test, beam=beam) for s in ("test", "long")}
        params = sum(p.numel() for p in transcriber.model.parameters())
        results[name] = {**{f"{s}_{k}": v for s, m in row.items() for k, v in m.items()}, "params": params,
                         "steps": result.state.global_step, "minutes": minutes}
        steps = result.state.global_step
        print(f"| {name} | {params / 1e6:.2f}M | {steps} | {minutes:.1f} | {row['test']['wer']:.1f} | "
              f"{row['test']['cer']:.1f} | {row['long']['wer']:.1f} | {row['long']['cer']:.1f} |", flush=True)
    skip = args.no_pocketsphinx
    sphinx = {s: None if skip else pocketsphinx(data.split(s)[: args.max_test]) for s in ("test", "long")}
    if skip:
        pass
    elif sphinx["test"] is not None:
        results["pocketsphinx"] = {f"{s}_{k}": v for s, m in sphinx.items() for k, v in m.items()}
        print(f"| pocketsphinx (en-us) | - | - | - | {sphinx['test']['wer']:.1f} | {sphinx['test']['cer']:.1f} | "
              f"{sphinx['long']['wer']:.1f} | {sphinx['long']['cer']:.1f} |")
    else:
        print("pocketsphinx_continuous is not installed: no baseline (apt install pocketsphinx pocketsphinx-en-us)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.record and not args.quick:
        record_results(args, results)
    if not args.out:
        shutil.rmtree(tmp, ignore_errors=True)


def record_results(args, results: dict) -> None:
    from record import measurement, record

    rows = []
    for name, r in results.items():
        if name == "pocketsphinx":
            rows.append(measurement(f"{args.data}-pocketsphinx", f"{args.data}, pocketsphinx (en-us): test WER "
                                    f"(test CER {r['test_cer']:.1f}%)", r["test_wer"], "test WER",
                                    figure=f"{r['test_wer']:.1f}%"))
            continue
        rows.append(measurement(f"{args.data}-{name}", f"{args.data}, {args.minutes:g} minutes, {name}, beam "
                                f"{args.beam} ({r['steps']:,} steps): test CER (test WER {r['test_wer']:.1f}%)",
                                r["test_cer"], "test CER", figure=f"{r['test_cer']:.1f}%"))
        ratio = r["long_cer"] / max(r["test_cer"], 1e-9)
        rows.append(measurement(f"{args.data}-{name}-long", f"{args.data}, {name}: `long` CER / test CER "
                                f"({r['long_cer']:.1f} against {r['test_cer']:.1f}%)", ratio, figure=f"{ratio:.2f}x"))
    record("speech", rows, threads=args.threads)


if __name__ == "__main__":
    main()
