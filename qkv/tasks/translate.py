"""Translation with attention: data + tokenisers + an encoder-decoder + the shared trainer, and the commands
``qkv train translate``, ``qkv translate`` and ``qkv evaluate``.

The default data is the multilingual date task (human-written dates in 14 locales -> ISO 8601, characters);
any Tatoeba/Anki file works too (subword tokens trained on its training split).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import nn

from ..train.task import Task
from .common import print_result

logger = logging.getLogger(__name__)

MODELS = ("fixed", "bahdanau", "luong", "transformer")


@dataclass
class TranslateOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    data: str = "dates"  # "dates" or a Tatoeba/Anki file (source<TAB>target[<TAB>attribution], .gz allowed)
    model: str = "bahdanau"  # fixed | bahdanau | luong | transformer
    score: str | None = None  # attention score; default: additive (bahdanau), general (luong), scaled_dot
    # corpora
    src_lang: str | None = None  # choose the direction by language ("en", "fra"...), or
    reverse: bool = False  # swap the file's columns
    max_pairs: int | None = None  # cap on pairs read from a corpus (whole source groups)
    max_length: int | None = 20  # drop corpus pairs longer than this many words on either side
    tokenizer: str = "auto"  # char | bpe | unigram | word; auto = char for dates, bpe for corpora
    vocab_size: int = 8000  # subword vocabulary size (each side)
    # dates
    n_train: int = 50_000  # generated training dates (valid/test: n_eval each)
    n_eval: int = 1_000
    data_seed: int = 0  # the split and generation seed of the data (independent of the training seed)
    # model sizes
    embed_dim: int = 64
    hidden_dim: int = 128  # RNN hidden size / Transformer d_model
    layers: int = 1  # RNN layers, or Transformer layers per stack
    heads: int = 4  # Transformer heads
    dropout: float = 0.1
    cell: str = "gru"
    # loss and evaluation
    label_smoothing: float = 0.1
    eval_beam: int = 1  # beam used by evaluation during training (1 = greedy: fast)
    eval_max: int = 1000  # sentences decoded per evaluation
    max_decode_len: int = 64

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.tokenizer not in ("auto", "char", "bpe", "unigram", "word"):
            raise ValueError(f"tokenizer must be auto, char, bpe, unigram or word, got {self.tokenizer!r}")
        if self.data != "dates" and not Path(self.data).is_file():
            raise ValueError(f"--data must be 'dates' or an existing file, got {self.data!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def score_name(self) -> str:
        if self.score:
            return self.score
        return {"bahdanau": "additive", "luong": "general", "transformer": "scaled_dot"}.get(self.model, "additive")


def build_model(config: dict[str, Any]) -> nn.Module:
    """Rebuild a translation model from a checkpoint's ``config`` (``{"model": KIND, "arch": {...}}``)."""
    kind, arch = config["model"], config["arch"]
    if kind == "transformer":
        from ..models.transformer import TransformerConfig, TransformerSeq2Seq

        return TransformerSeq2Seq(TransformerConfig(**arch))
    from ..models.seq2seq import RNN_MODELS, RNNConfig

    if kind not in RNN_MODELS:
        raise ValueError(f"unknown translation model {kind!r}")
    return RNN_MODELS[kind](RNNConfig(**arch))


def load_corpus(opts: TranslateOptions):
    from ..data import date_corpus, load_parallel

    if opts.data == "dates":
        return date_corpus(opts.n_train, opts.n_eval, opts.n_eval, seed=opts.data_seed)
    kw: dict[str, Any] = {"max_length": opts.max_length, "max_pairs": opts.max_pairs, "seed": opts.data_seed}
    if opts.src_lang:
        return load_parallel(opts.data, src_lang=opts.src_lang, **kw)
    return load_parallel(opts.data, reverse=opts.reverse, **kw)


