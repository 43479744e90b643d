"""``qkv classify``: texts classified by a sentiment run, each word shaded by its attention (:mod:`.predict`'s
way)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from ..viz.files import page_path
from .common import safe, use_color
from .options import options_from_args
from .predict import finish, load, read_inputs
from .shared import DeviceOption, FileOption, JsonOption, RunArgument


@dataclass
class ClassifyCommand(JsonOption, DeviceOption, FileOption, RunArgument):
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="texts to classify")
    html: str | None = option(None, metavar="HTML", help="write a page with every text's words shaded by attention")
    title: str = option("Attention over words", requires=("html",), help="title of the HTML page")
    color: str = option("auto", choices=("auto", "always", "never"),
                        help="ANSI colours (auto: when stdout is a terminal)")
    top: int = option(3, low=0, excludes={"color": ("always",)},
                      help="without colours, list this many most attended words")


def classify(args) -> int:
    from ..viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    o = options_from_args(args, ClassifyCommand)
    html = page_path(o.html, option="--html") if o.html else None  # settled first: printed == written
    texts = read_inputs(o.text, o.file, "texts to classify")
    classifier = load(o.run, o.device, "sentiment")
    predictions = classifier.predict(texts)
    color = use_color(o.color)
    for p in predictions:
        line = f"{p.caption}\t{highlight_ansi([safe(t) for t in p.tokens], p.weights, color=color)}"
        if not color and o.top:
            line += "\t[" + ", ".join(f"{safe(t)} {w:.2f}" for t, w in top_tokens(p.tokens, p.weights, o.top)) + "]"
        print(line)
    if html:
        items = [HighlightedText(p.tokens, p.weights, caption=p.caption,
                                 details=[(k, f"{v:.3f}") for k, v in p.probabilities.items()] +
                                 ([("cut", f"{p.cut} tokens past the model's max_len were not read")] if p.cut
                                  else [])) for p in predictions]
        print(f"wrote {save_html(html, items, title=o.title)}")
    finish(classifier, texts, predictions, o.json)
    return 0



#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("classify", "classify text with a trained sentiment run, showing its attention",
            ClassifyCommand, classify)
