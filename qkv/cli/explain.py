"""``qkv explain``: the three stages of attention on the worked example of self-attention."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from ..apps.command import PlotOption, plot_file
from ..options import option
from ..scores import score_names
from .options import options_from_args


@dataclass
class ExplainCommand(PlotOption):
    score: str = option("dot", help=f"one of {', '.join(score_names())}, or package.module:function for your own "
                        "(q, k) -> scores (default: dot, shown without and with the 1/sqrt(d_k) scaling)")
    scale: float | None = option(None, help="one scale factor instead of the two default runs")
    normalize: str = option("softmax", choices=("softmax", "sparsemax"), help="normaliser")

    FLAG_HELP = {"plot": "save a heatmap of the (last) weights (PNG, SVG, PDF, JPEG)"}


def resolve_score(name: str):
    """A registered score name, or ``package.module:function`` for a custom ``(q, k) -> scores``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load score function {name!r} (--score): {e}") from None
    if name not in score_names():
        raise ValueError(f"unknown score {name!r} (--score); one of {', '.join(score_names())} or module:function")
    if name in ("general", "additive", "mlp"):
        from ..scores import create_score

        torch.manual_seed(0)
        return create_score(name, 3, 3, dtype=torch.float64)
    return name


def _fmt(t: torch.Tensor) -> str:
    return "\n".join("    [" + ", ".join(f"{v:8.4f}" for v in row) + "]" for row in t.tolist())


def run(args) -> int:
    from ..explain import walkthrough

    o = options_from_args(args, ExplainCommand)
    plot = plot_file(o.plot) if o.plot else None  # settled first: printed == written
    score = resolve_score(o.score)
    runs = [("without scaling", 1.0), ("with 1/sqrt(d_k) scaling", 3 ** -0.5)] if o.scale is None \
        else [(f"scale = {o.scale}", o.scale)]
    first = walkthrough(score, scale=1.0, normalize=o.normalize)
    print("qkv explain: the three stages of attention on the worked example of self-attention\n")
    print("inputs x (3 inputs of size 4):\n" + _fmt(first.inputs))
    print("\nkeys    K = x W_k + b_k:\n" + _fmt(first.keys))
    print("queries Q = x W_q + b_q:\n" + _fmt(first.queries))
    print("values  V = x W_v + b_v:\n" + _fmt(first.values))
    last = None
    for title, scale in runs:
        w = walkthrough(score, scale=scale, normalize=o.normalize)
        print(f"\n=== score = {o.score}, {title} ===")
        print("stage 1, similarity: scores[i, j] = score(q_i, k_j) * scale\n" + _fmt(w.scores))
        print(f"stage 2, normalisation ({o.normalize}): weights, each row sums to 1\n" + _fmt(w.weights))
        print("stage 3, weighted sum: outputs = weights @ V\n" + _fmt(w.outputs))
        last = (title, w)
    if o.plot:
        from ..viz import heatmap

        title, w = last
        labels = ["input 1", "input 2", "input 3"]
        heatmap(w.weights, x_labels=labels, y_labels=labels, title=f"{o.score}, {title}", path=plot)
        print(f"\nwrote {plot}")
    return 0



#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("explain", "walk through similarity -> normalisation -> weighted sum on the "
            "worked example of self-attention", ExplainCommand, run)