class TranslationTask(Task):
    """Sequence-to-sequence training with label-smoothed cross-entropy over target tokens."""

    name = "translate"
    unit = "tokens"

    def __init__(self, opts: TranslateOptions):
        self.opts = opts
        self.src_tok = self.tgt_tok = None
        self.corpus = None
        self._encoded: dict[str, Any] = {}

    # -- data -----------------------------------------------------------------------------------------
    def setup(self) -> None:
        from ..data import EncodedPairs, train_tokenizer

        self.corpus = load_corpus(self.opts)
        logger.info("data %s: %d train, %d valid, %d test pairs", self.opts.data, len(self.corpus.train),
                    len(self.corpus.valid), len(self.corpus.test))
        if self.src_tok is None:
            kind = self.opts.tokenizer if self.opts.tokenizer != "auto" else \
                ("char" if self.opts.data == "dates" else "bpe")
            kw = {} if kind == "char" else {"vocab_size": self.opts.vocab_size} if kind in ("bpe", "unigram") else {}
            self.src_tok = train_tokenizer(kind, (s for s, _ in self.corpus.train), **kw)
            self.tgt_tok = train_tokenizer(kind, (t for _, t in self.corpus.train), **kw)
        self._encoded["train"] = EncodedPairs(self.corpus.train, self.src_tok, self.tgt_tok,
                                              max_src_len=256, max_tgt_len=256)

    def train_examples(self):
        return self._encoded["train"]

    def lengths(self):
        return self._encoded["train"].lengths

    def collate(self, examples):
        from ..data import PairCollator

        return PairCollator()(examples)

    def save_assets(self, directory: Path) -> None:
        self.src_tok.save(directory / "src_tokenizer")
        self.tgt_tok.save(directory / "tgt_tokenizer")

    def load_assets(self, directory: Path) -> None:
        from ..data import load_tokenizer

        self.src_tok = load_tokenizer(directory / "src_tokenizer")
        self.tgt_tok = load_tokenizer(directory / "tgt_tokenizer")

    # -- model ----------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        o = self.opts
        if o.model == "transformer":
            arch = {"src_vocab": self.src_tok.vocab_size, "tgt_vocab": self.tgt_tok.vocab_size, "d_model": o.hidden_dim,
                    "heads": o.heads, "ffn_dim": 4 * o.hidden_dim, "encoder_layers": o.layers,
                    "decoder_layers": o.layers, "dropout": o.dropout, "score": o.score_name}
        else:
            arch = {"src_vocab": self.src_tok.vocab_size, "tgt_vocab": self.tgt_tok.vocab_size,
                    "embed_dim": o.embed_dim, "hidden_dim": o.hidden_dim, "layers": o.layers, "cell": o.cell,
                    "dropout": o.dropout, "score": o.score_name, "attn_dim": o.hidden_dim}
        return {"model": o.model, "arch": arch, "options": dataclasses.asdict(o)}

    def build_model(self) -> nn.Module:
        return build_model(self.config())

    def loss(self, model, batch):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        target = batch.tgt_out
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=0,
                               reduction="sum", label_smoothing=self.opts.label_smoothing)
        real = batch.tgt_mask
        correct = ((logits.argmax(-1) == target) & real).sum()
        return loss, real.sum(), {"token_acc": correct}

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r} (valid, test)")
        pairs = self.corpus.split(split)[: self.opts.eval_max]
        hyps = translate_texts(model, self.src_tok, self.tgt_tok, [s for s, _ in pairs], beam=self.opts.eval_beam,
                               max_len=self.opts.max_decode_len)
        return score_translations([h["text"] for h in hyps], [t for _, t in pairs])


# ----------------------------------------------------------------------------------------------- helpers

def translate_texts(model, src_tok, tgt_tok, texts: list[str], *, beam: int = 1, max_len: int = 64,
                    batch_size: int = 64, length_penalty: float = 0.6) -> list[dict[str, Any]]:
    """Translate ``texts`` in batches; each result has ``text``, ``tokens`` (target pieces), ``src_tokens``,
    ``attention`` ``(T, S)`` and ``score``."""
    from ..data import pad_sequences
    from ..models.decoding import beam_search

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: dict[int, dict[str, Any]] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids = [src_tok.encode(texts[i])[:256] or [3] for i in idx]
        src, _, mask = pad_sequences(ids)
        hyps = beam_search(model, src.to(device), mask.to(device), beam=beam, max_len=max_len,
                           length_penalty=length_penalty)
        for i, ids_i, h in zip(idx, ids, hyps, strict=True):
            results[i] = {"text": tgt_tok.decode(h.tokens), "tokens": tgt_tok.tokens_of_ids(h.tokens),
                          "src_tokens": src_tok.tokens_of_ids(ids_i), "attention": h.attention[:, :len(ids_i)],
                          "score": h.score}
    model.train(was_training)
    return [results[i] for i in range(len(texts))]


def score_translations(hyps: list[str], refs: list[str] | list[list[str]]) -> dict[str, float]:
    """BLEU and chrF (sacrebleu) and exact match; ``refs`` may give several references per sentence."""
    import sacrebleu

    multi = [r if isinstance(r, list) else [r] for r in refs]
    width = max((len(r) for r in multi), default=1)
    streams = [[r[i] if i < len(r) else r[0] for r in multi] for i in range(width)]
    exact = sum(h.strip() in {x.strip() for x in r} for h, r in zip(hyps, multi, strict=True))
    return {
        "exact_match": exact / max(len(hyps), 1),
        "bleu": sacrebleu.corpus_bleu(hyps, streams).score if hyps else 0.0,
        "chrf": sacrebleu.corpus_chrf(hyps, streams).score if hyps else 0.0,
        "sentences": float(len(hyps)),
    }


