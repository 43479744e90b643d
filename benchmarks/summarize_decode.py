"""Decoding settings of a trained summariser, compared on one split: beam, Wu et al.'s length penalty and trigram
blocking. Choose on ``valid``, then report ``test`` with the chosen setting only.

    python benchmarks/summarize_decode.py runs/sum/pointer+coverage --split valid --length-penalties 0,1,1.5,2,2.5,3
    python benchmarks/summarize_decode.py runs/sum/pointer+coverage --split test --length-penalties 0,2

Prints a Markdown table of ROUGE-1/2/L, repeated trigrams and mean output length per setting, beside the lead
sentence's ROUGE on the same examples.
"""

from __future__ import annotations

import argparse
import time

import torch

from qkv.apps.summarize import Summarizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--split", default="valid", choices=("valid", "test"))
    p.add_argument("--limit", type=int, default=1000, help="examples decoded (the split's first)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--length-penalties", default="0,1,2", help="comma-separated alphas of ((5 + |Y|) / 6)^alpha")
    p.add_argument("--no-repeat-ngram", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    summarizer = Summarizer.load(args.run)
    print(f"{args.run}, split {args.split}, first {args.limit}, beam {args.beam}, no-repeat-ngram "
          f"{args.no_repeat_ngram}\n")
    print("| length penalty | ROUGE-1 | ROUGE-2 | ROUGE-L | repeated trigrams | mean length (words) | seconds |")
    print("|---|---|---|---|---|---|---|")
    lead = None
    for alpha in (float(a) for a in args.length_penalties.split(",")):
        t0 = time.time()
        f = summarizer.evaluate(split=args.split, limit=args.limit, beam=args.beam, length_penalty=alpha,
                                no_repeat_ngram_size=args.no_repeat_ngram, baselines=lead is None)
        lead = lead or (f["lead_rouge1"], f["lead_rouge2"], f["lead_rougeL"])
        print(f"| {alpha:g} | {f['rouge1']:.2f} | {f['rouge2']:.2f} | {f['rougeL']:.2f} | "
              f"{100 * f['repeated_trigrams']:.2f}% | {f['length']:.2f} | {time.time() - t0:.0f} |", flush=True)
    print(f"| lead sentence | {lead[0]:.2f} | {lead[1]:.2f} | {lead[2]:.2f} | | | |")


if __name__ == "__main__":
    main()
