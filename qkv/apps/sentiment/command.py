"""The sentiment application's commands: ``qkv classify`` (texts classified by a run, each word shaded by its
attention) and ``qkv faithfulness`` (does the attention explain the decisions?)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option
from ...train.rng import MAX_SEED
from ...viz.files import page_path
from ..command import DeviceOption, FileOption, RunArgument, RunInputs, finish, read_inputs
from ..console import read_lines, safe, use_color
from .predictor import SentimentClassifier


@dataclass
class ClassifyCommand(RunInputs):
    text: list[str] = option(default_factory=list, positional=True, nargs="*", help="texts to classify")
    html: str | None = option(None, metavar="HTML", help="write a page with every text's words shaded by attention")
    title: str = option("Attention over words", requires=("html",), help="title of the HTML page")
    color: str = option("auto", choices=("auto", "always", "never"),
                        help="ANSI colours (auto: when stdout is a terminal)")
    top: int = option(3, low=0, excludes={"color": ("always",)},
                      help="without colours, list this many most attended words")


def classify(o: ClassifyCommand) -> int:
    from ...viz.text import HighlightedText, highlight_ansi, save_html, top_tokens

    html = page_path(o.html, option="--html") if o.html else None  # settled first: printed == written
    texts = read_inputs(o.text, o.file, "texts to classify")
    classifier = SentimentClassifier.load(o.run, o.device)
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


@dataclass
class FaithfulnessCommand(DeviceOption, FileOption, RunArgument):
    k: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="K",
                                 help="tokens removed (repeatable; default 1, 2 and 3)")
    draws: int = option(5, low=1, help="random removals averaged per text")
    seed: int = option(0, low=0, high=MAX_SEED, help="seed of the random removals")

    FLAG_HELP = {"run": "run directory of `qkv train sentiment` (a classification run)",
                 "file": "texts to test, one per line (default: the run's test split)"}


def faithfulness(o: FaithfulnessCommand) -> int:
    from .faithfulness import comprehensiveness
    from .task import load_data, make_splits

    given = read_lines(o.file) if o.file else None
    clf = SentimentClassifier.load(o.run, o.device)
    if given is not None:
        texts = given
    else:
        data = load_data(clf.options)
        texts = [data.texts[i] for i in make_splits(data.labels, clf.options)["test"]]
    print("k\tattention drop\trandom drop\tdifference\tattention wins\ttexts")
    for k in o.k or [1, 2, 3]:
        r = comprehensiveness(clf, texts, k=k, draws=o.draws, seed=o.seed)
        print(f"{k}\t{r['attention']:.4f}\t{r['random']:.4f}\t{r['difference']:+.4f}\t{r['wins']:.3f}\t{r['texts']}")
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"classify": (ClassifyCommand, classify), "faithfulness": (FaithfulnessCommand, faithfulness)}
