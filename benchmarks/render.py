"""Write BENCHMARKS.md from the results files in ``benchmarks/results/`` (one per capability, see ``record.py``).

    python benchmarks/render.py            # writes BENCHMARKS.md
    python benchmarks/render.py --check    # exits 1 where BENCHMARKS.md differs from what the results give

The documentation's performance page includes the part between the ``body`` markers, below its own title.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "BENCHMARKS.md"
WIDTH = 118

INTRO = """\
# Benchmarks

The current figure of every measurement, one section per capability: its target and whether it is met, the command
that measures it, the machine and the date; where a target is not met, why. The benchmark scripts, run with
`--record`, write their figures into `benchmarks/results/` (one JSON file per capability, with the number of threads,
the load average and the git revision of each run: `benchmarks/record.py`), and this file is made from them:

    python benchmarks/render.py       # or: make bench-report
"""


def load(results: Path = RESULTS) -> list[dict]:
    sections = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        data["name"] = path.stem
        sections.append(data)
    return sorted(sections, key=lambda s: (s.get("order", 100), s["name"]))


def _cell(text) -> str:
    return "" if text is None else str(text).replace("|", "\\|").replace("\n", " ")


def _machines(sections: list[dict]) -> dict[str, int]:
    names: dict[str, int] = {}
    for section in sections:
        for m in section["measurements"]:
            names.setdefault(m["machine"], len(names) + 1)
    return names


def _where(m: dict, machines: dict[str, int]) -> str:
    parts = [f"machine {machines[m['machine']]}"]
    if m.get("threads"):
        parts.append(f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}")
    if m.get("load"):
        load = str(m["load"])
        parts.append(f"load {load}" if load[0].isdigit() or load.startswith("about") else load)
    return ", ".join(parts)


def _figure(m: dict) -> str:
    return f"{m['figure']} {m['unit']}".strip() if m.get("unit") else str(m["figure"])


def _met(m: dict) -> str:
    return {True: "yes", False: "**no**"}.get(m.get("met"), "")


def render(sections: list[dict]) -> str:
    machines = _machines(sections)
    lines = [INTRO, "<!-- --8<-- [start:body] -->", "Machines of the tables:", ""]
    lines += [f"{number}. {_cell(name)}" for name, number in machines.items()]
    for section in sections:
        lines += ["", f"## {section['title']}", ""]
        if section.get("note"):
            lines += [*textwrap.wrap(section["note"], WIDTH, break_on_hyphens=False), ""]
        lines += ["| measurement | figure | target | met | command | machine | date |",
                  "|---|---|---|---|---|---|---|"]
        for m in section["measurements"]:
            command = f"`{_cell(m['command'])}`" if m.get("command") else ""
            lines.append(f"| {_cell(m['what'])} | {_cell(_figure(m))} | {_cell(m.get('target'))} | {_met(m)} | "
                         f"{command} | {_where(m, machines)} | {m['date']} |")
        why = [m for m in section["measurements"] if m.get("met") is False and m.get("why")]
        if why:
            lines += ["", "Where a target is not met:", ""]
            for m in why:
                lines += textwrap.wrap(f"- {m['what']} ({_figure(m)}): {m['why']}", WIDTH, subsequent_indent="  ",
                                       break_on_hyphens=False)
    lines += ["", "<!-- --8<-- [end:body] -->", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS, help="the folder of results files")
    ap.add_argument("--out", type=Path, default=OUT, help="the file to write (default: BENCHMARKS.md)")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    text = render(load(args.results))
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        if not same:
            print(f"{args.out} differs from {args.results}: run python benchmarks/render.py", file=sys.stderr)
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
