"""What several test modules share (not tests themselves): a one-thread block, the planted-word review corpus, and
the tiny runs of every application that `conftest.tiny_run` trains once per session."""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Iterator
from pathlib import Path

import torch

FILLER = ["the", "movie", "plot", "actor", "scene", "story", "film", "script", "cast", "director", "music", "ending",
          "camera", "moment", "hour", "character", "dialogue", "year", "studio", "screen"]
#: flags of tiny sentiment models
SENTIMENT_COMMON = ["--embed-dim", "16", "--dropout", "0", "--embed-dropout", "0", "--no-progress", "--lr", "1e-2",
                    "--batch-size", "16", "--warmup-steps", "0"]
SENTIMENT_TINY = [*SENTIMENT_COMMON, "--hidden-dim", "32"]  # the RNN's output, both directions together
SENTIMENT_TINY_TRANSFORMER = [*SENTIMENT_COMMON, "--dim", "16", "--num-heads", "2", "--num-layers", "1"]


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Tiny models train fastest on one thread and do not fight the other test worker for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sentences(n: int, seed: int = 0) -> list[tuple[str, float]]:
    """Filler sentences where one planted word decides: 'wonderful' (positive) or 'awful' (negative)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        positive = i % 2 == 0
        words.insert(rng.randrange(len(words) + 1), "wonderful" if positive else "awful")
        rating = rng.uniform(0.5, 3.5) * (1 if positive else -1)
        out.append((" ".join(words).capitalize() + ".", rating))
    return out


def write_reviews(path: Path, n: int = 600) -> Path:
    """A movie-review file (``id<TAB>sentiment<TAB>text``) of :func:`sentences`."""
    lines = ["id\tsentiment\ttext"] + [f"{i}\t{r:.3f}\t{t}" for i, (t, r) in enumerate(sentences(n), 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


#: the tiny runs `tiny_run(name)` trains: a multi-layer attention model of each application, a few steps each
TINY_RUNS: dict[str, list[str]] = {
    "translate": ["train", "translate", "--data", "dates", "--model", "transformer", "--max-steps", "2", "--dim", "16",
                  "--num-heads", "2", "--num-layers", "2", "--n-train", "200", "--n-eval", "20", "--batch-size",
                  "16", "--no-progress"],
    "sentiment": ["train", "sentiment", "--data", "{reviews}", "--model", "transformer", "--epochs", "3",
                  *SENTIMENT_TINY_TRANSFORMER, "--num-layers", "2"],
    "images": ["train", "images", "--data", "digits", "--attn", "non_local", "--max-steps", "2", "--batch-size", "32",
               "--no-progress"],
    "caption": ["train", "caption", "--model", "transformer", "--n-train", "32", "--n-valid", "8", "--n-test", "8",
                "--dim", "8", "--num-heads", "2", "--num-layers", "2", "--widths", "4,4,4,8", "--batch-size", "16",
                "--eval-max", "4", "--max-steps", "2", "--no-progress"],
    "qa": ["train", "qa", "--data", "facts", "--model", "bidaf", "--n-train", "200", "--n-eval", "20", "--embed-dim",
           "8", "--hidden-dim", "8", "--max-steps", "2", "--no-progress"],
    "segment": ["train", "segment", "--n-train", "32", "--n-valid", "8", "--n-test", "8", "--widths", "4,8,8,16",
                "--blocks", "1,1,1,1", "--spatial-widths", "4,4,8", "--dim", "8", "--head-dim", "8", "--batch-size",
                "16", "--max-steps", "2", "--no-progress"],
    "summarize": ["train", "summarize", "--data", "facts", "--lang", "en", "--n-train", "200", "--n-eval", "10",
                  "--embed-dim", "8", "--hidden-dim", "16", "--batch-size", "16", "--max-steps", "2",
                  "--eval-max", "5", "--max-decode-len", "6", "--no-progress"],
    "speech": ["train", "speech", "--data", "digits", "--n-train", "16", "--n-valid", "3", "--n-test", "3", "--n-long",
               "2", "--hidden-dim", "8", "--num-layers", "3", "--embed-dim", "8", "--decoder-dim", "16", "--attn-dim",
               "8", "--n-mels", "16", "--ctc-weight", "0.3", "--max-steps", "2", "--batch-size", "8", "--eval-max",
               "3", "--max-decode-len", "12", "--no-progress", "--cache", "{root}/speech-cache"],
    "lm": ["train", "lm", "--data", "{reviews}", "--column", "2", "--context", "64", "--dim", "16", "--num-heads", "2",
           "--num-layers", "2", "--max-steps", "2", "--batch-size", "8", "--eval-tokens", "200", "--no-progress"],
}


def train_tiny(name: str, root: Path) -> Path:
    """Train the tiny run ``name`` of :data:`TINY_RUNS` under ``root`` (on one thread, its output swallowed)."""
    from qkv.cli import main

    reviews = root / "reviews.tsv"
    if not reviews.exists():
        write_reviews(reviews, n=300)
    out = root / name
    argv = [a.format(reviews=reviews, root=root) for a in TINY_RUNS[name]] + ["--out", str(out)]
    with single_thread(), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert code == 0, f"training the tiny {name} run failed: qkv {' '.join(argv)}"
    return out
