"""``--init LMRUN`` on data whose characters the language model's tokenizer lacks: a warning naming the run, the
share of ``<unk>`` training tokens and the characters, for both readers of an ``init`` run (``qkv train lm`` and
``qkv train sentiment --model lm``); data it covers gives none."""

from __future__ import annotations

import logging

import pytest

from qkv.apps.lm.coverage import uncovered
from qkv.cli import main
from qkv.data import UNK_ID
from tests.helpers import sentences, single_thread

GREEK = "αβγδ ειναι καλο"


def test_uncovered_counts_unknown_tokens_and_names_the_characters():
    from qkv.data import train_tokenizer

    tok = train_tokenizer("char", ["abc abc", "cab"])
    texts = ["abcé", "zz a"]
    ids = [tok.encode(t) for t in texts]
    unknown, total, lacking = uncovered(tok, ids, texts)
    assert (unknown, total) == (sum(x.count(UNK_ID) for x in ids), sum(map(len, ids))) and unknown == 3
    assert lacking == [("z", 2), ("é", 1)]
    assert uncovered(tok, [tok.encode("cab")], ["cab"]) == (0, 3, [])


def _reviews(path, greek: bool):
    rows = [(f"{t} {GREEK}" if greek else t, r) for t, r in sentences(200, seed=3)]
    path.write_text("id\tsentiment\ttext\n" + "".join(f"{i}\t{r:.3f}\t{t}\n" for i, (t, r) in enumerate(rows, 1)),
                    encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("app", ["lm", "sentiment"])
def test_init_from_a_language_model_that_lacks_the_datas_characters_warns(app, tiny_run, tmp_path, caplog):
    init = tiny_run("lm")  # trained on the filler reviews: no Greek
    for greek in (False, True):
        data = _reviews(tmp_path / f"reviews-{greek}.tsv", greek)
        if app == "lm":
            argv = ["train", "lm", "--data", str(data), "--column", "2", "--max-steps", "1", "--batch-size", "8",
                    "--eval-tokens", "100"]
        else:
            argv = ["train", "sentiment", "--data", str(data), "--model", "lm", "--max-steps", "1",
                    "--batch-size", "16"]
        caplog.clear()
        with single_thread(), caplog.at_level(logging.WARNING, logger="qkv.apps.lm.coverage"):
            assert main([*argv, "--init", str(init), "--eval-every", "0", "--no-progress",
                         "--out", str(tmp_path / f"{app}-{greek}")]) == 0
        said = [r.getMessage() for r in caplog.records if r.name == "qkv.apps.lm.coverage"]
        if not greek:
            assert said == []
            continue
        (message,) = said
        assert f"init {init}: its tokenizer does not cover the data" in message and "are <unk>" in message
        assert "'α'" in message
