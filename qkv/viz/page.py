"""One self-contained HTML page that shows every attention of a model: :func:`attention_page`.

The page holds its data, script and style inline (no network, no CDN, no Jupyter): pick an attention (encoder
self, decoder self, cross, pooling, channel, spatial, per layer; attention rollout for stacks of self-attention),
a head or the mean of the heads, and a view: lines between two token columns (hover a token to see its row),
a matrix, the image with the selected query's attention over it, words shaded by weight, or channel weights as bars.
The current view can be saved as SVG or PNG. Weights are stored rounded to 1/255 (one byte each).

Beside the one-module view, the page gives every head at a glance: a layers x heads grid of thumbnails per stack of
attention modules and a sortable table of head statistics (:mod:`qkv.viz.head_stats`: entropy, mean distance, share
on the first token, previous-token and induction scores). A generation (``generation=``, from
:func:`qkv.integrations.generation.view_generation`) adds a step view: the produced text, clickable token by token
or with a slider, each step's chosen token, its probability and the top alternatives, that step's attention over
the context, and an encoder-decoder model's alignment matrix.

Any length: when the weights would take more than :data:`BUDGET` bytes, the records with more than
:data:`SPARSE_CELLS` cells per head keep each row's ``k`` largest weights (``k`` as large as the budget allows, at
most :data:`TOP_K`), with a downsampled overview of the whole matrix (an exact window opens where it is clicked);
the page says how much of each row's attention the kept weights hold. Rollout is left out for sequences longer than
:data:`ROLLOUT_MAX` tokens (said on the page).

Example::

    with qkv.capture_attention(model) as records:
        model(src, src_mask, tgt_in)
    save_attention_page("page.html", records, tokens={"source": src_tokens, "target": tgt_tokens})
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..capture import AttentionRecord, attention_rollout
from .head_stats import MEASURES, STATISTICS, head_statistics

__all__ = ["attention_page", "save_attention_page", "page_records", "PageInput", "BUDGET"]

#: bytes of weights (one per weight) a page holds before its large records keep only each row's top k
BUDGET = 12_000_000
#: cells per head above which a record may be stored as each row's top k
SPARSE_CELLS = 256 * 256
#: the most weights a row keeps when stored sparsely
TOP_K = 32
#: the side of the downsampled overview of a sparse record
OVERVIEW = 192
#: rollout is computed up to this many tokens (its cost grows as the cube of the length)
ROLLOUT_MAX = 2048

TokenLists = Mapping[str, Sequence[str]]


@dataclasses.dataclass
class PageInput:
    """What one page shows (what an application's ``view`` returns for ``qkv view``): the attention ``records``,
    the token lists of its axes, the image, a title and notes; ``save_attention_page(path, page.records,
    **page.page_kwargs())`` writes it."""

    records: list
    tokens: dict[str, list[str]] | list[str] | None = None
    image: Any = None
    title: str = "Attention"
    notes: list[str] = dataclasses.field(default_factory=list)
    importance: dict[str, list[float]] | None = None  # per record name: each head's importance (nats)

    def page_kwargs(self) -> dict[str, Any]:
        kwargs = {"tokens": self.tokens, "image": self.image, "title": self.title, "notes": self.notes}
        return kwargs if self.importance is None else {**kwargs, "importance": self.importance}


def _token_lists(tokens: Sequence[str] | TokenLists | None) -> dict[str, list[str]]:
    if tokens is None:
        return {}
    if isinstance(tokens, Mapping):
        return {str(k): [str(t) for t in v] for k, v in tokens.items()}
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings or a mapping of named lists, not one string")
    return {"tokens": [str(t) for t in tokens]}


def _pick(lists: dict[str, list[str]], n: int, prefer: Sequence[str]) -> str | None:
    """The name of the token list for an axis of length ``n``: a preferred one that fits, else any that fits."""
    for name in [*prefer, *lists]:
        if name in lists and len(lists[name]) == n:
            return name
    return None


def _axes(r: AttentionRecord, tq: int, tk: int, lists: dict[str, list[str]]) -> tuple[str | None, str | None]:
    decoder = r.causal or "decoder" in r.name.lower()
    if r.kind == "cross":
        return _pick(lists, tq, ("target",)), _pick(lists, tk, ("source", "tokens"))
    if r.kind == "pooling":
        return None, _pick(lists, tk, ("source", "tokens"))
    if r.kind in ("self", "rollout"):
        side = ("target",) if decoder else ("source", "tokens")
        name = _pick(lists, tk, side)
        return (name if tq == tk else _pick(lists, tq, side)), name
    return None, None


def _square_grid(n: int, image_hw: tuple[int, int] | None) -> tuple[int, int] | None:
    """``(h, w)`` with ``h * w = n`` closest to the image's aspect (keys of a captioning model's feature grid)."""
    if image_hw is None or n < 1:
        return None
    aspect = image_hw[0] / image_hw[1]
    best = None
    for h in range(1, n + 1):
        if n % h == 0:
            err = abs(h / (n // h) - aspect)
            if best is None or err < best[0]:
                best = (err, (h, n // h))
    return best[1] if best and best[0] < 0.5 else None


def _rollouts(records: Sequence[AttentionRecord]) -> list[AttentionRecord]:
    """One rollout record per stack of non-causal self-attention layers (names equal but for the layer number)."""
    stacks: dict[str, list[AttentionRecord]] = {}
    for r in records:
        if r.kind == "self" and not r.causal and r.layer is not None and r.grid is None:
            stacks.setdefault(re.sub(r"(?:^|\.)(\d+)(?=\.|$)", lambda m: m.group(0).replace(m.group(1), "*"),
                                     r.name), []).append(r)
    out = []
    for pattern, layers in stacks.items():
        shapes = {(x.weights.shape[0], *x.weights.shape[2:]) for x in layers}
        if len(shapes) != 1 or layers[0].weights.shape[-1] != layers[0].weights.shape[-2]:
            continue
        if layers[0].weights.shape[-1] > ROLLOUT_MAX:
            continue
        layers = sorted(layers, key=lambda x: x.layer)
        rolled = attention_rollout([x.weights for x in layers])
        out.append(AttentionRecord(f"rollout of {pattern}", "rollout", "rollout", None, rolled[:, None]))
    return out


def page_records(records: Sequence[AttentionRecord], *, rollout: bool = True) -> list[AttentionRecord]:
    """The records a page shows: ``records`` and, when ``rollout``, one rollout per self-attention stack."""
    records = list(records)
    for r in records:
        if not isinstance(r, AttentionRecord):
            raise TypeError(f"records must be AttentionRecord objects (from qkv.capture_attention), got "
                            f"{type(r).__name__}")
    return records + (_rollouts(records) if rollout else [])


def _bytes(w: Tensor) -> str:
    q = (w.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return base64.b64encode(q.contiguous().numpy().tobytes()).decode("ascii")


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def _sparse(w: Tensor, k: int) -> dict[str, Any]:
    """Each row's ``k`` largest weights of ``w (H, Tq, Tk)``: key indices (uint16, or uint32 past 65,535 keys,
    little-endian) and weights (uint8), with the share of each row's attention they hold (mean over rows)."""
    k = min(k, w.shape[-1])
    values, index = torch.topk(w.float(), k, dim=-1, sorted=False)
    total = w.float().sum(-1)
    kept = (values.sum(-1) / total.clamp_min(1e-12))[total > 0]
    dtype = torch.int32 if w.shape[-1] > 65535 else torch.int16
    idx = index.to(torch.int32) if dtype == torch.int32 else (index.to(torch.int32) - (index >= 32768) * 65536) \
        .to(torch.int16)
    return {"k": k, "idx": _b64(idx), "wide": dtype == torch.int32, "val": _bytes(values),
            "kept": round(float(kept.mean()) if kept.numel() else 1.0, 4)}


