"""``qkv faithfulness``: does a sentiment model's attention explain its decisions?"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from .common import add_command, read_lines
from .options import options_from_args


@dataclass
class FaithfulnessCommand:
    run: str = option(positional=True, help="run directory of `qkv train sentiment` (a classification run)")
    file: str | None = option(None, help="texts to test, one per line (default: the run's test split)")
    k: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="K",
                                 help="tokens removed (repeatable; default 1, 2 and 3)")
    draws: int = option(5, low=1, help="random removals averaged per text")
    seed: int = option(0, low=0, help="seed of the random removals")
    device: str = option("auto", help="auto (CUDA if available), cpu, cuda or cuda:N")


def faithfulness(args) -> int:
    from ..tasks.sentiment import SentimentClassifier, comprehensiveness, load_data, make_splits

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
    add_command(commands, "faithfulness", "does a sentiment model's attention explain? remove the most attended "
                "words vs random ones (ERASER comprehensiveness)", FaithfulnessCommand, faithfulness)
