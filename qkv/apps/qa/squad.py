"""Readers of question-answering files: SQuAD v1.1 JSON and ``context<TAB>question<TAB>answer`` TSV.

SQuAD v1.1 (Rajpurkar et al., 2016, https://arxiv.org/abs/1606.05250) is
``{"data": [{"title": ..., "paragraphs": [{"context": ..., "qas": [{"id", "question", "answers": [{"text",
"answer_start"}]}]}]}]}``; the first answer gives the span, every answer counts for the metrics. In the TSV format
the answer's first occurrence in the context is the span (more answers may follow in further columns).

An answer that is not a span of its context (wrong ``answer_start``, text absent) is a ``ValueError`` naming the
file and the place (``file:line`` for TSV, ``file: data[i].paragraphs[j].qas[k]`` for JSON), or, with
``on_error="skip"``, skipped and counted in :attr:`ReadResult.skipped`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...data.facts import QAExample
from ...data.files import binary_lines, text_lines
from ...options import OptionError, ref

logger = logging.getLogger(__name__)

__all__ = ["read_squad", "read_qa_tsv", "read_qa_file", "ReadResult"]


@dataclass
class ReadResult:
    """The examples read and the bad ones skipped (``skipped``: how many, ``problems``: the first few messages)."""

    examples: list[QAExample]
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


class _Collector:
    def __init__(self, on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error, self.result = on_error, ReadResult([])

    def bad(self, message: str) -> None:
        if self.on_error == "raise":
            raise OptionError("{message} (or skip such questions with " + ref("on_error") + " skip)", "on_error",
                              message=message)
        self.result.skipped += 1
        if len(self.result.problems) < 5:
            self.result.problems.append(message)


def _json_error(path: Path, e: json.JSONDecodeError) -> ValueError:
    return ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})")


def read_squad(path: str | os.PathLike, *, on_error: str = "raise") -> ReadResult:
    """The questions of a SQuAD v1.1 JSON file (``.gz`` allowed)."""
    path = Path(path)
    raw = b"".join(line for _, line in binary_lines(path))
    try:
        doc = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise _json_error(path, e) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file: expected {{\"data\": [...]}} at the top")
    out = _Collector(on_error)
    for i, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise ValueError(f"{path}: data[{i}] has no 'paragraphs' list")
        for j, para in enumerate(paragraphs):
            where_p = f"{path}: data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or \
                    not isinstance(para.get("qas"), list):
                raise ValueError(f"{where_p} needs a 'context' string and a 'qas' list")
            context = para["context"]
            for k, qa in enumerate(para["qas"]):
                where = f"{where_p}.qas[{k}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or \
                        not isinstance(qa.get("answers"), list):
                    raise ValueError(f"{where} needs a 'question' string and an 'answers' list")
                answers = qa["answers"]
                if not answers:
                    out.bad(f"{where}: no answers (SQuAD v2's unanswerable questions are not supported)")
                    continue
                texts = []
                for a in answers:
                    if not isinstance(a, dict) or not isinstance(a.get("text"), str) or \
                            not isinstance(a.get("answer_start"), int) or isinstance(a.get("answer_start"), bool):
                        raise ValueError(f"{where}: every answer needs 'text' (a string) and 'answer_start' "
                                         f"(an integer), got {a!r}")
                    texts.append(a["text"])
                first = answers[0]
                start, text = first["answer_start"], first["text"]
                if not text.strip() or not qa["question"].strip():
                    out.bad(f"{where}: empty question or answer")
                    continue
                if context[start:start + len(text)] != text:
                    out.bad(f"{where}: the answer {text!r} is not at character {start} of the context "
                            f"(found {context[start:start + len(text)]!r})")
                    continue
                out.result.examples.append(QAExample(context, qa["question"], texts, start, start + len(text),
                                                     where=where))
    return _done(out, path)


def read_qa_tsv(path: str | os.PathLike, *, on_error: str = "raise") -> ReadResult:
    """The rows ``context<TAB>question<TAB>answer[<TAB>answer...]`` of a UTF-8 file (``.gz`` allowed); a first
    row ``context<TAB>question<TAB>answer`` is taken as a header. The span is the first occurrence of the
    first answer; every answer must occur in the context."""
    path = Path(path)
    out = _Collector(on_error)
    for n, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        cols = line.split("\t")
        if n == 1 and [c.strip().lower() for c in cols[:3]] == ["context", "question", "answer"]:
            continue
        where = f"{path}:{n}"
        if len(cols) < 3:
            out.bad(f"{where}: expected context<TAB>question<TAB>answer, found {len(cols)} column(s)")
            continue
        context, question, answers = cols[0], cols[1].strip(), [a.strip() for a in cols[2:] if a.strip()]
        if not context.strip() or not question or not answers:
            out.bad(f"{where}: empty context, question or answer")
            continue
        missing = [a for a in answers if a not in context]
        if missing:
            out.bad(f"{where}: the answer {missing[0]!r} is not a span of the context")
            continue
        start = context.index(answers[0])
        out.result.examples.append(QAExample(context, question, answers, start, start + len(answers[0]), where=where))
    return _done(out, path)


def _done(out: _Collector, path: Path) -> ReadResult:
    r = out.result
    if r.skipped:
        logger.warning("%s: skipped %d bad question(s), e.g. %s", path, r.skipped, r.problems[0])
    if not r.examples:
        raise ValueError(f"{path}: no usable questions" + (f" ({r.skipped} skipped, e.g. {r.problems[0]})"
                                                           if r.skipped else ""))
    return r


def read_qa_file(path: str | os.PathLike, *, on_error: str = "raise") -> ReadResult:
    """:func:`read_squad` for ``.json``/``.json.gz`` files, :func:`read_qa_tsv` for anything else."""
    name = str(path).lower()
    if name.endswith((".json", ".json.gz")):
        return read_squad(path, on_error=on_error)
    return read_qa_tsv(path, on_error=on_error)
