"""The results files behind BENCHMARKS.md: one JSON file per capability in ``benchmarks/results/``.

A benchmark script calls :func:`record` once it has its figures::

    from record import measurement, record  # benchmarks/ is the script's own folder

    record("translate", [measurement("dates-bahdanau-exact", "dates, Bahdanau, test exact match", 0.999,
                                     target=">= 0.99")])

Each measurement is updated in place by its key (a new key is added at the end) with its figure, unit, the command
that produced it (this process's command line), the machine, the number of torch threads, the load average at the
start and at the end of the run, the date and ``git rev-parse --short HEAD``. What a script does not say (the
target, a "why not met" note) is kept from the file, and BENCHMARKS.md is written again from the results
(``benchmarks/render.py``; not for a trial run into another folder). A script adds the option with
:func:`record_flag`.

A file holds ``{"title", "order", "note", "measurements": [...]}``; a measurement holds ``key``, ``what``,
``figure`` (the text shown), ``value`` (a number, or null where the figure is not one), ``unit``, ``target``
(e.g. ``">= 0.95"``, or null), ``met`` (true, false or null), ``why`` (null where met), ``command``, ``machine``,
``threads``, ``load``, ``date`` and ``revision``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = ROOT / "benchmarks" / "results"
RESULTS = Path(os.environ.get("QKV_BENCH_RESULTS") or DEFAULT_RESULTS)  # another folder: a trial run
FIELDS = ("key", "what", "figure", "value", "unit", "target", "met", "why", "command", "machine", "threads", "load",
          "date", "revision")
_START_LOAD = os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> str:
    """The machine in words: cores, CPU, the GPU where ``device`` is one, torch's version."""
    import torch

    text = f"{os.cpu_count()} cores, {platform.machine()} {cpu_name()}"
    if str(device).startswith("cuda") and torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(torch.device(device))}"
    return f"{text}, torch {torch.__version__}"


def revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def load() -> str | None:
    """The 1-minute load average at the start of this process and now: "1.0-2.3"."""
    if _START_LOAD is None:
        return None
    now = os.getloadavg()[0]
    low, high = sorted((_START_LOAD, now))
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _number(text: str) -> float:
    return float(text.replace(",", "").rstrip("x%"))


def is_met(value, target: str | None) -> bool | None:
    """Whether a numeric ``value`` meets a target written ``">= 0.95x"``, ``"<= 1.5x"``, ``"> 1x"`` or ``"< 2%"``."""
    if value is None or not target:
        return None
    m = re.fullmatch(r"\s*(>=|<=|>|<)\s*([-\d.,]+)\s*[x%]?\s*", target)
    if not m:
        return None
    bound = _number(m.group(2))
    return {">=": value >= bound, "<=": value <= bound, ">": value > bound, "<": value < bound}[m.group(1)]


def measurement(key: str, what: str | None, value=None, unit: str = "", *, figure: str | None = None,
                target: str | None = None, met: bool | None = None, why: str | None = None) -> dict:
    """One figure (``what=None`` keeps the file's description). ``figure`` is the text shown (``value`` formatted
    when not given); ``met`` is computed from a numeric value and a target of the form ``">= 0.95"`` when not given."""
    if figure is None:
        figure = _fmt(value) if isinstance(value, (int, float)) else str(value)
    if met is None:
        met = is_met(value if isinstance(value, (int, float)) else None, target)
    item = {"key": key, "what": what, "figure": figure, "value": value if isinstance(value, (int, float)) else None,
            "unit": unit}
    for name, given in (("target", target), ("met", met), ("why", why)):
        if given is not None:
            item[name] = given
    return item


def record_flag(parser, section: str, what: str = "") -> None:
    """Add ``--record`` to a benchmark script's ``parser``: its figures go into ``benchmarks/results/SECTION.json``
    (``what``: which, when not all) and BENCHMARKS.md."""
    parser.add_argument("--record", action="store_true",
                        help=f"update benchmarks/results/{section}.json{', ' + what if what else ''} and BENCHMARKS.md")


def record(section: str, measurements: list[dict], *, command: str | None = None, threads: int | None = None,
           device: str = "cpu", title: str | None = None, results: Path | None = None) -> Path:
    """Update ``benchmarks/results/<section>.json`` with ``measurements`` (dicts from :func:`measurement`), and
    BENCHMARKS.md with it when the results are the project's own."""
    path = (results or RESULTS) / f"{section}.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {
        "title": title or section.capitalize(), "order": 100, "note": "", "measurements": []}
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    context = {
        "command": command or "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "machine": machine(device), "threads": threads, "load": load(),
        "date": datetime.date.today().isoformat(), "revision": revision(),
    }
    by_key = {m["key"]: m for m in data["measurements"]}
    for new in measurements:
        new = {k: v for k, v in new.items() if not (k == "what" and v is None)}  # the file's description stays
        old = by_key.get(new["key"])
        item = {**(old or {}), **new, **context}
        if "met" not in new and item.get("value") is not None and item.get("target"):
            item["met"] = is_met(item["value"], item["target"])  # the file's target, this run's figure
        if item.get("met") is not False:
            item["why"] = None  # met (or no target): no reason to give
        item = {name: item.get(name) for name in FIELDS}
        if old is None:
            data["measurements"].append(item)
        else:
            data["measurements"][data["measurements"].index(old)] = item
        by_key[new["key"]] = item
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if path.parent == DEFAULT_RESULTS:  # the project's own results, not a trial run's
        _render(DEFAULT_RESULTS, ROOT / "BENCHMARKS.md")
    return path


def _render(results: Path, out: Path) -> None:
    """``out`` (BENCHMARKS.md) from ``results`` by ``render.py`` beside this file, however this module was imported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_render", Path(__file__).with_name("render.py"))
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    render.main(["--results", str(results), "--out", str(out)])
