"""A character language model fused into speech decoding: its text, its weights chosen on valid, and what it gives
per held-out voice.

    python benchmarks/speech_lm.py text runs/speech-lm.txt              # the LM's text: no valid/test sentence
    python benchmarks/speech_lm.py text runs/digits-lm.txt --corpus digits
    qkv train lm --data runs/speech-lm.txt --max-minutes 20 --threads 1 --out runs/lm-speech
    python benchmarks/speech_lm.py fuse runs/speech/las-location runs/lm-speech --json fusion.json

``text`` writes the English sentences of Tatoeba, normalised as the speech transcripts are (lower case, letters and
apostrophes), one per line, **without** the sentences of the ``sentences`` corpus's valid and test splits (the
``long`` split joins test sentences): a language model trained on it has never read what it is scored on. With
``--corpus digits``: 50,000 spoken-number texts drawn as the ``digits`` corpus draws its own (another seed), also
without its valid and test texts.

``fuse`` decodes the run's ``valid`` split (training voices, unseen sentences) over a grid of language-model
weights ``lambda`` and length rewards (:mod:`qkv.models.fusion`, shallow fusion in the beam), keeps the pair of
least WER on valid, then decodes ``test`` (unseen sentences and voices) and ``long`` with the same beam without and
with the language model. Printed: the grid, and WER/CER per split and per voice, without and with the model.

``table`` reads the ``--json`` of several ``fuse`` runs (one per seed) and prints, per split and with/without the
language model, each seed's WER and CER, their mean and spread, the mean per voice, and the ratio of the worst
voice's CER to the best's:

    python benchmarks/speech_lm.py table fusion-s0.json fusion-s1.json fusion-s2.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qkv.apps.lm import LanguageModel  # noqa: E402
from qkv.apps.speech import Transcriber, speech_metrics  # noqa: E402
from qkv.apps.speech.options import SpeechOptions  # noqa: E402
from qkv.apps.speech.synth import digit_texts, sentence_texts  # noqa: E402
from qkv.apps.speech.task import read_features  # noqa: E402
from qkv.data.speech import normalize_transcript  # noqa: E402

TATOEBA = ROOT.parent / "shared" / "data" / "tatoeba-eng-fra.tsv.gz"


def write_text(out: Path, corpus: str, data_seed: int) -> None:
    options = SpeechOptions(data=corpus, data_seed=data_seed)
    need = options.n_train + options.n_valid + options.n_test
    texts = digit_texts(need, data_seed) if corpus == "digits" else sentence_texts(options.text, seed=data_seed)
    held = set(texts[options.n_train:need])
    if corpus == "digits":
        lines = digit_texts(50_000, seed=data_seed + 1000)
    else:
        with gzip.open(TATOEBA, "rt", encoding="utf-8") as f:
            lines = [line.split("\t")[0] for line in f if not any(c.isdigit() for c in line.split("\t")[0])]
    kept, dropped = {}, 0
    for line in lines:
        text = normalize_transcript(line)
        if not text:
            continue
        if text in held:
            dropped += 1
            continue
        kept.setdefault(text, None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(kept) + "\n", encoding="utf-8")
    print(f"{out}: {len(kept)} distinct texts ({sum(map(len, kept))} characters); {dropped} lines of the "
          f"{len(held)} valid/test texts left out")


def decode(t: Transcriber, data, beam: int, **fusion) -> tuple[dict, list[str]]:
    feats, refs, _ = data
    hyps = [h.text for h in t.transcribe(feats, beam=beam, max_len=300, **fusion)]
    return speech_metrics(hyps, refs), hyps


def by_voice(hyps: list[str], data) -> dict[str, float]:
    _, refs, speakers = data
    out = {}
    for who in sorted(set(speakers)):
        mine = [i for i, v in enumerate(speakers) if v == who]
        m = speech_metrics([hyps[i] for i in mine], [refs[i] for i in mine])
        out[who] = (len(mine), m["wer"], m["cer"])
    return out


def fuse(args) -> None:
    torch.set_num_threads(args.threads)
    t = Transcriber.load(args.run, "cpu")
    lm = LanguageModel.load(args.lm, "cpu")
    data = {}
    for split in ("valid", "test", "long"):
        utts = t.dataset().split(split)[: args.max_utterances]
        feats, kept, _ = read_features(utts, t.options.n_mels)
        data[split] = (feats, [utts[i].text for i in kept], [utts[i].speaker for i in kept])
    weights = [float(w) for w in args.weights.split(",")]
    rewards = [float(r) for r in args.rewards.split(",")]
    print(f"# {args.run} + {args.lm}: beam {args.beam}; " + ", ".join(f"{len(v[0])} {k}" for k, v in data.items()))
    print("\n| lambda | length reward | valid WER | valid CER | seconds |\n|---|---|---|---|---|")
    grid = []
    for w in weights:
        for r in rewards if w > 0 else [0.0]:
            started = time.time()
            fusion = {"lm": lm, "lm_weight": w, "length_reward": r} if w > 0 else {}
            m, _ = decode(t, data["valid"], args.beam, **fusion)
            grid.append({"lm_weight": w, "length_reward": r, "wer": m["wer"], "cer": m["cer"]})
            print(f"| {w:g} | {r:g} | {m['wer']:.1f} | {m['cer']:.1f} | {time.time() - started:.0f} |", flush=True)
    best = min(grid, key=lambda g: (g["wer"], g["cer"]))
    print(f"\nchosen on valid: lambda {best['lm_weight']:g}, length reward {best['length_reward']:g}")
    chosen = {"lm": lm, "lm_weight": best["lm_weight"], "length_reward": best["length_reward"]} \
        if best["lm_weight"] > 0 else {}
    result = {"run": args.run, "lm": args.lm, "beam": args.beam, "grid": grid, "chosen": best, "splits": {}}
    rows = []
    for split in ("test", "long"):
        for name, fusion in (("without", {}), ("with", chosen)):
            m, hyps = decode(t, data[split], args.beam, **fusion)
            voices = by_voice(hyps, data[split])
            result["splits"].setdefault(split, {})[name] = {"wer": m["wer"], "cer": m["cer"], "voices": voices}
            rows.append((split, name, m, voices))
    print("\n| split | language model | WER | CER | " + " | ".join(
        f"{v} WER / CER" for v in rows[0][3]) + " |")
    print("|---|---|---|---|" + "---|" * len(rows[0][3]))
    for split, name, m, voices in rows:
        print(f"| {split} | {name} | {m['wer']:.1f} | {m['cer']:.1f} | " + " | ".join(
            f"{w:.1f} / {c:.1f}" for _, w, c in voices.values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")


def table(args) -> None:
    runs = []
    for path in args.results:
        try:
            runs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: not the JSON of `speech_lm.py fuse --json` ({e})") from None
    voices = sorted({v for r in runs for split in r["splits"].values() for m in split.values() for v in m["voices"]})
    print("| run | lambda | length reward |\n|---|---|---|")
    for r in runs:
        print(f"| {r['run']} | {r['chosen']['lm_weight']:g} | {r['chosen']['length_reward']:g} |")
    print("\n| split | language model | WER by seed | WER | CER by seed | CER | " +
          " | ".join(f"{v} CER" for v in voices) + " | worst / best voice |")
    print("|---|---|---|---|---|---|" + "---|" * len(voices) + "---|")
    for split in ("test", "long"):
        for name in ("without", "with"):
            got = [r["splits"][split][name] for r in runs if split in r["splits"]]
            if not got:
                continue
            per_voice = {v: statistics.fmean(m["voices"][v][2] for m in got if v in m["voices"]) for v in voices}
            wer, cer = [m["wer"] for m in got], [m["cer"] for m in got]
            print(f"| {split} | {name} | {' / '.join(f'{x:.1f}' for x in wer)} | {_spread(wer)} | "
                  f"{' / '.join(f'{x:.1f}' for x in cer)} | {_spread(cer)} | "
                  + " | ".join(f"{c:.1f}" for c in per_voice.values())
                  + f" | {max(per_voice.values()) / max(min(per_voice.values()), 1e-9):.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("text", help="write the language model's text")
    p.add_argument("out", type=Path)
    p.add_argument("--corpus", default="sentences", choices=("sentences", "digits"))
    p.add_argument("--data-seed", type=int, default=0, help="the speech corpus's data_seed")
    p = sub.add_parser("fuse", help="choose the fusion weights on valid, then score test and long")
    p.add_argument("run", help="a speech run (qkv train speech --data sentences)")
    p.add_argument("lm", help="a language-model run (qkv train lm, characters)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--weights", default="0,0.1,0.2,0.3,0.5", help="lambda values tried on valid")
    p.add_argument("--rewards", default="0,0.5,1", help="length rewards tried on valid (with lambda > 0)")
    p.add_argument("--max-utterances", type=int, default=300, help="utterances per split")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    p = sub.add_parser("table", help="several seeds' fusion results side by side")
    p.add_argument("results", nargs="+", help="the --json of `fuse` runs")
    args = parser.parse_args()
    if args.command == "text":
        write_text(args.out, args.corpus, args.data_seed)
    elif args.command == "table":
        table(args)
    else:
        fuse(args)


if __name__ == "__main__":
    main()
