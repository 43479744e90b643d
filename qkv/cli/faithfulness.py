"""``qkv faithfulness``: does a sentiment model's attention explain its decisions?"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from .common import read_lines
from .options import options_from_args
from .predict import load
from .shared import DeviceOption, FileOption, RunArgument


@dataclass
class FaithfulnessCommand(DeviceOption, FileOption, RunArgument):
    k: list[int] | None = option(None, repeat=True, parse=lambda xs: [int(x) for x in xs], metavar="K",
                                 help="tokens removed (repeatable; default 1, 2 and 3)")
    draws: int = option(5, low=1, help="random removals averaged per text")
    seed: int = option(0, low=0, help="seed of the random removals")

    FLAG_HELP = {"run": "run directory of `qkv train sentiment` (a classification run)",
                 "file": "texts to test, one per line (default: the run's test split)"}


def faithfulness(args) -> int:
    from ..apps.sentiment import comprehensiveness, load_data, make_splits

    o = options_from_args(args, FaithfulnessCommand)
    given = read_lines(o.file) if o.file else None
    clf = load(o.run, o.device, "sentiment")
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



#: ``qkv NAME``: its name, its help, its options and what runs it (:func:`qkv.cli.build_parser` adds it)
COMMAND = ("faithfulness", "does a sentiment model's attention explain? remove the most attended "
            "words vs random ones (ERASER comprehensiveness)", FaithfulnessCommand, faithfulness)
