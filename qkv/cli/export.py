"""``qkv export RUN --out DIR [--with-weights]``: a trained run as ONNX graphs, servable without PyTorch."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from .options import options_from_args


@dataclass
class ExportCommand:
    run: str = option(positional=True, help="the run directory (what qkv train wrote)")
    out: str | None = option(None, metavar="DIR", help="directory for the graphs, tokenisers and configuration "
                             "(created; required)")
    with_weights: bool = option(False, help="add every attention module's weights as named outputs "
                                "(attention.<module path>)")


def run(args) -> int:
    from ..apps.export import export_run

    o = options_from_args(args, ExportCommand)
    if not o.out:
        raise ValueError("--out DIR is required: the directory to write the graphs to")
    manifest = export_run(o.run, o.out, with_weights=o.with_weights)
    for name, graph in manifest["graphs"].items():
        print(f"{name}: {o.out}/{graph['file']}  inputs {', '.join(graph['inputs'])}  outputs "
              f"{', '.join(graph['outputs'])}")
    print(f"wrote {o.out}/export.json, config.json and {', '.join(manifest['assets']) or 'no tokeniser'}")
    return 0


#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("export", "export a trained run to ONNX (graphs, tokenisers, configuration) for serving without PyTorch",
           ExportCommand, run)
