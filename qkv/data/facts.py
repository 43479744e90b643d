"""Generated fact passages with questions, in English and Chinese, for question answering (deterministic).

A passage states one to four facts, each about a different *thing* (an invention, a theory, an equation, a
building, a discovery, a written work), who brought it out (a person), when (a year), where (a city) and sometimes
at which organisation; some facts leave out the person or the place, and some hold numbers that are not years (an
age, a count) beside the year. Questions ask who / when / where / what, each in nine to eleven phrasings; the answer
is a span of the passage (character offsets).

So that a reader learns what a question asks rather than the generator's wording, the facts vary what real text
varies: each kind of thing has its own verbs (invented, patented, completed, opened, isolated, wrote...; 发明, 建成,
分离出, 出版...) used in the passage and the question alike, names are one to three words (double-barrelled
surnames, Chinese transliterations with "-" or 夫人, places with or without 城/港...), and a thing may be a bare name
("Curie discovered polonium") as well as "the Kavo engine". ``tests/fixtures/qa/handwritten-*.tsv`` holds real
single-sentence facts outside these templates that ``benchmarks/qa.py`` scores a trained reader on.

Memorising cannot pass: the entities of the valid and test splits (people, things, cities, organisations and years)
never occur in the training split -- for English every name *word* of the held-out entities is absent from the
training passages, so a word vocabulary sees them as unknown and the reader has to point at them by reading; for
Chinese the held-out names are new combinations of known characters. Some phrasings of every question kind are held
out too: the ``test_phrasings`` split asks about held-out entities with phrasings never seen in training. ``both``
mixes the two languages half and half in every split (each with its own held-out entities and phrasings), for one
model that reads English and Chinese.

Example::

    data = fact_corpus("zh", n_train=2000, n_eval=200, seed=0)
    ex = data.train[0]
    ex.context[ex.answer_start:ex.answer_end] == ex.answers[0]        # True
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field

from .corpus import Splits
from .fact_templates import (  # noqa: F401 - the tables, also imported from here by tests
    _EN_CREWS,
    _EN_FACTS,
    _EN_INTRANSITIVE,
    _EN_ORGS,
    _EN_QUESTIONS,
    _EN_SYLLABLES,
    _EN_THINGS,
    _ZH_CITY_SUFFIX,
    _ZH_CREWS,
    _ZH_FACTS,
    _ZH_GIVEN,
    _ZH_ORGS,
    _ZH_QUESTIONS,
    _ZH_SURNAMES,
    _ZH_THING_CHARS,
    _ZH_THINGS,
    _ZH_TRANSLIT,
    HELD_OUT_PHRASINGS,
)

__all__ = ["QAExample", "QACorpus", "fact_corpus", "SPLITS", "LANGS", "QUESTION_KINDS", "entity_names"]

SPLITS = ("train", "valid", "test", "test_phrasings")
LANGS = ("en", "zh", "both")
QUESTION_KINDS = ("who", "when", "where", "what")


@dataclass
class QAExample:
    """One question about a context: ``answers`` (the first is the span's text) and its character offsets
    ``answer_start:answer_end`` in ``context``; ``kind`` (who/when/where/what, or "" for read files)."""

    context: str
    question: str
    answers: list[str]
    answer_start: int
    answer_end: int
    kind: str = ""
    where: str = ""  # file:line (or file:paragraph) of a read example, for error messages

    def __post_init__(self):
        if self.context[self.answer_start:self.answer_end] != self.answers[0]:
            raise ValueError(f"{self.where or 'example'}: the answer {self.answers[0]!r} is not "
                             f"context[{self.answer_start}:{self.answer_end}]")


@dataclass
class QACorpus(Splits[QAExample]):
    """Examples by split name (``train``, ``valid``, ``test`` and, for generated facts, ``test_phrasings``), and
    their ``language``: ``en``, ``zh`` or ``both`` (mixed)."""

    splits: dict[str, list[QAExample]] = field(default_factory=dict)
    language: str = "en"


# ------------------------------------------------------------------------------------------------ entities



def _en_words(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct capitalised name words of two or three syllables."""
    words: set[str] = set()
    while len(words) < n:
        k = rng.choice((2, 2, 3))
        words.add("".join(rng.choice(_EN_SYLLABLES) for _ in range(k)).capitalize())
    return sorted(words)


@dataclass
class _Entities:
    people: list[str]
    things: list[tuple[str, str]]  # (name, kind)
    places: list[str]
    orgs: list[str]
    years: list[int]


def _en_entities(rng: random.Random, words: list[str], years: list[int], n: int) -> _Entities:
    def pick(k):
        return rng.sample(words, k)

    def person():  # one to three name words, sometimes a double-barrelled surname (Berners-Lee)
        k = rng.choice((1, 2, 2, 2, 2, 3, 3))
        name = pick(k)
        if k >= 2 and rng.random() < 0.15:
            name[-1] = f"{name[-1]}-{pick(1)[0]}"
        return " ".join(name)

    def thing(kind):  # Kavo engine, Kavo Tel bridge, or a bare name (polonium, Principia)
        r = rng.random()
        if r < 0.2:
            return pick(1)[0]
        return " ".join(pick(2 if r > 0.85 else 1) + [rng.choice(_EN_THINGS[kind][0])])

    people = sorted({person() for _ in range(n)})
    things = sorted({(thing(k), k) for k in _EN_THINGS for _ in range(n // 3)})
    places = sorted({" ".join(pick(2 if rng.random() < 0.2 else 1)) for _ in range(n // 2)})
    orgs = sorted({f"{pick(1)[0]} {rng.choice(_EN_ORGS)}" for _ in range(n // 3)})
    return _Entities(people, things, places, orgs, years)


def _zh_entities(rng: random.Random, years: list[int], n: int) -> _Entities:
    def chars(pool, lo, hi):
        return "".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))

    def translit():  # 阿巴卡, 伯纳斯-李, 居里夫人
        r = rng.random()
        if r < 0.15:
            return chars(_ZH_TRANSLIT, 2, 3) + "-" + chars(_ZH_TRANSLIT, 1, 2)
        return chars(_ZH_TRANSLIT, 2, 4) + ("夫人" if r > 0.93 else "")

    def thing(kind):  # 质能方程, 埃菲尔铁塔
        pool = _ZH_THING_CHARS if rng.random() < 0.6 else _ZH_TRANSLIT
        return chars(pool, 2, 3 if pool is _ZH_TRANSLIT else 2) + rng.choice(_ZH_THINGS[kind][0])

    people = {rng.choice(_ZH_SURNAMES) + chars(_ZH_GIVEN, 1, 2) for _ in range(n // 2)}
    people |= {translit() for _ in range(n // 2)}
    things = {(thing(k), k) for k in _ZH_THINGS for _ in range(n // 3)}
    places = {chars(_ZH_TRANSLIT, 2, 3) + (rng.choice(_ZH_CITY_SUFFIX) if rng.random() < 0.5 else "")
              for _ in range(n // 2)}
    orgs = {chars(_ZH_TRANSLIT, 2, 2) + rng.choice(_ZH_ORGS) for _ in range(n // 3)}
    return _Entities(sorted(people), sorted(things), sorted(places), sorted(orgs), years)


def _held_out_split(lang: str, seed: int, n: int) -> tuple[_Entities, _Entities]:
    """Training and held-out entities, disjoint (for English, disjoint name words too)."""
    rng = random.Random(f"facts-entities-{lang}-{seed}")
    years = list(range(1600, 2021))
    rng.shuffle(years)
    cut = len(years) * 4 // 5
    train_years, test_years = sorted(years[:cut]), sorted(years[cut:])
    if lang == "en":
        words = _en_words(rng, 1200)
        rng.shuffle(words)
        k = len(words) * 3 // 4
        return (_en_entities(rng, words[:k], train_years, n), _en_entities(rng, words[k:], test_years, n // 3))
    train = _zh_entities(rng, train_years, n)
    test = _zh_entities(rng, test_years, n // 3)
    seen = set(train.people) | {t for t, _ in train.things} | set(train.places) | set(train.orgs)
    # drop held-out names that are training names or contain one (a shorter name inside a longer one)
    def fresh(name):
        return name not in seen and not any(s in name or name in s for s in seen if len(s) >= 2)

    test = _Entities([p for p in test.people if fresh(p)], [t for t in test.things if fresh(t[0])],
                     [p for p in test.places if fresh(p)], [o for o in test.orgs if fresh(o)], test.years)
    return train, test


def entity_names(lang: str, seed: int = 0, n: int = 600) -> dict[str, set[str]]:
    """``{"train", "held_out"}``: the names (people, things, places, organisations) of each side."""
    if lang == "both":
        en, zh = entity_names("en", seed, n), entity_names("zh", seed, n)
        return {side: en[side] | zh[side] for side in en}
    out = {}
    for side, e in zip(("train", "held_out"), _held_out_split(lang, seed, n), strict=True):
        out[side] = set(e.people) | {t for t, _ in e.things} | set(e.places) | set(e.orgs)
    return out




_ENTITY_SLOTS = frozenset(("thing", "person", "year", "place", "org"))


@functools.cache
def _slots(template: str) -> frozenset[str]:
    return frozenset(re.findall(r"\{(\w+)\}", template))


def _render(template: str, slots: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The text of ``template`` with ``slots`` filled, and each answer slot's character span."""
    out, spans, i = [], {}, 0
    pos = 0
    while True:
        j = template.find("{", i)
        if j < 0:
            out.append(template[i:])
            break
        k = template.index("}", j)
        out.append(template[i:j])
        pos += len(template[i:j])
        name = template[j + 1:k]
        value = slots[name]
        spans.setdefault(name, (pos, pos + len(value)))
        out.append(value)
        pos += len(value)
        i = k + 1
    text = "".join(out)
    if text[:1].islower():
        text = text[0].upper() + text[1:]
    return text, spans


def _passage(rng: random.Random, lang: str, ents: _Entities, n_facts: int):
    """A passage's text and, per fact, its slots and their absolute character spans."""
    facts_t = _ZH_FACTS if lang == "zh" else _EN_FACTS
    things = rng.sample(ents.things, n_facts)
    people = rng.sample(ents.people, n_facts)
    years = rng.sample(ents.years, n_facts)
    places = rng.sample(ents.places, n_facts)
    sep = "" if lang == "zh" else " "
    parts, facts, offset = [], [], 0
    for f in range(n_facts):
        name, kind = things[f]
        slots = {"thing": name, "person": people[f], "year": str(years[f]), "place": places[f],
                 "org": rng.choice(ents.orgs), "age": str(rng.randint(20, 80)), "count": str(rng.randint(3, 400))}
        if lang == "en":
            nouns, verbs = _EN_THINGS[kind]
            slots["verb"], slots["pp"], slots["base"] = rng.choice(verbs)
            slots["intr"] = rng.choice(_EN_INTRANSITIVE.get(kind, ("appear", "come about")))
            bare = " " not in name
            slots["the"], slots["The"] = ("", "") if bare else ("the ", "The ")
            slots["noun"] = rng.choice(nouns) if bare else name.split()[-1]
        else:
            slots["verb"] = rng.choice(_ZH_THINGS[kind][1])
        template = rng.choice(facts_t)
        if "{crew}" in template:
            slots["crew"] = rng.choice(_ZH_CREWS if lang == "zh" else _EN_CREWS)
        text, spans = _render(template, slots)
        if f:
            offset += len(sep)
        facts.append((slots, kind, {k: (a + offset, b + offset) for k, (a, b) in spans.items()}))
        parts.append(text)
        offset += len(text)
    return sep.join(parts), facts


def _examples(rng: random.Random, lang: str, ents: _Entities, n: int, phrasings: str,
              avoid: re.Pattern | None = None) -> list[QAExample]:
    """``n`` questions over fresh passages; ``phrasings`` is "seen" (all but the held-out ones) or "held_out".
    ``avoid``: passages and questions where it matches are drawn again (Chinese training text must not spell a
    held-out name across two slots: a place ending in 罗 before the verb 建成 writes the name 罗建)."""
    questions = _ZH_QUESTIONS if lang == "zh" else _EN_QUESTIONS
    out: list[QAExample] = []
    while len(out) < n:
        context, facts = _passage(rng, lang, ents, rng.choice((1, 2, 3, 3, 4, 4)))
        if avoid is not None and avoid.search(context):
            continue
        for _ in range(min(3, n - len(out))):
            slots, kind, spans = rng.choice(facts)
            pools = {}  # per kind whose answer the fact states, the phrasings that name only what it states
            for k in QUESTION_KINDS:
                slot, templates = questions[k]
                held = templates[-HELD_OUT_PHRASINGS:] if phrasings == "held_out" else templates[:-HELD_OUT_PHRASINGS]
                pool = [t for t in held if _ENTITY_SLOTS.intersection(_slots(t)) <= spans.keys()]
                if slot in spans and pool:
                    pools[k] = pool
            if not pools:
                continue
            qkind = rng.choice(sorted(pools))
            slot = questions[qkind][0]
            question, _ = _render(rng.choice(pools[qkind]), slots)
            if avoid is not None and avoid.search(question):
                continue
            a, b = spans[slot]
            out.append(QAExample(context, question, [context[a:b]], a, b, qkind))
    return out


def fact_corpus(lang: str = "en", n_train: int = 20_000, n_eval: int = 1_000, seed: int = 0,
                entities: int = 600) -> QACorpus:
    """Fact questions: ``n_train`` for training, ``n_eval`` for each of valid, test and test_phrasings.

    ``entities`` sets how many training names of each kind are drawn (a third as many are held out). The same
    arguments always give the same corpus.
    """
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(LANGS)}, got {lang!r}")
    if n_train < 1 or n_eval < 1 or entities < 30:
        raise ValueError(f"need n_train >= 1, n_eval >= 1 and entities >= 30, got {n_train}, {n_eval}, {entities}")
    if lang == "both":
        if n_train < 2 or n_eval < 2:
            raise ValueError(f"lang both needs n_train >= 2 and n_eval >= 2 (half of each language), got {n_train} "
                             f"and {n_eval}")
        en = fact_corpus("en", n_train - n_train // 2, n_eval - n_eval // 2, seed, entities)
        zh = fact_corpus("zh", n_train // 2, n_eval // 2, seed, entities)
        rng = random.Random(f"facts-both-{seed}")
        mixed = {}
        for name in SPLITS:
            mixed[name] = en.splits[name] + zh.splits[name]
            rng.shuffle(mixed[name])
        return QACorpus(mixed, "both")
    train_ents, test_ents = _held_out_split(lang, seed, entities)
    rng = random.Random(f"facts-{lang}-{seed}")
    held = [*test_ents.people, *test_ents.places, *(name for name, _ in test_ents.things)]
    avoid = re.compile("|".join(map(re.escape, sorted(held, key=len, reverse=True)))) if lang == "zh" else None
    splits = {"train": _examples(rng, lang, train_ents, n_train, "seen", avoid),
              "valid": _examples(rng, lang, test_ents, n_eval, "seen"),
              "test": _examples(rng, lang, test_ents, n_eval, "seen"),
              "test_phrasings": _examples(rng, lang, test_ents, n_eval, "held_out")}
    return QACorpus(splits, lang)