def bleu_by_length(sources: list[str], hyps: list[str], refs: list[list[str]], lengths: list[int],
                   buckets: list[tuple[int, int]]) -> list[dict[str, float]]:
    """Corpus BLEU of the sentences whose source length falls in each ``[lo, hi]`` bucket."""
    rows = []
    for lo, hi in buckets:
        sel = [i for i, n in enumerate(lengths) if lo <= n <= hi]
        s = score_translations([hyps[i] for i in sel], [refs[i] for i in sel]) if sel else \
            {"bleu": math.nan, "chrf": math.nan, "exact_match": math.nan, "sentences": 0.0}
        rows.append({"bucket": f"{lo}-{hi}", **s})
    return rows


def alignment_plot(result: dict[str, Any], path: str, title: str | None = None) -> None:
    """Heatmap of one translation's attention: target tokens (rows) x source tokens (columns)."""
    from ..viz import heatmap

    def visible(tokens):  # a space token would be an empty label
        return [t.replace(" ", "␣") if t.strip() == "" else t for t in tokens]

    att = result["attention"]
    ys = result["tokens"] + (["</s>"] if att.shape[0] > len(result["tokens"]) else [])
    heatmap(att[: len(ys)], x_labels=visible(result["src_tokens"]), y_labels=visible(ys), xlabel="source",
            ylabel="target", title=title, path=path, annotate=False)


# ----------------------------------------------------------------------------------------------- commands

def _load(checkpoint: str, device: str):
    from ..data import load_tokenizer
    from ..train import load_model, resolve_device

    dev = resolve_device(device)
    model, ckpt = load_model(checkpoint, build_model, device=dev, task=TranslationTask.name)
    return model, load_tokenizer(ckpt.assets / "src_tokenizer"), load_tokenizer(ckpt.assets / "tgt_tokenizer"), ckpt


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import config_from_args, train

    opts = _options_from_args(args)
    cfg = config_from_args(args, _train_defaults(), monitor="exact_match" if opts.data == "dates" else "bleu",
                           extra={"command": " ".join(sys.argv)})
    result = train(TranslationTask(opts), cfg)
    print_result(result)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    model, src_tok, tgt_tok, _ = _load(args.checkpoint, args.device)
    texts = list(args.text)
    if args.file:
        lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise ValueError("give sentences to translate, or --file")
    results = translate_texts(model, src_tok, tgt_tok, texts, beam=args.beam, max_len=args.max_len)
    lines = [r["text"] for r in results]
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {len(lines)} translations to {args.output}")
    else:
        for src, r in zip(texts, results, strict=True):
            print(f"{src}\t{r['text']}")
    if args.plot:
        paths = [args.plot] if len(results) == 1 else [
            str(Path(args.plot).with_name(f"{Path(args.plot).stem}-{i}{Path(args.plot).suffix}"))
            for i in range(len(results))]
        for src, r, p in zip(texts, results, paths, strict=True):
            alignment_plot(r, p, title=f"{src} -> {r['text']}")
            print(f"wrote {p}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..data import load_parallel

    rows: dict[str, list[dict[str, float]]] = {}
    totals: dict[str, dict[str, float]] = {}
    buckets = _parse_buckets(args.buckets)
    for ckpt_path in args.checkpoints:
        model, src_tok, tgt_tok, ckpt = _load(ckpt_path, args.device)
        opts = TranslateOptions(**ckpt.config["options"])
        if args.data:
            opts = dataclasses.replace(opts, data=args.data)
        corpus = load_corpus(opts) if args.data is None or args.data == "dates" else \
            load_parallel(args.data, src_lang=opts.src_lang, reverse=opts.reverse if not opts.src_lang else None,
                          max_length=opts.max_length, max_pairs=opts.max_pairs, seed=opts.data_seed)
        grouped = corpus.references(args.split)[: args.max_sentences]
        sources = [s for s, _ in grouped]
        refs = [r for _, r in grouped]
        results = translate_texts(model, src_tok, tgt_tok, sources, beam=args.beam, max_len=args.max_len)
        hyps = [r["text"] for r in results]
        lengths = [len(r["src_tokens"]) if args.length_unit == "tokens" else len(s.split())
                   for s, r in zip(sources, results, strict=True)]
        name = Path(ckpt_path).name or ckpt_path
        totals[name] = score_translations(hyps, refs)
        rows[name] = bleu_by_length(sources, hyps, refs, lengths, buckets)
    print(f"split {args.split}, beam {args.beam}")
    print("| checkpoint | BLEU | chrF | exact match | sentences |\n|---|---|---|---|---|")
    for name, m in totals.items():
        print(f"| {name} | {m['bleu']:.2f} | {m['chrf']:.2f} | {m['exact_match']:.4f} | {int(m['sentences'])} |")
    print(f"\nBLEU by source length ({args.length_unit}):")
    print("| bucket | " + " | ".join(rows) + " | sentences |\n|---|" + "---|" * (len(rows) + 1))
    for i, (lo, hi) in enumerate(buckets):
        vals = " | ".join(f"{rows[n][i]['bleu']:.2f}" for n in rows)
        print(f"| {lo}-{hi} | {vals} | {int(next(iter(rows.values()))[i]['sentences'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"totals": totals, "buckets": rows}, indent=2), encoding="utf-8")
    if args.plot:
        from ..viz.heatmap import _pyplot

        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, rs in rows.items():
            ax.plot([r["bucket"] for r in rs], [r["bleu"] for r in rs], marker="o", label=name)
        ax.set_xlabel(f"source length ({args.length_unit})")
        ax.set_ylabel("BLEU")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=150)
        plt.close(fig)
        print(f"wrote {args.plot}")
    return 0


def _parse_buckets(text: str) -> list[tuple[int, int]]:
    edges = [int(x) for x in text.split(",")]
    if len(edges) < 2 or edges != sorted(edges) or edges[0] < 0:
        raise ValueError(f"--buckets needs increasing edges like 0,10,20,30, got {text!r}")
    return [(lo if i == 0 else lo + 1, hi) for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True))]