def _overview(w: Tensor) -> dict[str, Any]:
    """A downsampled ``(H, h, w)`` picture of ``w (H, Tq, Tk)`` (mean of each block, each head scaled to its
    largest value): at most :data:`OVERVIEW` a side."""
    h, tq, tk = w.shape
    small = nn.functional.adaptive_avg_pool2d(w.float()[None], (min(tq, OVERVIEW), min(tk, OVERVIEW)))[0]
    top = small.flatten(1).amax(-1).clamp_min(1e-12)
    return {"h": small.shape[1], "w": small.shape[2], "data": _bytes(small / top[:, None, None]),
            "max": [float(x) for x in top]}


def _stats_json(r: AttentionRecord, w: Tensor, lists: dict[str, list[str]], ktok: str | None) -> dict | None:
    """The head statistics of a self/cross record (computed one head at a time)."""
    if r.kind not in ("self", "cross") or w.dim() != 3:
        return None
    tokens = lists.get(ktok) if ktok else None
    stats = head_statistics(w, tokens, self_attention=r.kind == "self")
    return {k: [None if v != v else round(v, 4) for v in stats[k].tolist()] for k in STATISTICS}


def _record_json(r: AttentionRecord, i: int, example: int, lists: dict[str, list[str]],
                 image_hw: tuple[int, int] | None, grid: tuple[int, int] | None, k: int | None = None,
                 stats: bool = True) -> dict[str, Any]:
    if not 0 <= example < r.weights.shape[0]:
        raise ValueError(f"example {example} is out of range: {r.name} holds {r.weights.shape[0]} example(s)")
    w = r.weights[example]
    entry: dict[str, Any] = {"id": i, "name": r.name, "module": r.module, "kind": r.kind, "layer": r.layer,
                             "calls": r.calls, "causal": r.causal}
    if r.kind in ("self", "cross", "pooling", "rollout"):
        heads, tq, tk = w.shape
        qtok, ktok = _axes(r, tq, tk, lists)
        key_grid = r.grid[1] if r.grid else (grid if grid and grid[0] * grid[1] == tk else
                                              _square_grid(tk, image_hw) if r.kind == "cross" else None)
        entry.update(heads=heads, tq=tq, tk=tk, qtok=qtok, ktok=ktok, grid=key_grid,
                     qgrid=r.grid[0] if r.grid else None)
        if stats and r.kind in ("self", "cross"):
            entry["stats"] = _stats_json(r, w, lists, ktok)
        if k is not None and tq * tk > SPARSE_CELLS:
            entry.update(sparse=_sparse(w, k), overview=_overview(w))
            return entry
    elif r.kind == "channel":
        w = w[None] if w.dim() == 1 else w  # (C,) -> (1, C); SK: (M, C)
        entry.update(heads=1, tq=w.shape[0], tk=w.shape[1], qtok=None, ktok=None, grid=None, qgrid=None)
        w = w[None]
    elif r.kind == "spatial":
        h, wd = w.shape
        entry.update(heads=1, tq=1, tk=h * wd, qtok=None, ktok=None, grid=[h, wd], qgrid=None)
        w = w.reshape(1, 1, h * wd)
    else:
        raise ValueError(f"{r.name}: unknown kind {r.kind!r}")
    entry["data"] = _bytes(w)
    return entry


