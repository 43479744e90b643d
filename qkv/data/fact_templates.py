"""The words and templates of :mod:`qkv.data.facts`: name parts, things with their verbs, fact templates and question
phrasings, in English and Chinese (data only; the generator is in :mod:`qkv.data.facts`)."""

_EN_SYLLABLE_TEXT = ("ka ro ven mar tel dri san lo mi qua bel tor fen gar zu li pra nos ael dun vik hel ost rin "
                      "bra col dem fal gil hor jun kel lum mon nar per quin ras sil tam ul vor wen yel zan tis "
                      "cor del eri fro gan ira jor lin mer nel ori pal rud sev tev ubi val wil xan")
_EN_SYLLABLES = tuple(_EN_SYLLABLE_TEXT.split())
# kind -> (nouns, verbs as (past tense, past participle, base form), verbs without an object for "did it ...")
_EN_THINGS = {
    "invention": (("engine", "machine", "telescope", "lamp", "compass", "battery", "loom", "pump", "camera", "radio"),
                  (("invented", "invented", "invent"), ("built", "built", "build"), ("designed", "designed", "design"),
                   ("patented", "patented", "patent"), ("developed", "developed", "develop"),
                   ("improved", "improved", "improve"))),
    "theory": (("theory", "principle", "hypothesis", "model"),
               (("proposed", "proposed", "propose"), ("formulated", "formulated", "formulate"),
                ("put forward", "put forward", "put forward"), ("published", "published", "publish"),
                ("introduced", "introduced", "introduce"))),
    "equation": (("equation", "law", "formula", "theorem"),
                 (("derived", "derived", "derive"), ("discovered", "discovered", "discover"),
                  ("stated", "stated", "state"), ("proved", "proved", "prove"))),
    "building": (("tower", "bridge", "cathedral", "library", "museum", "station", "canal"),
                 (("built", "built", "build"), ("completed", "completed", "complete"),
                  ("designed", "designed", "design"), ("finished", "finished", "finish"),
                  ("opened", "opened", "open"))),
    "discovery": (("element", "vaccine", "compound", "mineral", "comet", "particle"),
                  (("discovered", "discovered", "discover"), ("isolated", "isolated", "isolate"),
                   ("identified", "identified", "identify"), ("found", "found", "find"))),
    "work": (("book", "treatise", "novel", "atlas", "encyclopedia", "symphony"),
             (("wrote", "written", "write"), ("published", "published", "publish"),
              ("completed", "completed", "complete"))),
}
_EN_INTRANSITIVE = {"building": ("open", "appear"), "work": ("appear", "come out")}  # default: appear, come about
_EN_ORGS = ("Institute", "Society", "Academy", "University", "Laboratory", "College", "Observatory")
# who worked for a person ("by Eiffel's company"): an agent phrase whose answer to "who" is the person
_EN_CREWS = ("company", "team", "workshop", "firm", "students", "assistants")

_ZH_SURNAMES = ("王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘蒋蔡余杜叶程苏魏"
                "吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万"
                "钱严覃武戴莫孔向汤")
_ZH_GIVEN = ("明华伟芳娜敏静丽强磊军洋勇艳杰涛超秀霞平刚桂英玉兰萍红鹏飞志文建国新春海波宁欣佳嘉怡晨宇浩"
             "然子轩博雅思源泽睿琪瑞辰昊天翔云")
_ZH_TRANSLIT = ("阿巴卡达埃费加哈伊拉马纳奥帕萨塔维斯坦因爱尔克特森顿林普莱诺贝里德利洛夫曼托尼亚欧兹基柯罗"
                "索布")
_ZH_THING_CHARS = ("质能光电磁热声力波粒量子场核频谱相流晶熵引星云原动静压速时空弦链环轨射")
# kind -> (name endings, verbs)
_ZH_THINGS = {"theory": (("理论", "假说", "原理", "模型"), ("提出", "创立", "发表")),
              "equation": (("方程", "定律", "公式", "定理"), ("推导出", "发现", "证明", "提出")),
              "invention": (("机", "仪", "灯", "泵", "望远镜", "电池"), ("发明", "制造", "设计", "改进")),
              "building": (("塔", "铁塔", "桥", "大教堂", "图书馆", "博物馆", "剧院"), ("建成", "设计", "建造")),
              "discovery": (("素", "霉素", "射线", "彗星", "矿石"), ("发现", "分离出")),
              "work": (("论", "集", "志"), ("写成", "出版", "发表"))}
_ZH_CITY_SUFFIX = ("城", "堡", "港", "镇", "市")
_ZH_ORGS = ("研究所", "学会", "科学院", "大学", "实验室", "天文台")
_ZH_CREWS = ("公司", "团队", "工作室", "学生", "助手")


# A fact template marks its slots {thing} {person} {year} {place} {org} (the possible answers) and {verb} (past
# tense), {pp} (past participle), {base} (base form), {intr} (a verb without object), {noun}, {age}, {count}
# (numbers that are not years: distractors for "when"), {crew} (who worked for the person: "by {person}'s {crew}"),
# and {the}/{The}: the article, empty before a bare name
# ("Curie discovered polonium", "the Kavo engine"). Some facts name no person or no place.

