"""``qkv generate RUN PROMPT...``: a language-model run (``qkv train lm``) continues prompts, sampled with a seed
(temperature, top-k, top-p) or greedily (``--strategy greedy``; :mod:`.predict`'s way)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option
from ...train.rng import MAX_SEED
from ..command import RunInputs, finish, read_inputs
from ..console import safe
from .predictor import LanguageModel

_SAMPLING = {"strategy": ("sample",)}


@dataclass
class GenerateCommand(RunInputs):
    prompts: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="PROMPT",
                                help="texts to continue (each starts a document)")
    max_new_tokens: int = option(200, low=1, help="the most tokens written after each prompt")
    strategy: str = option("sample", choices=("sample", "greedy"), help="sample each token (with --temperature, "
                           "--top-k, --top-p, --seed), or take the most likely one")
    temperature: float = option(1.0, low=0, low_open=True, applies=_SAMPLING,
                                help="sampling: divide the logits by this (below 1: safer, above: more varied)")
    top_k: int | None = option(None, low=1, applies=_SAMPLING, help="sampling: only the k most likely tokens")
    top_p: float | None = option(None, low=0, low_open=True, high=1, applies=_SAMPLING,
                                 help="sampling: only the most likely tokens whose probability reaches p (nucleus)")
    seed: int = option(0, low=0, high=MAX_SEED, applies=_SAMPLING, help="sampling: the same seed writes the same text")

    FLAG_HELP = {"run": "a run directory of qkv train lm",
                 "json": "write one row per prompt as JSON: the prompt, its continuation, log-probability and why "
                         "it stopped"}


def generate(o: GenerateCommand) -> int:
    prompts = read_inputs(o.prompts, o.file, "prompts to continue")
    lm = LanguageModel.load(o.run, o.device)
    results = lm.predict(prompts, max_new_tokens=o.max_new_tokens, greedy=o.strategy == "greedy",
                         temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, seed=o.seed)
    for r in results:  # a continuation stopped by a full context is logged by the library
        print(f"{safe(r.prompt)}\t{safe(r.text)}")
    finish(lm, prompts, results, o.json)
    return 0


#: the application's own commands: name -> (options, run); their help is in ``about.json``
COMMANDS = {"generate": (GenerateCommand, generate)}
