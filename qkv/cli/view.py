"""``qkv view`` (one page with every attention of a run's model) and ``qkv faithfulness``."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from .common import add_command, input_texts, numbered_paths, read_lines
from .options import options_from_args


@dataclass
class ViewCommand:
    run: str = option(positional=True, help="run directory or checkpoint directory of any application")
    text: list[str] = option(default_factory=list, positional=True, nargs="*",
                             help="inputs to look at (text applications); one page each")
    file: str | None = option(None, help="a file of inputs, one per line")
    image: list[str] | None = option(None, repeat=True, metavar="FILE",
                                     help="an image file (image applications; repeatable)")
    index: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="N",
                                     help="an image of the run's test split (repeatable)")
    question: str | None = option(None, help="the question (question-answering runs; the text is the context)")
    out: str = option("attention.html", help="the page to write (numbered NAME-0.html, NAME-1.html... for several)")
    rollout: bool = option(True, help="add attention rollout for stacks of self-attention")
    device: str = option("cpu", help="cpu, cuda, cuda:N or auto")


@dataclass
class FaithfulnessCommand:
    run: str = option(positional=True, help="run directory of `qkv train sentiment` (a classification run)")
    file: str | None = option(None, help="texts to test, one per line (default: the run's test split)")
    k: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="K",
                                 help="tokens removed (repeatable; default 1, 2 and 3)")
    draws: int = option(5, low=1, help="random removals averaged per text")
    seed: int = option(0, low=0, help="seed of the random removals")
    device: str = option("cpu", help="cpu, cuda, cuda:N or auto")


def view(args) -> int:
    from ..tasks.inspect import inspect_run
    from ..viz.page import save_attention_page

    o = options_from_args(args, ViewCommand)
    inputs: list[dict] = [{"image": path} for path in o.image or []] + [{"index": i} for i in o.index or []]
    if o.text or o.file or not inputs:
        inputs += [{"text": t} for t in input_texts(o.text, o.file, "a text to look at (or --image FILE)")]
    for path, given in zip(numbered_paths(o.out, len(inputs)), inputs, strict=True):
        page = inspect_run(o.run, question=o.question, device=o.device, **given)
        save_attention_page(path, page.records, rollout=o.rollout, **page.page_kwargs())
        print(f"wrote {path} ({len(page.records)} attention modules)")
    return 0


def faithfulness(args) -> int:
    from ..tasks.inspect import comprehensiveness
    from ..tasks.sentiment import SentimentClassifier, load_data, make_splits

    o = options_from_args(args, FaithfulnessCommand)
    clf = SentimentClassifier.load(o.run, o.device)
    if o.file:
        texts = read_lines(o.file)
    else:
        data = load_data(clf.options)
        texts = [data.texts[i] for i in make_splits(data.labels, clf.options)["test"]]
    print("k\tattention drop\trandom drop\tdifference\tattention wins\ttexts")
    for k in o.k or [1, 2, 3]:
        r = comprehensiveness(clf, texts, k=k, draws=o.draws, seed=o.seed)
        print(f"{k}\t{r['attention']:.4f}\t{r['random']:.4f}\t{r['difference']:+.4f}\t{r['wins']:.3f}\t{r['texts']}")
    return 0


def register(commands, train_commands) -> None:
    add_command(commands, "view", "write one offline HTML page showing every attention of a run's model",
                ViewCommand, view)
    add_command(commands, "faithfulness", "does a sentiment model's attention explain? remove the most attended "
                "words vs random ones (ERASER comprehensiveness)", FaithfulnessCommand, faithfulness)