def _image_json(image: Any) -> tuple[dict[str, Any] | None, tuple[int, int] | None]:
    """A PNG data URL of ``image`` (a path, a PIL image, or a tensor ``(H, W)``/``(C, H, W)`` in [0, 1])."""
    if image is None:
        return None, None
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow comes with matplotlib (the viz extra)
        raise ImportError("an image on the page needs Pillow: pip install 'qkv[viz]'") from e
    if isinstance(image, (str, os.PathLike)):
        image = Image.open(image)
        image.load()
    elif isinstance(image, Tensor):
        t = image.detach().float().cpu()
        t = t[None] if t.dim() == 2 else t
        if t.dim() != 3 or t.shape[0] not in (1, 3):
            raise ValueError(f"image must be (H, W) or (C=1|3, H, W), got {tuple(image.shape)}")
        t = (t - t.min()) / (t.max() - t.min()).clamp_min(1e-12)
        arr = (t.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        image = Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)
    if not hasattr(image, "save"):
        raise TypeError(f"image must be a path, a PIL image or a tensor, got {type(image).__name__}")
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    h, w = image.size[1], image.size[0]
    return {"src": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), "h": h, "w": w}, (h, w)


def _script_json(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` can close the element or open a comment."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _top_k(shown: Sequence[AttentionRecord], budget: int) -> int | None:
    """The ``k`` of the sparse records (None: every record fits the budget dense)."""
    sizes = [r.weights[0].numel() for r in shown]
    if sum(sizes) <= budget:
        return None
    dense = sum(n for r, n in zip(shown, sizes, strict=True) if n / max(r.weights.shape[1], 1) <= SPARSE_CELLS
                or r.weights.dim() != 4)
    rows = sum(r.weights.shape[1] * r.weights.shape[2] for r, n in zip(shown, sizes, strict=True)
               if r.weights.dim() == 4 and n / max(r.weights.shape[1], 1) > SPARSE_CELLS)
    per_entry = 3  # a uint16 index and a uint8 weight (uint32 indices past 65,535 keys: 5)
    return max(1, min(TOP_K, (budget - dense) // max(per_entry * rows, 1)))


def attention_page(records: Sequence[AttentionRecord], *, tokens: Sequence[str] | TokenLists | None = None,
                   image: Any = None, title: str = "Attention", example: int = 0, rollout: bool = True,
                   grid: tuple[int, int] | None = None, notes: Sequence[str] = (), generation: Mapping | None = None,
                   head_stats: bool = True, budget: int = BUDGET,
                   importance: Mapping[str, Sequence[float]] | None = None) -> str:
    """The HTML of a page showing ``records`` (from :func:`qkv.capture_attention`) for one example of the batch.

    Args:
        records: what was captured.
        tokens: labels of the sequence axes: a list (one sequence), or named lists such as
            ``{"source": [...], "target": [...]}`` (cross-attention: target queries, source keys; a decoder's
            self-attention: target). An axis whose length no list has is numbered.
        image: shown under the attention over a feature grid (non-local blocks, spatial maps, a captioning
            model's attention over its grid): a path, a PIL image or a tensor ``(H, W)``/``(C, H, W)``.
        title: of the page (escaped).  example: which example of the batch.  rollout: add attention rollout
            for each stack of self-attention layers.  grid: ``(h, w)`` of a cross-attention's keys when they are
            a feature grid (default: guessed from the image's aspect).  notes: lines shown under the title.
        generation: the steps of a generation (``view_generation(...).generation``): the page's step view.
        head_stats: compute the head statistics of the table.  budget: bytes of weights before large records
            keep each row's top k (see the module's docstring).
        importance: ``{record name: one value per head}`` (:func:`qkv.integrations.importance.head_importance`,
            nats): the head grid is coloured by it and the table gets its column.
    """
    lists = _token_lists(tokens)
    title = shortened_title(str(title))
    shown = page_records(records, rollout=rollout)
    if not shown:
        raise ValueError("no attention to show: the records are empty (did the model run inside "
                         "qkv.capture_attention, and does it use qkv's attention layers?)")
    notes = [str(n) for n in notes]
    if rollout and any(r.kind == "self" and not r.causal and r.weights.dim() == 4 and r.weights.shape[-1] >
                       ROLLOUT_MAX for r in shown):
        notes.append(f"rollout is not computed above {ROLLOUT_MAX:,} tokens (its cost grows as the cube of the length)")
    k = _top_k(shown, budget)
    image_json, image_hw = _image_json(image)
    for name, values in (importance or {}).items():
        match = [r for r in shown if r.name == name]
        if not match:
            raise ValueError(f"importance names {name!r}, which is not one of the records")
        if len(values) != match[0].num_heads:
            raise ValueError(f"importance of {name}: {len(values)} values for {match[0].num_heads} heads")
    data = {"title": title, "notes": notes, "tokens": lists, "image": image_json,
            "records": [_record_json(r, i, example, lists, image_hw, grid, k, head_stats)
                        for i, r in enumerate(shown)],
            "generation": dict(generation) if generation else None, "statistics": STATISTICS,
            "measures": MEASURES}
    for entry in data["records"]:
        if importance and entry["name"] in importance:
            entry["importance"] = [round(float(v), 5) for v in importance[entry["name"]]]
    sparse = [r for r in data["records"] if "sparse" in r]
    if sparse:
        kept = min(r["sparse"]["kept"] for r in sparse)
        notes.append(f"{len(sparse)} large attention(s) keep each row's {k} largest weights (at least "
                     f"{100 * kept:.1f}% of each row's attention on average) and a downsampled overview; click the "
                     "overview for the exact weights around a point")
    assets = resources.files("qkv.viz") / "page_assets"
    style = (assets / "page.css").read_text(encoding="utf-8")
    script = (assets / "parts.js").read_text(encoding="utf-8") + (assets / "page.js").read_text(encoding="utf-8")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n<style>\n{style}</style></head>\n<body>\n'
            f'<script type="application/json" id="qkv-data">{_script_json(data)}</script>\n'
            f'<script>\n{script}</script>\n</body></html>\n')


#: the most characters of a page's title: a long input is shortened there (the page shows all of its tokens)
TITLE_MAX = 160


def shortened_title(title: str, limit: int = TITLE_MAX) -> str:
    """``title`` on one line, its middle left out (``…``) past ``limit`` characters: its start and end stay."""
    one = " ".join(title.split())
    if len(one) <= limit:
        return one
    head = (limit - 1) * 2 // 3
    return f"{one[:head].rstrip()}…{one[len(one) - (limit - 1 - head):].lstrip()}"


def save_attention_page(path: str | os.PathLike, records: Sequence[AttentionRecord], **kwargs: Any) -> Path:
    """Write :func:`attention_page` to ``path`` (``.html`` added when it has no extension; atomically: a partial
    page never replaces a good one). Returns the file written."""
    from .files import page_path, write_atomic

    path = page_path(path)
    return write_atomic(path, attention_page(records, **kwargs))