def _train_defaults():
    from ..train import TrainConfig

    return TrainConfig(epochs=10, batch_size=64, lr=2e-3, warmup_steps=200, schedule="cosine", weight_decay=0.01)


def _options_from_args(args) -> TranslateOptions:
    names = {f.name for f in dataclasses.fields(TranslateOptions)}
    return TranslateOptions(**{k: v for k, v in vars(args).items() if k in names and v is not None})


def register_cli(commands, train_commands) -> None:
    from ..train import add_arguments

    d = TranslateOptions()
    p = train_commands.add_parser("translate", help="train a translator (dates or a Tatoeba/Anki corpus)",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data and model")
    g.add_argument("--data", default=d.data, help="'dates' or a source<TAB>target file (.gz allowed)")
    g.add_argument("--model", default=d.model, choices=MODELS)
    g.add_argument("--score", default=None, help="attention score (any qkv score name)")
    g.add_argument("--src-lang", default=None, help="source language of a corpus (chooses the direction)")
    g.add_argument("--reverse", action="store_true", help="swap the corpus columns")
    g.add_argument("--max-pairs", type=int, default=None, help="cap on corpus pairs")
    g.add_argument("--max-length", type=int, default=d.max_length, help="max words per side (corpora)")
    g.add_argument("--tokenizer", default=d.tokenizer, choices=["auto", "char", "bpe", "unigram", "word"])
    g.add_argument("--vocab-size", type=int, default=d.vocab_size)
    g.add_argument("--n-train", type=int, default=d.n_train, help="generated training dates")
    g.add_argument("--embed-dim", type=int, default=d.embed_dim)
    g.add_argument("--hidden-dim", type=int, default=d.hidden_dim)
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--heads", type=int, default=d.heads)
    g.add_argument("--dropout", type=float, default=d.dropout)
    g.add_argument("--cell", default=d.cell, choices=["gru", "lstm"])
    g.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    g.add_argument("--eval-max", type=int, default=d.eval_max, help="sentences decoded per evaluation")
    add_arguments(p, _train_defaults())
    p.set_defaults(func=cmd_train)

    p = commands.add_parser("translate", help="translate text with a trained checkpoint")
    p.add_argument("checkpoint", help="run directory or checkpoint directory")
    p.add_argument("text", nargs="*", help="sentences to translate")
    p.add_argument("--file", help="one sentence per line")
    p.add_argument("--output", help="write translations here, one per line")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len", type=int, default=100)
    p.add_argument("--plot", help="alignment heatmap PNG/SVG (numbered per sentence when several)")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_translate)

    p = commands.add_parser("evaluate", help="BLEU, chrF, exact match and BLEU by source length of checkpoints")
    p.add_argument("checkpoints", nargs="+", help="run or checkpoint directories, compared side by side")
    p.add_argument("--data", default=None, help="'dates' or a corpus file (default: the checkpoint's own data)")
    p.add_argument("--split", default="test", choices=["valid", "test"])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len", type=int, default=100)
    p.add_argument("--max-sentences", type=int, default=None)
    p.add_argument("--buckets", default="0,10,20,30,40,60", help="edges of the source-length buckets")
    p.add_argument("--length-unit", default="tokens", choices=["tokens", "words"])
    p.add_argument("--plot", help="BLEU-by-length plot (PNG/SVG)")
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_evaluate)


__all__ = ["TranslateOptions", "TranslationTask", "build_model", "translate_texts", "score_translations",
           "bleu_by_length", "alignment_plot", "register_cli"]
