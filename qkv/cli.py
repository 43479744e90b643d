"""The ``qkv`` command line: thin subcommands that parse, call the library, and print."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

import torch

from . import __version__
from .memory import keep_freed_memory
from .scores import score_names


def _resolve_score(name: str):
    """A registered score name, or ``package.module:function`` for a custom ``(q, k) -> scores``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise SystemExit(f"qkv: cannot load score function {name!r}: {e}") from None
        return fn
    if name in ("general", "additive", "mlp"):
        from .scores import create_score

        torch.manual_seed(0)
        return create_score(name, 3, 3, dtype=torch.float64)
    return name


def _fmt(t: torch.Tensor) -> str:
    rows = t.tolist()
    return "\n".join("    [" + ", ".join(f"{v:8.4f}" for v in row) + "]" for row in rows)


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import walkthrough

    score = _resolve_score(args.score)
    runs = [("without scaling", 1.0), ("with 1/sqrt(d_k) scaling", 3 ** -0.5)] if args.scale is None \
        else [(f"scale = {args.scale}", args.scale)]
    first = walkthrough(score, scale=1.0, normalize=args.normalize)
    print("qkv explain: the three stages of attention on the example of seed 001\n")
    print("inputs x (3 inputs of size 4):\n" + _fmt(first.inputs))
    print("\nkeys    K = x W_k + b_k:\n" + _fmt(first.keys))
    print("queries Q = x W_q + b_q:\n" + _fmt(first.queries))
    print("values  V = x W_v + b_v:\n" + _fmt(first.values))
    last = None
    for title, scale in runs:
        w = walkthrough(score, scale=scale, normalize=args.normalize)
        print(f"\n=== score = {args.score}, {title} ===")
        print("stage 1, similarity: scores[i, j] = score(q_i, k_j) * scale\n" + _fmt(w.scores))
        print(f"stage 2, normalisation ({args.normalize}): weights, each row sums to 1\n" + _fmt(w.weights))
        print("stage 3, weighted sum: outputs = weights @ V\n" + _fmt(w.outputs))
        last = (title, w)
    if args.plot:
        from .viz import heatmap

        title, w = last
        labels = ["input 1", "input 2", "input 3"]
        heatmap(w.weights, x_labels=labels, y_labels=labels, title=f"{args.score}, {title}", path=args.plot)
        print(f"\nwrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description="Attention mechanisms: explain, train, look inside.")
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch (default: its own choice; 1 is faster when the cores are busy)")
    parser.add_argument("--release-memory", action="store_true",
                        help="let the C library give freed memory back to the system at once (by default qkv keeps "
                             "it for reuse, which makes large temporary tensors cheaper: see qkv.memory)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("explain", help="walk through similarity -> normalisation -> weighted sum on seed 001's example")
    p.add_argument("--score", default="dot",
                   help=f"one of {', '.join(score_names())}, or package.module:function for your own (q, k) -> scores "
                        "(default: dot, shown without and with the 1/sqrt(d_k) scaling)")
    p.add_argument("--scale", type=float, default=None, help="one scale factor instead of the two default runs")
    p.add_argument("--normalize", default="softmax", choices=["softmax", "sparsemax"])
    p.add_argument("--plot", metavar="PNG", help="save a heatmap of the (last) weights")
    p.set_defaults(func=cmd_explain)

    train = sub.add_parser("train", help="train a model for one of the tasks")
    train_sub = train.add_subparsers(dest="task", required=True, metavar="TASK")
    for module in task_modules():
        module.register_cli(sub, train_sub)
    return parser


# Each task module defines `register_cli(commands, train_commands)`: it adds `qkv train <task>` to
# `train_commands` and its own commands (e.g. `qkv translate`) to `commands`, importing heavy modules
# only inside the functions it sets as `func`.
TASK_MODULES = ("qkv.tasks.translate", "qkv.tasks.images", "qkv.tasks.sentiment")


def task_modules():
    """The task modules that exist in this installation, imported."""
    import importlib.util

    return [importlib.import_module(name) for name in TASK_MODULES if importlib.util.find_spec(name) is not None]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.threads is not None:
        if args.threads < 1:
            print(f"qkv: error: --threads must be at least 1, got {args.threads}", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    if not args.release_memory:
        keep_freed_memory()
    try:
        return args.func(args)
    except (ValueError, FileExistsError, FileNotFoundError) as e:  # bad input: a message, not a traceback
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
