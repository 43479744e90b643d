"""BENCHMARKS.md is made from benchmarks/results/ (benchmarks/render.py), and the figures the pages state are the
results files' figures."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from tests import ROOT


def _load(name):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = _load("render")
record = _load("record")


def _results():
    return {s["name"]: {m["key"]: m for m in s["measurements"]} for s in render.load()}


def test_benchmarks_md_is_what_the_results_render():
    assert (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") == render.render(render.load()), (
        "BENCHMARKS.md differs from benchmarks/results: run python benchmarks/render.py")


FORBIDDEN = re.compile(r"\bsessions?\b|\bagents?\b|\bhelpers?\b|\bscratch\b|\bcommit [0-9a-f]{6,40}\b", re.I)


def test_benchmarks_md_is_short_and_speaks_of_qkv_as_it_is():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 600
    files = [ROOT / "BENCHMARKS.md", *sorted((ROOT / "benchmarks" / "results").glob("*.json"))]
    found = [f"{path.name}:{i}: {line.strip()[:100]}" for path in files
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if FORBIDDEN.search(line)]
    assert not found, "\n".join(found)


def test_the_forbidden_words_check_sees_what_it_is_for():
    for text in ("two other agents' jobs", "in a scratch checkout", "added (commit 9b1aaef)", "this session's run"):
        assert FORBIDDEN.search(text), text
    for text in ("a committed file", "helpful", "the agency"):
        assert FORBIDDEN.search(text) is None, text


def test_every_measurement_says_what_the_table_needs():
    for section in render.load():
        assert section["title"] and section["measurements"], section["name"]
        for m in section["measurements"]:
            where = f"{section['name']}/{m['key']}"
            assert set(m) == set(record.FIELDS), where
            assert m["what"] and m["figure"] not in (None, "") and m["command"] and m["machine"], where
            assert re.fullmatch(r"\d{4}-\d\d-\d\d", m["date"]), where
            assert m["met"] in (True, False, None), where
            assert (m["met"] is None) == (not m["target"]), where
            assert bool(m["why"]) == (m["met"] is False), f"{where}: a reason exactly where a target is not met"


# The figures the documentation states, with the results file they come from: (page, section, key). The page must
# hold the results file's figure as it is written there.
FIGURES = [
    ("docs/inside/capture.md", "inside", "capture"),
    ("docs/inside/capture.md", "inside", "page-size"),
    ("docs/inside/huggingface.md", "huggingface", "bert-2048-attn"),
    ("docs/inside/huggingface.md", "huggingface", "llama-2048-attn"),
    ("docs/inside/huggingface.md", "huggingface", "bert-512"),
    ("docs/inside/huggingface.md", "huggingface", "llama-2048"),
    ("docs/apps/translate.md", "translate", "tatoeba-5"),
    ("docs/apps/translate.md", "translate", "tatoeba-5-beam"),
    ("docs/apps/translate.md", "translate", "tatoeba-30"),
    ("docs/apps/translate.md", "translate", "tatoeba-30-beam"),
    ("docs/apps/translate.md", "training", "threads-steps"),
    ("docs/apps/translate.md", "training", "busy-translate"),
    ("docs/apps/caption.md", "training", "busy-caption"),
    ("docs/apps/caption.md", "caption", "exact"),
    ("docs/apps/caption.md", "caption", "grounding"),
    ("docs/apps/caption.md", "caption", "grounding-without"),
    ("docs/apps/caption.md", "caption", "fixed"),
    ("docs/apps/caption.md", "caption", "transformer"),
    ("docs/apps/caption.md", "caption", "hard"),
    ("docs/apps/images.md", "images", "none"),
    ("docs/apps/images.md", "images", "se"),
    ("docs/apps/segment.md", "segment", "bisenet"),
    ("docs/apps/segment.md", "segment", "bisenet-heldout"),
    ("docs/apps/segment.md", "segment", "arm"),
    ("docs/apps/segment.md", "segment", "ffm"),
    ("docs/apps/segment.md", "segment", "context-only"),
    ("docs/apps/segment.md", "segment", "fcn"),
    ("docs/apps/segment.md", "segment", "latency"),
    ("docs/apps/sentiment.md", "sentiment", "bigram"),
    ("docs/apps/sentiment.md", "sentiment", "nbsvm"),
    ("docs/apps/sentiment.md", "sentiment", "bigram-nbsvm"),
    ("docs/apps/sentiment.md", "sentiment", "bigru"),
    ("docs/apps/sentiment.md", "sentiment", "lm-forward"),
    ("docs/apps/sentiment.md", "sentiment", "lm-two"),
    ("docs/apps/sentiment.md", "sentiment", "lm-four"),
    ("docs/apps/qa.md", "qa", "entities-en"),
    ("docs/apps/qa.md", "qa", "entities-zh"),
    ("docs/apps/qa.md", "qa", "phrasings-en"),
    ("docs/apps/qa.md", "qa", "phrasings-zh"),
    ("docs/apps/qa.md", "qa", "handwritten-en"),
    ("docs/apps/summarize.md", "summarize", "pc"),
    ("docs/apps/summarize.md", "summarize", "lead"),
    ("docs/apps/summarize.md", "summarize", "pc-vs-seq2seq"),
    ("docs/apps/summarize.md", "summarize", "repeats"),
    ("docs/apps/summarize.md", "summarize", "transformer-copy"),
    ("docs/apps/summarize.md", "summarize", "facts"),
    ("docs/apps/speech.md", "speech", "sentences-long"),
    ("docs/apps/speech.md", "speech", "digits-long"),
    ("docs/apps/speech.md", "speech", "pocketsphinx"),
    ("docs/apps/speech.md", "speech", "digits-best"),
    ("docs/apps/speech.md", "speech", "digits-seeds"),
    ("docs/apps/speech.md", "speech", "digits-guided"),
    ("docs/apps/speech.md", "speech", "sentences-wer"),
    ("docs/apps/speech.md", "speech", "sentences-cer"),
    ("docs/apps/speech.md", "speech", "sentences-defaults"),
    ("docs/apps/speech.md", "speech", "sentences-voices"),
    ("docs/apps/speech.md", "speech", "sentences-ctc"),
    ("docs/concepts/layers.md", "mods", "alibi-1024"),
    ("docs/concepts/layers.md", "mods", "alibi-4096"),
    ("docs/concepts/layers.md", "mods", "t5"),
    ("docs/concepts/layers.md", "mods", "softcap"),
    ("docs/concepts/layers.md", "mods", "window-1024"),
    ("docs/concepts/layers.md", "mods", "window-4096"),
    ("docs/concepts/layers.md", "mods", "documents"),
    ("docs/concepts/layers.md", "mods", "prefix"),
    ("docs/concepts/layers.md", "attention", "weights"),
    ("docs/concepts/layers.md", "attention", "weights-kept"),
    ("docs/performance-guide.md", "compile", "additive-training"),
    ("docs/inside/huggingface.md", "huggingface", "bert-2048-attn"),
    ("docs/inside/huggingface.md", "huggingface", "llama-2048-attn"),
    ("README.md", "lm", "bpc-5-w96-l3-c64"),
    ("docs/apps/lm.md", "lm", "bpc-5-w96-l3-c64"),
    ("docs/apps/lm.md", "lm", "bpc-5-w128-l4-c128"),
    ("README.md", "lm", "bpc-30-w128-l4-c128"),
]


def _words(text):
    return " ".join(text.replace("*", "").split())  # line breaks and emphasis aside


@pytest.mark.parametrize("page,section,key", FIGURES, ids=[f"{p}:{k}" for p, _, k in FIGURES])
def test_a_figure_the_docs_state_is_the_results_files(page, section, key):
    results = _results()
    assert key in results[section], f"{section}/{key} is not in benchmarks/results/{section}.json"
    figure = results[section][key]["figure"]
    assert _words(figure) in _words((ROOT / page).read_text(encoding="utf-8")), (
        f"{page} does not state {section}/{key} as benchmarks/results/{section}.json has it: {figure!r}")


def test_the_performance_page_includes_the_body_under_its_own_title():
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert '--8<-- "BENCHMARKS.md:body"' in page and page.count("\n# ") == 0 and page.startswith("# ")
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    body = text[text.index("[start:body]"):text.index("[end:body]")]
    assert "\n## " in body and "\n# " not in body  # one title on the page, the sections under it


def test_record_updates_a_results_file_by_key(tmp_path):
    m = record.measurement
    path = record.record("demo", [m("a", "first", 1.02, "speed", target=">= 0.95x"),
                                  m("b", "second", 2.5, "time", target="<= 1.5x", why="the page faults")],
                         command="python benchmarks/demo.py", threads=1, results=tmp_path)
    data = json.loads(path.read_text())
    a, b = data["measurements"]
    assert (a["figure"], a["met"], a["why"], b["met"], b["why"]) == ("1.02", True, None, False, "the page faults")
    assert a["command"] == "python benchmarks/demo.py" and a["threads"] == 1 and re.match(r"\d{4}-", a["date"])
    record.record("demo", [m("b", None, 1.4, "time", figure="1.40x")], command="python benchmarks/demo.py",
                  threads=2, results=tmp_path)  # the target and the description stay those of the file
    b = json.loads(path.read_text())["measurements"][1]
    assert (b["what"], b["figure"], b["target"], b["met"], b["why"], b["threads"]) == (
        "second", "1.40x", "<= 1.5x", True, None, 2)
    assert record.is_met(0.9, ">= 0.95x") is False and record.is_met(3, "< 5%") and record.is_met(1, "a few") is None


def test_a_record_into_the_projects_results_writes_benchmarks_md_again(tmp_path, monkeypatch):
    own, trial = tmp_path / "results", tmp_path / "trial"
    monkeypatch.setattr(record, "ROOT", tmp_path)
    monkeypatch.setattr(record, "DEFAULT_RESULTS", own)
    record.record("demo", [record.measurement("a", "a trial figure", 7.5)], command="x", threads=1, results=trial)
    assert not (tmp_path / "BENCHMARKS.md").exists()  # a trial run leaves the report alone
    record.record("demo", [record.measurement("a", "the figure of a run", 1.25, "x", target=">= 1x")],
                  command="x", threads=1, results=own)
    text = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert text == render.render(render.load(own)) and "| the figure of a run | 1.25 x | >= 1x | yes |" in text

