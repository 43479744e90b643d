"""``qkv translate``: text translated by a translation run, with its alignment pictures (:mod:`.predict`'s way)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option
from ..command import LMFusionOption, PlotOption, RunInputs, finish, plot_file, read_inputs, settings_of, write_outputs
from ..console import numbered_paths, safe
from .options import TranslateSettings
from .predictor import Translator


@dataclass
class TranslateCommand(TranslateSettings, LMFusionOption, PlotOption, RunInputs):
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="sentences to translate")
    output: str | None = option(None, help="write the translations here, one per line")

    FLAG_HELP = {"max_len": "longest translation, in tokens (default: 100)",
                 "plot": "alignment heatmap PNG/SVG (numbered per sentence when several)",
                 "file": "a file of sentences, one per line (a blank line is an error: outputs line up with lines)",
                 "lm": "a language-model run (qkv train lm) of the target language, its tokens the translator's "
                       "target tokenizer's kind, fused into the beam (shallow fusion)"}


def translate(o: TranslateCommand) -> int:
    from ...viz.plots import alignment

    plot = plot_file(o.plot) if o.plot else None  # settled first: printed == written
    texts = read_inputs(o.text, o.file, "sentences to translate")
    translator = Translator.load(o.run, o.device)
    settings = settings_of(o, translator, **o.fusion(translator))
    results = translator.predict(texts, **settings)
    if o.output:
        write_outputs(o.output, [r.text for r in results], "translations")
    else:
        for r in results:
            print(f"{safe(r.source)}\t{safe(r.text)}")
    if plot:
        for r, path in zip(results, numbered_paths(str(plot), len(results)), strict=True):
            alignment(r.attention, r.source_tokens, r.tokens, path=path, title=f"{r.source} -> {r.text}")
            print(f"wrote {path}")
    finish(translator, texts, results, o.json, **settings)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"translate": (TranslateCommand, translate)}
