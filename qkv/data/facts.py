"""Generated fact passages with questions, in English and Chinese, for question answering (deterministic).

A passage states one to four facts, each about a different *thing* (an invention, a theory, an equation, a law),
who brought it out (a person), when (a year), where (a city) and sometimes at which organisation. Questions ask
who / when / where / what, each in several phrasings; the answer is a span of the passage (character offsets).

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

import random
from dataclasses import dataclass, field

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
class QACorpus:
    """Examples by split name (``train``, ``valid``, ``test`` and, for generated facts, ``test_phrasings``), and
    their ``language``: ``en``, ``zh`` or ``both`` (mixed)."""

    splits: dict[str, list[QAExample]] = field(default_factory=dict)
    language: str = "en"

    def split(self, name: str) -> list[QAExample]:
        if name not in self.splits:
            raise ValueError(f"no split {name!r}; one of {', '.join(self.splits)}")
        return self.splits[name]

    @property
    def train(self) -> list[QAExample]:
        return self.splits["train"]


# ------------------------------------------------------------------------------------------------ entities

_EN_SYLLABLE_TEXT = ("ka ro ven mar tel dri san lo mi qua bel tor fen gar zu li pra nos ael dun vik hel ost rin "
                      "bra col dem fal gil hor jun kel lum mon nar per quin ras sil tam ul vor wen yel zan tis "
                      "cor del eri fro gan ira jor lin mer nel ori pal rud sev tev ubi val wil xan")
_EN_SYLLABLES = tuple(_EN_SYLLABLE_TEXT.split())
_EN_THINGS = {"invention": (("engine", "machine", "telescope", "lamp", "compass", "battery", "loom", "pump"),
                            ("invented", "built", "designed")),
              "theory": (("theory", "principle", "hypothesis", "model"), ("proposed", "formulated", "put forward")),
              "equation": (("equation", "law", "formula", "theorem"), ("derived", "discovered", "stated"))}
_EN_ORGS = ("Institute", "Society", "Academy", "University", "Laboratory", "College", "Observatory")

_ZH_SURNAMES = ("王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘蒋蔡余杜叶程苏魏"
                "吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万"
                "钱严覃武戴莫孔向汤")
_ZH_GIVEN = ("明华伟芳娜敏静丽强磊军洋勇艳杰涛超秀霞平刚桂英玉兰萍红鹏飞志文建国新春海波宁欣佳嘉怡晨宇浩"
             "然子轩博雅思源泽睿琪瑞辰昊天翔云")
_ZH_TRANSLIT = ("阿巴卡达埃费加哈伊拉马纳奥帕萨塔维斯坦因爱尔克特森顿林普莱诺贝里德利洛夫曼托尼亚欧兹基柯罗"
                "索布")
_ZH_THING_CHARS = ("质能光电磁热声力波粒量子场核频谱相流晶熵引星云原动静压速时空弦链环轨射")
_ZH_THINGS = {"theory": ("理论", "假说", "原理", "模型"), "equation": ("方程", "定律", "公式", "定理"),
              "invention": ("机", "仪", "灯", "泵", "望远镜", "电池")}
_ZH_CITY_SUFFIX = ("城", "堡", "港", "镇", "市")
_ZH_ORGS = ("研究所", "学会", "科学院", "大学", "实验室", "天文台")


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

    people = sorted({" ".join(pick(2)) for _ in range(n)})
    things = sorted({(f"{pick(1)[0]} {rng.choice(_EN_THINGS[k][0])}", k) for k in _EN_THINGS for _ in range(n // 3)})
    places = sorted({pick(1)[0] for _ in range(n // 2)})
    orgs = sorted({f"{pick(1)[0]} {rng.choice(_EN_ORGS)}" for _ in range(n // 3)})
    return _Entities(people, things, places, orgs, years)


def _zh_entities(rng: random.Random, years: list[int], n: int) -> _Entities:
    def chars(pool, lo, hi):
        return "".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))

    people = {rng.choice(_ZH_SURNAMES) + chars(_ZH_GIVEN, 1, 2) for _ in range(n // 2)}
    people |= {chars(_ZH_TRANSLIT, 3, 4) for _ in range(n // 2)}
    things = {(chars(_ZH_THING_CHARS, 2, 2) + rng.choice(_ZH_THINGS[k]), k) for k in _ZH_THINGS for _ in range(n // 3)}
    places = {chars(_ZH_TRANSLIT, 2, 3) + rng.choice(_ZH_CITY_SUFFIX) for _ in range(n // 2)}
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


# ------------------------------------------------------------------------------------------------ templates
# A fact template marks its slots {thing} {person} {year} {place} {org} {verb}; every slot is a possible answer.

_EN_FACTS = (
    "The {thing} was {verb} by {person} in {year} in {place}.",
    "{person} {verb} the {thing} in {place} in {year}.",
    "In {year}, {person} {verb} the {thing} at the {org} in {place}.",
    "The {thing} was {verb} in {place} by {person}, who worked at the {org}, in {year}.",
    "Working in {place}, {person} {verb} the {thing} in {year}.",
)
# (kind, answer slot, phrasings); the last phrasing of each kind is held out of training
_EN_QUESTIONS = {
    "who": ("person", ("Who {verb} the {thing}?", "Which person {verb} the {thing}?", "By whom was the {thing} {verb}?",
                       "Name the person who {verb} the {thing}.", "The {thing} is the work of whom?")),
    "when": ("year", ("When was the {thing} {verb}?", "In which year was the {thing} {verb}?",
                      "What year did {person} give us the {thing}?", "In what year did the {thing} appear?",
                      "The {thing} dates from which year?")),
    "where": ("place", ("Where was the {thing} {verb}?", "In which city was the {thing} {verb}?",
                        "Where did {person} work on the {thing}?", "In what place did the {thing} appear?",
                        "The {thing} comes from which city?")),
    "what": ("thing", ("What did {person} give us in {year}?", "Which {noun} did {person} bring out?",
                       "What is {person} known for?", "Name the {noun} of {person}.",
                       "{person} is remembered for which work?")),
}
_ZH_FACTS = (
    "{thing}由{person}于{year}年提出。",
    "{person}于{year}年在{place}提出了{thing}。",
    "{year}年,{person}在{place}的{org}提出了{thing}。",
    "{thing}是{person}在{place}提出的,时间是{year}年。",
    "在{place}工作的{person}于{year}年提出{thing}。",
)
_ZH_QUESTIONS = {
    "who": ("person", ("{thing}是谁提出的?", "谁提出了{thing}?", "哪位学者提出了{thing}?", "{thing}的提出者是谁?",
                       "{thing}出自何人之手?")),
    "when": ("year", ("{thing}是什么时候提出的?", "{thing}是哪一年提出的?", "{person}在哪一年提出了{thing}?",
                      "{thing}提出于哪一年?", "{thing}诞生于何时?")),
    "where": ("place", ("{thing}是在哪里提出的?", "{thing}是在哪个城市提出的?", "{person}在哪里提出了{thing}?",
                        "{thing}在什么地方提出?", "{thing}诞生于何地?")),
    "what": ("thing", ("{person}提出了什么?", "{person}在{year}年提出了什么?", "{person}的成果是什么?",
                       "{person}以什么闻名?", "{person}留下了哪项成果?")),
}
HELD_OUT_PHRASINGS = 1  # the last phrasing of every kind


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
        verb = rng.choice(_EN_THINGS[kind][1]) if lang == "en" else "提出"
        slots = {"thing": name, "person": people[f], "year": str(years[f]), "place": places[f],
                 "org": rng.choice(ents.orgs), "verb": verb}
        text, spans = _render(rng.choice(facts_t), slots)
        if f:
            offset += len(sep)
        facts.append((slots, kind, {k: (a + offset, b + offset) for k, (a, b) in spans.items()}))
        parts.append(text)
        offset += len(text)
    return sep.join(parts), facts


def _examples(rng: random.Random, lang: str, ents: _Entities, n: int, phrasings: str) -> list[QAExample]:
    """``n`` questions over fresh passages; ``phrasings`` is "seen" (all but the held-out ones) or "held_out"."""
    questions = _ZH_QUESTIONS if lang == "zh" else _EN_QUESTIONS
    out: list[QAExample] = []
    while len(out) < n:
        context, facts = _passage(rng, lang, ents, rng.choice((1, 2, 3, 3, 4, 4)))
        for _ in range(min(3, n - len(out))):
            slots, kind, spans = rng.choice(facts)
            qkind = rng.choice([k for k in QUESTION_KINDS if questions[k][0] in spans])
            slot, templates = questions[qkind]
            pool = templates[-HELD_OUT_PHRASINGS:] if phrasings == "held_out" else templates[:-HELD_OUT_PHRASINGS]
            template = rng.choice(pool)
            noun = slots["thing"].split()[-1] if lang == "en" else ""
            question, _ = _render(template, {**slots, "noun": noun})
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
    splits = {"train": _examples(rng, lang, train_ents, n_train, "seen"),
              "valid": _examples(rng, lang, test_ents, n_eval, "seen"),
              "test": _examples(rng, lang, test_ents, n_eval, "seen"),
              "test_phrasings": _examples(rng, lang, test_ents, n_eval, "held_out")}
    return QACorpus(splits, lang)
