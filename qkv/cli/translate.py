"""``qkv translate``: text translated by a translation run, with its alignment pictures."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from ..tasks import translate as task
from ..viz.files import picture_path, write_atomic
from .common import add_command, input_texts, numbered_paths, safe
from .options import options_from_args


@dataclass
class TranslateCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory")
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="sentences to translate")
    file: str | None = option(None, help="a file of sentences, one per line")
    output: str | None = option(None, help="write the translations here, one per line")
    beam: int = option(5, low=1, high=100, help="beam size (1 = greedy)")
    max_len: int = option(100, low=1, help="longest translation, in tokens")
    plot: str | None = option(None, help="alignment heatmap PNG/SVG (numbered per sentence when several)")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def translate(args) -> int:
    from ..viz.plots import alignment

    o = options_from_args(args, TranslateCommand)
    plot = picture_path(o.plot, option="--plot") if o.plot else None  # settled first: printed == written
    texts = input_texts(o.text, o.file, "sentences to translate")
    translator = task.Translator.load(o.run, o.device)
    results = translator.predict(texts, beam=o.beam, max_len=o.max_len)
    if o.output:
        written = write_atomic(o.output, "\n".join(r.text for r in results) + "\n", option="--output")
        print(f"wrote {len(results)} translations to {written}")
    else:
        for r in results:
            print(f"{safe(r.source)}\t{safe(r.text)}")
    if plot:
        for r, path in zip(results, numbered_paths(str(plot), len(results)), strict=True):
            alignment(r.attention, r.source_tokens, r.tokens, path=path, title=f"{r.source} -> {r.text}")
            print(f"wrote {path}")
    return 0


def register(commands, train_commands) -> None:
    add_command(commands, "translate", "translate text with a trained run, and plot its alignment",
                TranslateCommand, translate)