_EN_FACTS = (
    "{The}{thing} was {pp} by {person} in {year} in {place}.",
    "{person} {verb} {the}{thing} in {place} in {year}.",
    "In {year}, {person} {verb} {the}{thing} at the {org} in {place}.",
    "{The}{thing} was {pp} in {place} by {person}, who worked at the {org}, in {year}.",
    "Working in {place}, {person} {verb} {the}{thing} in {year}.",
    "{The}{thing} was {pp} in {year} in {place}.",
    "{person} {verb} {the}{thing} in {year}.",
    "{The}{thing}, {pp} by {person} in {place}, dates from {year}.",
    "In {place} in {year}, {person}, aged {age}, {verb} {the}{thing}.",
    "{The}{thing} was {pp} by {person} in {year}, after {age} years of work in {place}.",
    "{person} of the {org} {verb} {the}{thing} in {place} in {year}, with {count} helpers.",
    "{The}{thing} was {pp} in {year} by {person}.",
    "{The}{thing} was {pp} in {year} by {person}'s {crew}.",
    "In {place}, {person}'s {crew} {verb} {the}{thing} in {year}.",
)
# (kind, answer slot, phrasings); the last phrasing of each kind is held out of training
_EN_QUESTIONS = {
    "who": ("person", ("Who {verb} {the}{thing}?", "Which person {verb} {the}{thing}?",
                       "By whom was {the}{thing} {pp}?", "Name the person who {verb} {the}{thing}.",
                       "Who was {the}{thing} {pp} by?", "Who is credited with {the}{thing}?",
                       "Tell me who {verb} {the}{thing}.", "Do you know who {verb} {the}{thing}?",
                       "Whose {noun} is {the}{thing}?", "Who was behind {the}{thing}?",
                       "{The}{thing} is the work of whom?")),
    "when": ("year", ("When was {the}{thing} {pp}?", "In which year was {the}{thing} {pp}?",
                      "What year did {person} {base} {the}{thing}?", "In what year did {the}{thing} appear?",
                      "When did {person} {base} {the}{thing}?", "What year was {the}{thing} {pp}?",
                      "When did {the}{thing} {intr}?", "Which year was {the}{thing} {pp} in?",
                      "In which year did {person} {base} {the}{thing}?", "Tell me when {the}{thing} was {pp}.",
                      "{The}{thing} dates from which year?")),
    "where": ("place", ("Where was {the}{thing} {pp}?", "In which city was {the}{thing} {pp}?",
                        "Where did {person} {base} {the}{thing}?", "In what place did {the}{thing} appear?",
                        "Which city did {person} {base} {the}{thing} in?", "In which town was {the}{thing} {pp}?",
                        "Where did {the}{thing} {intr}?", "What city was {the}{thing} {pp} in?",
                        "Tell me where {person} {verb} {the}{thing}.", "{The}{thing} comes from which city?")),
    "what": ("thing", ("What did {person} {base} in {year}?", "Which {noun} did {person} {base}?",
                       "What is {person} known for?", "Name the {noun} of {person}.", "What did {person} {base}?",
                       "What was {pp} by {person}?", "What did {person} {base} in {place}?",
                       "What did {person} give us in {year}?", "Which {noun} is {person} known for?",
                       "{person} is remembered for which work?")),
}
_ZH_FACTS = (
    "{thing}由{person}于{year}年{verb}。",
    "{person}于{year}年在{place}{verb}了{thing}。",
    "{year}年,{person}在{place}的{org}{verb}了{thing}。",
    "{thing}是{person}在{place}{verb}的,时间是{year}年。",
    "在{place}工作的{person}于{year}年{verb}{thing}。",
    "{thing}于{year}年在{place}{verb}。",
    "{person}在{year}年{verb}了{thing}。",
    "{person}{age}岁时在{place}{verb}了{thing}，那一年是{year}年。",
    "{thing}由{place}的{person}{verb}，完成于{year}年。",
    "{year}年，{thing}在{place}由{person}{verb}，共有{count}人参与。",
    "{thing}于{year}年由{person}的{crew}{verb}。",
)
_ZH_QUESTIONS = {
    "who": ("person", ("{thing}是谁{verb}的?", "谁{verb}了{thing}?", "哪位学者{verb}了{thing}?",
                       "{thing}是由谁{verb}的?", "是谁{verb}了{thing}?", "{verb}{thing}的人是谁?", "{thing}的作者是谁?",
                       "{thing}是何人{verb}的?", "{thing}是哪个人{verb}的?", "{thing}出自何人之手?")),
    "when": ("year", ("{thing}是什么时候{verb}的?", "{thing}是哪一年{verb}的?", "{person}在哪一年{verb}了{thing}?",
                      "{thing}{verb}于哪一年?", "{thing}是何时{verb}的?", "{person}什么时候{verb}了{thing}?",
                      "{thing}是哪年{verb}的?", "{person}是在哪年{verb}{thing}的?", "{person}{verb}{thing}是在哪一年?",
                      "{thing}诞生于何时?")),
    "where": ("place", ("{thing}是在哪里{verb}的?", "{thing}是在哪个城市{verb}的?", "{person}在哪里{verb}了{thing}?",
                        "{thing}在什么地方{verb}?", "{person}是在哪座城市{verb}{thing}的?", "{thing}是在何处{verb}的?",
                        "{person}在何地{verb}了{thing}?", "{thing}来自哪座城市?",
                        "{person}是在什么地方{verb}{thing}的?", "{thing}诞生于何地?")),
    "what": ("thing", ("{person}{verb}了什么?", "{person}在{year}年{verb}了什么?", "{person}的成果是什么?",
                       "{person}以什么闻名?", "{person}在{place}{verb}了什么?", "{person}{verb}的是什么?",
                       "{person}有什么成就?", "{person}在{year}年有什么成果?", "{person}留下了哪项成果?")),
}
HELD_OUT_PHRASINGS = 1  # the last phrasing of every kind
