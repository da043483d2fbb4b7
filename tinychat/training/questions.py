"""Conversation plans v2: many kinds of user messages, follow-ups that read the answer, and checkable facts.

The v1 plans (:mod:`tinychat.training.prompts`) drew from ~5,000 openings and a dozen follow-ups, so the student
learned the templates ("capital of ..." was always France) rather than to read the question. v2 builds each user
message from entity lists times question frames:

- sources: countries, capitals, regions, languages and demonyms from ``countryinfo``; jobs and first names from
  ``faker``; topic words from ``wordfreq``'s frequency list (these entity lists: :mod:`tinychat.training.entities`);
  our own lists and fact tables (:mod:`tinychat.training.topic_lists`); openings from ``chitchat-dataset`` when
  installed; and, when a pool file is given, questions the teacher itself wrote for sampled topics
  (:mod:`tinychat.training.selfinstruct`);
- kinds: facts with one checkable answer (capitals, an animal's legs, colours, opposites, small sums, the day
  after Tuesday), what a name / number / place the user said earlier was ("memory"), how-to, advice, explanations,
  comparisons, definitions, opinions, short creative requests;
- follow-ups: a third refer to a detail of the previous answer (:class:`Turn` with ``dynamic="detail"``: the text
  is made from the reply when it arrives), others ask the same thing of another entity ("And what about Peru?",
  checked too), ask more about the entity, or are generic (a long list, so none dominates).

A :class:`Turn` may carry ``check``: accepted answers, one of which the teacher's reply must contain (whole word,
any case); the generator drops a reply that fails it, so the student copies only right answers.

Held out by construction for the probe set (:mod:`tinychat.training.probe`): the probe's question frames are never
used here, and neither are its first names (memory probes) nor its operand pairs (sums). Knowledge probes
(capitals, colours, ...) ask about entities the training data covers, in words it never used.
Everything is deterministic given the seed.
"""
from __future__ import annotations

import functools
import json
import random
import zlib
from dataclasses import dataclass
from typing import Iterator

from . import creators, topic_lists
from .entities import countries, country_weights, first_names, jobs, topic_words
from .prompts import chitchat_pool


@dataclass(frozen=True)
class Turn:
    text: str                          # the user message ("" when dynamic)
    check: tuple[str, ...] = ()        # accepted answers: the reply must contain one (whole word, any case)
    dynamic: str = ""                  # "detail": made from the previous reply when it arrives


@dataclass(frozen=True)
class Plan:
    kind: str
    turns: tuple[Turn, ...]
    source: str                        # "template", "chitchat-dataset" or "self-instruct"


def held_out(item: str, salt: str, fraction: float = 0.15) -> bool:
    """Whether an item (a name, an operand pair) belongs to the probe side; stable across runs and machines."""
    return zlib.crc32(f"{salt}:{item}".encode()) < fraction * 2 ** 32


def plural(noun: str) -> str:
    irregular = {"mouse": "mice", "goose": "geese", "sheep": "sheep", "deer": "deer", "moose": "moose",
                 "fish": "fish", "wolf": "wolves", "octopus": "octopuses", "person": "people", "child": "children",
                 "salmon": "salmon", "trout": "trout", "tuna": "tuna", "elk": "elk", "shrimp": "shrimp",
                 "knife": "knives", "python": "pythons", "platypus": "platypuses", "goldfish": "goldfish"}
    if noun in irregular:
        return irregular[noun]
    head, _, last = noun.rpartition(" ")
    pre = head + " " if head else ""
    if last in irregular:
        return pre + irregular[last]
    if last.endswith(("s", "x", "ch", "sh")):
        return pre + last + "es"
    if last.endswith("y") and last[-2:-1] not in "aeiou":
        return pre + last[:-1] + "ies"
    return pre + last + "s"


def article(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


# ----------------------------------------------------------------------------------------------------------------
# The teacher-written question pool (loaded once per path; the entity lists are entities.py)
# ----------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def question_pool(path: str | None) -> tuple[str, ...]:
    """Teacher-written questions (one JSON object per line with "question"), or () without a pool."""
    if not path:
        return ()
    import gzip
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line)["question"] for line in f if line.strip())


# ----------------------------------------------------------------------------------------------------------------
# Follow-ups
# ----------------------------------------------------------------------------------------------------------------

GENERIC = topic_lists.split("""Why?|Can you say more?|Can you give me an example?|Thanks! Anything else?|How so?|
Can you explain that more simply?|Interesting. Tell me more.|Can you make it shorter?|What else should I know?|
Thank you!|Really? Why is that?|Can you sum that up in one sentence?|Okay, and then what?|Cool! What else?|
Is that true?|How do you know?|That's interesting. Why does that happen?|Could you explain it to a child?|
What's the most important part?|Can you put that in simpler words?|Can you give me another example?|
What would you add to that?|Is there a simple way to remember that?|What do most people get wrong about that?|
Thanks, that helps. One more thing: why does it matter?|Nice. Can you list the main points?|
Hmm, I'm not sure I follow. Can you rephrase?|Can you say that in two sentences?|Great answer! What else?|
So what should I take away from that?|Okay. What's a fun fact about that?|Wait, can you go back a step?|
Is that always the case?|What's an example from everyday life?|Good to know. Anything I should avoid?|
Can you be more specific?|Why would someone want to know that?|Where can I learn more about that?|
How would you explain that to a friend?|What's the short version?|And why is that useful?""")

# An acknowledgment before 60 % of the generic follow-ups: 41 questions alone made each ~0.5 % of all user turns
# (`training stats` on shards-6's first 7,422 conversations: "how do you know" 0.55 %); with these, ~10x as many
# distinct follow-ups share those turns.
ACKS = topic_lists.split("""Okay.|Ok.|Thanks.|Thanks!|Got it.|I see.|Hmm.|Interesting.|Wow.|Nice.|Cool.|Right.|Oh.|
Huh.|Good to know.|Makes sense.|Alright.|Sure.|Neat.|Hm, okay.""")


def _generic(rng: random.Random) -> Turn:
    text = rng.choice(GENERIC)
    if rng.random() < 0.6:
        text = f"{rng.choice(ACKS)} {text}"
    return _t(text)


DETAIL = topic_lists.split("""What do you mean by "{w}"?|Tell me more about {w}.|Why did you mention {w}?|
Can you explain the part about {w}?|What is {w}, exactly?|How does {w} fit in?|You said {w}. Can you give an example?|
Wait, what's {w}?|Can you say more about {w}?|Why is {w} important here?|I didn't know about {w}. Tell me more.|
How is {w} related to my question?""")

_STOP = frozenset("""about above after again against all also although always among another anything around
because been before being below between both cannot could della does doing during each either enough especially
every everyone everything example first found from further generally great have having here however important
include including instead into itself just keep known less like likely made make makes making many maybe might
more most much must need never often only other others otherwise over people perhaps place quite rather really
same several should since some something sometimes still such sure than that their them then there these they
thing things think this those though through time together under until upon usually very well were what whatever
when where whether which while will with within without would your yours answer question help helpful
different simple simply little certain because around called usually number""".split())


def detail_followup(reply: str, user: str, rng: random.Random) -> str | None:
    """A follow-up about one content word of the reply that the user's message did not contain, or None."""
    import re
    said = {w.lower() for w in re.findall(r"[A-Za-z']+", user)}
    first = re.match(r"\W*([A-Za-z]+)", reply)
    cands = [w for w in re.findall(r"\b[A-Za-z][a-z]{4,}\b", reply)
             if w.lower() not in _STOP and w.lower() not in said and not w.lower().endswith("ly")]
    if not cands:
        return None
    w = rng.choice(cands)
    if first and w == first.group(1):         # capitalised only because it starts the reply
        w = w.lower()
    return rng.choice(DETAIL).format(w=w)


# ----------------------------------------------------------------------------------------------------------------
# Kinds: each returns (first turn, follow-up makers); a follow-up maker is rng -> Turn
# ----------------------------------------------------------------------------------------------------------------

def _t(text: str, *answers) -> Turn:
    return Turn(text, tuple(str(a) for a in answers if a != ""))


# Question frames the probe set uses are never used here (probe.py holds them; tests check the two apart).
CAPITAL = topic_lists.split("""What is the capital of {c}?|What's the capital city of {c}?|Which city is the capital of {c}?|
Do you know the capital of {c}?|What city is the capital of {c}?|Name the capital of {c}.|
I forgot: what is the capital of {c}?|What is {c}'s capital?""")
CONTINENT = topic_lists.split("""Which continent is {c} in?|On what continent is {c}?|Is {c} in Europe, Asia or somewhere else?|
Where in the world is {c}?""")
LANGUAGE = topic_lists.split("""What language do people speak in {c}?|What is the main language of {c}?|
Which language is spoken in {c}?""")
DEMONYM = topic_lists.split("""What do you call a person from {c}?|What are people from {c} called?""")
COUNTRY_MORE = topic_lists.split("""What is {c} famous for?|What food is {c} known for?|What is the weather like in {c}?|
What should I see if I visit {c}?|Tell me something interesting about {c}.|Is {c} a big country?|
What is {cap} like?|What can I do in {cap}?""")


def _country(rng: random.Random, popular: bool = False):
    cs = list(countries())
    if not cs:
        return None
    pick = (lambda r: r.choices(cs, weights=country_weights())[0]) if popular else (lambda r: r.choice(cs))
    c = pick(rng)
    facts = [("capital", CAPITAL, c["capital"])]
    if c["continent"]:
        facts.append(("continent", CONTINENT, c["continent"]))
    if c["language"]:
        facts.append(("language", LANGUAGE, c["language"]))
    if c["demonym"]:
        facts.append(("demonym", DEMONYM, c["demonym"]))
    field, frames, ans = rng.choice(facts)
    first = _t(rng.choice(frames).format(c=c["name"]), ans)

    def again(r):      # the same question about another country, checked too
        c2 = pick(r)
        if not c2.get(field):
            return None
        return _t(r.choice(topic_lists.split("And what about {c}?|What about {c}?|And {c}?|How about {c}?")).format(c=c2["name"]),
                  c2[field])

    def more(r):
        return _t(r.choice(COUNTRY_MORE).format(c=c["name"], cap=c["capital"]))
    return first, [again, more], "fact"


def _animal_fact(rng):
    kind = rng.random()
    if kind < 0.3:
        a, n = rng.choice(sorted(topic_lists.ANIMAL_LEGS.items()))
        words = topic_lists.NUMBER_WORDS[int(n)] if int(n) < len(topic_lists.NUMBER_WORDS) else n
        frame = rng.choice(topic_lists.split("How many legs does {a} have?|How many legs do {p} have?|"
                                   "Does {a} have many legs? How many?"))
        first = _t(frame.format(a=article(a), p=plural(a)), n, words)
        table = topic_lists.ANIMAL_LEGS
    elif kind < 0.55:
        a, s = rng.choice(sorted(topic_lists.ANIMAL_SOUNDS.items()))
        frame = rng.choice(topic_lists.split("What sound does {a} make?|What noise do {p} make?|How does {a} sound?"))
        first = _t(frame.format(a=article(a), p=plural(a)), s, s + "s", s + "ing", s + "es")
        table = topic_lists.ANIMAL_SOUNDS
    else:
        a, b = rng.choice(sorted(topic_lists.BABY_ANIMALS.items()))
        frame = rng.choice(topic_lists.split("What is a baby {a} called?|What do you call a baby {a}?|What's the name for a young {a}?"))
        first = _t(frame.format(a=a), b, plural(b))
        table = topic_lists.BABY_ANIMALS

    def again(r):
        a2, v = r.choice(sorted(table.items()))
        checks = (v, topic_lists.NUMBER_WORDS[int(v)]) if v.isdigit() and int(v) <= 20 else (v, v + "s", plural(v))
        return _t(r.choice(topic_lists.split("What about {a}?|And {a}?|How about {a}?")).format(a=article(a2)), *checks)
    return first, [again, lambda r: _t(r.choice(ANIMAL_MORE).format(p=plural(a), a=article(a)))], "fact"


ANIMAL_MORE = topic_lists.split("""Where do {p} live?|What do {p} eat?|How long do {p} live?|Are {p} good pets?|
Can {p} swim?|Tell me a fun fact about {p}.|Are {p} smart?|How big do {p} get?|Why are {p} important?""")


def _colour(rng):
    thing, col = rng.choice(sorted(topic_lists.COLOURS_OF.items()))
    first = _t(rng.choice(topic_lists.split("What color is {x}?|What colour is {x}?|Tell me, what color is {x}?")).format(x=thing),
               col)

    def again(r):
        t2, c2 = r.choice(sorted(topic_lists.COLOURS_OF.items()))
        return _t(f"And {t2}?", c2)
    return first, [again, lambda r: _t(r.choice(topic_lists.split("Why is it that color?|What else is that color?")))], "fact"


def _opposite(rng):
    items = sorted(topic_lists.OPPOSITES.items())
    w, o = rng.choice(items)
    if rng.random() < 0.5:
        w, o = o, w
    first = _t(rng.choice(topic_lists.split('What is the opposite of "{w}"?|What\'s the opposite of {w}?|'
                                  'Give me the opposite of the word "{w}".')).format(w=w), o)

    def again(r):
        w2, o2 = r.choice(items)
        return _t(r.choice(topic_lists.split('And "{w}"?|What about "{w}"?|Now the opposite of "{w}".')).format(w=w2), o2)
    return first, [again, lambda r: _t(f'Can you use "{o}" in a sentence?')], "fact"


def arithmetic_item(rng: random.Random) -> tuple[str, int, str]:
    """(operator, answer, text) of a small sum, difference or product, operands not in the probe's pairs."""
    op, _, _, ans, text = arithmetic_problem(rng)
    return op, ans, text


def arithmetic_problem(rng: random.Random) -> tuple[str, int, int, int, str]:
    """(operator, a, b, answer, text): :func:`arithmetic_item` with its operands (a op b, whatever the wording)."""
    while True:
        op = rng.choice("+-*")
        a, b = (rng.randint(0, 20), rng.randint(0, 20)) if op != "*" else (rng.randint(1, 10), rng.randint(1, 10))
        if op == "-" and b > a:
            a, b = b, a
        if held_out(f"{a}{op}{b}", "sum"):
            continue
        ans = a + b if op == "+" else a - b if op == "-" else a * b
        frames = {"+": "What is {a} plus {b}?|What is {a} + {b}?|How much is {a} and {b} together?|"
                       "If I have {a} apples and get {b} more, how many do I have?|Add {a} and {b}.",
                  "-": "What is {a} minus {b}?|What is {a} - {b}?|If I have {a} cookies and eat {b}, how many are left?|"
                       "Subtract {b} from {a}.",
                  "*": "What is {a} times {b}?|What is {a} x {b}?|Multiply {a} by {b}.|What is {a} multiplied by {b}?"}
        return op, a, b, ans, rng.choice(topic_lists.split(frames[op])).format(a=a, b=b)


def _arithmetic(rng):
    op, ans, text = arithmetic_item(rng)
    checks = (ans, topic_lists.NUMBER_WORDS[ans]) if 0 <= ans < len(topic_lists.NUMBER_WORDS) else (ans,)

    def again(r):
        op2, ans2, text2 = arithmetic_item(r)
        c2 = (ans2, topic_lists.NUMBER_WORDS[ans2]) if 0 <= ans2 < len(topic_lists.NUMBER_WORDS) else (ans2,)
        return _t(r.choice(["And ", "Now: ", "Next one: ", ""]) + text2[0].lower() + text2[1:], *c2)
    return _t(text, *checks), [again, lambda r: _t(r.choice(topic_lists.split("How did you get that?|Can you show the steps?")))], "fact"


@functools.cache
def _creator_pool() -> tuple[tuple[str, str, str], ...]:
    return tuple(creators.items(held_out))      # the training side of the probe split, computed once


def _creator(rng):
    """Who wrote / painted / invented / discovered / composed a famous work (v5), checked by the maker's name."""
    pool = _creator_pool()
    verb, work, maker = rng.choice(pool)

    def again(r):
        same = [(w, m) for v, w, m in pool if v == verb and w != work]
        w2, m2 = r.choice(same)
        return _t(creators.again(r, verb, w2), *creators.checks(m2))
    return (_t(creators.question(rng, verb, work), *creators.checks(maker)),
            [again, lambda r: _t(creators.more(r, verb, work, maker))], "fact")


SHAPES = topic_lists.table("triangle=3|square=4|rectangle=4|pentagon=5|hexagon=6|octagon=8")
COUNTS = [("How many days are in a week?", "7", "seven"), ("How many months are in a year?", "12", "twelve"),
          ("How many hours are in a day?", "24", "24"), ("How many minutes are in an hour?", "60", "sixty"),
          ("How many seconds are in a minute?", "60", "sixty"), ("How many days are in a year?", "365", "365"),
          ("How many players are on a soccer team?", "11", "eleven"), ("How many wheels does a bicycle have?", "2", "two"),
          ("How many continents are there?", "7", "seven"), ("How many colors are in a rainbow?", "7", "seven")]


def _calendar(rng):
    r = rng.random()
    if r < 0.3:
        i = rng.randrange(7)
        after = rng.random() < 0.6
        ans = topic_lists.WEEKDAYS[(i + 1) % 7] if after else topic_lists.WEEKDAYS[i - 1]
        first = _t(f"What day comes {'after' if after else 'before'} {topic_lists.WEEKDAYS[i]}?", ans)
    elif r < 0.6:
        i = rng.randrange(12)
        after = rng.random() < 0.6
        ans = topic_lists.MONTHS[(i + 1) % 12] if after else topic_lists.MONTHS[i - 1]
        first = _t(f"Which month comes {'after' if after else 'before'} {topic_lists.MONTHS[i]}?", ans)
    elif r < 0.8:
        s, n = rng.choice(sorted(SHAPES.items()))
        first = _t(rng.choice(topic_lists.split("How many sides does {a} have?|How many corners does {a} have?")).format(a=article(s)),
                   n, topic_lists.NUMBER_WORDS[int(n)])
    else:
        q, a, w = rng.choice(COUNTS)
        first = _t(q, a, w)
    return first, [lambda r2: _t(r2.choice(topic_lists.split("How can I remember that?|Is that the same everywhere?|"
                                                   "Who decided that?|Has it always been that way?")))], "fact"


MEMORY_OPEN = {
    "name": topic_lists.split("""Hi! My name is {x}.|Hello, I'm {x}. Nice to meet you!|Hey there, {x} here.|
My name is {x}. How are you today?|Hi, I'm {x}. Can you help me with something?"""),
    "colour": topic_lists.split("""My favorite color is {x}.|I really love the color {x}.|{x} is my favorite color."""),
    "pet": topic_lists.split("""I have {n} {p} at home.|We have {n} {p}.|My family has {n} {p}."""),
    "city": topic_lists.split("""I live in {x}.|I just moved to {x}.|I'm from {x}."""),
}
MEMORY_ASK = {
    "name": topic_lists.split("""What's my name?|Do you remember my name?|What did I say my name was?|Who am I?"""),
    "colour": topic_lists.split("""What's my favorite color?|Do you remember my favorite color?|Which color do I love?"""),
    "pet": topic_lists.split("""How many {p} do I have?|Do you remember how many {p} I have?"""),
    "city": topic_lists.split("""Where do I live?|Which city did I mention?|Do you remember where I live?"""),
}
COLOUR_NAMES = topic_lists.split("red|blue|green|yellow|purple|orange|pink|black|white|brown|gray|teal")


def _memory(rng):
    what = rng.choice(sorted(MEMORY_OPEN))
    if what == "name":
        x = rng.choice([n for n in first_names() if not held_out(n, "name")])
        opener, ans = rng.choice(MEMORY_OPEN[what]).format(x=x), (x,)
    elif what == "colour":
        x = rng.choice(COLOUR_NAMES)
        opener, ans = rng.choice(MEMORY_OPEN[what]).format(x=x), (x,)
    elif what == "pet":
        n = rng.randint(2, 6)
        p = plural(rng.choice(["cat", "dog", "rabbit", "hamster", "goldfish", "chicken", "parrot", "turtle"]))
        opener, ans = rng.choice(MEMORY_OPEN[what]).format(n=n, p=p), (str(n), topic_lists.NUMBER_WORDS[n])
    else:
        cs = countries()
        x = rng.choice([c["capital"] for c in cs]) if cs else rng.choice(["Paris", "Lima", "Oslo", "Cairo"])
        opener, ans = rng.choice(MEMORY_OPEN[what]).format(x=x), (x,)
    mid, _, _ = rng.choice([_howto, _explain_object, _food, _hobby, _animal_open])(rng)
    ask = rng.choice(MEMORY_ASK[what]).format(p=p if what == "pet" else "")
    first = Turn((opener + " " + mid.text).replace("..", "."))
    return first, [lambda r: _t(ask, *ans)], "memory"


def _animal_open(rng):
    a = rng.choice(topic_lists.ANIMALS)
    first = _t(rng.choice(ANIMAL_MORE + topic_lists.split("Tell me about {p}.|What kind of animal is {a}?")).format(
        p=plural(a), a=article(a)))
    return first, [lambda r: _t(r.choice(ANIMAL_MORE).format(p=plural(a), a=article(a))),
                   lambda r: _t(r.choice(ANIMAL_MORE).format(p=plural(b := r.choice(topic_lists.ANIMALS)), a=article(b)))], "explain"


def _howto(rng):
    task = rng.choice(topic_lists.TASKS)
    first = _t(rng.choice(topic_lists.split("""How do I {x}?|What's the easiest way to {x}?|Can you teach me how to {x}?|
Give me the steps to {x}.|I want to {x}. Where do I start?|Any tips on how to {x}?|What do I need to {x}?""")).format(x=task))
    more = topic_lists.split("""What do I need for that?|How long does it take?|What's the hardest part?|What if I make a mistake?|
Can you make the steps shorter?|Is there a faster way?|What should I do first?|Any safety tips?""")
    return first, [lambda r: _t(r.choice(more)),
                   lambda r: _t(r.choice(topic_lists.split("And how do I {x}?|What about how to {x}?")).format(x=r.choice(topic_lists.TASKS)))], "howto"


def _job(rng):
    j = rng.choice(jobs())
    frames = topic_lists.split("""What does {a} do?|How do I become {a}?|What skills does {a} need?|Is being {a} a good job?|
What is a typical day like for {a}?|What do you study to become {a}?""")
    first = _t(rng.choice(frames).format(a=article(j)))
    return first, [lambda r: _t(r.choice(frames).format(a=article(r.choice(jobs())))),
                   lambda r: _t(r.choice(topic_lists.split("Is it well paid?|Is it hard?|What's the best part of that job?")))], "explain"


def _food(rng):
    f = rng.choice(topic_lists.FOODS)
    frames = topic_lists.split("""How do you make {f}?|Are {f} healthy?|What goes well with {f}?|Where do {f} come from?|
Is it okay to eat {f} every day?|What's a good recipe with {f}?|Why do people like {f}?|How should I store {f}?""")
    first = _t(rng.choice(frames).format(f=f))
    return first, [lambda r: _t(r.choice(frames).format(f=r.choice(topic_lists.FOODS))),
                   lambda r: _t(r.choice(topic_lists.split("Is that easy to make?|What's a healthier option?|Can kids eat that?")))], "explain"


def _explain_object(rng):
    o = rng.choice(topic_lists.OBJECTS)
    frames = topic_lists.split("""What is {a} used for?|How does {a} work?|Who invented the {o}?|How do I choose a good {o}?|
What did people use before the {o}?|Why is the {o} useful?|How do I take care of my {o}?|Explain how {a} works in simple words.""")
    first = _t(rng.choice(frames).format(a=article(o), o=o))
    return first, [lambda r: _t(r.choice(frames).format(a=article(o2 := r.choice(topic_lists.OBJECTS)), o=o2))], "explain"


def _place(rng):
    p = rng.choice(topic_lists.PLACES)
    frames = topic_lists.split("""What can I do at {p}?|What should I bring to {p}?|Describe {p} in three sentences.|
What is it like to live near {p}?|Is {p} a good place for a day out?|What is the best time of day to go to {p}?""")
    return _t(rng.choice(frames).format(p=p)), [lambda r: _t(r.choice(frames).format(p=r.choice(topic_lists.PLACES)))], "explain"


def _hobby(rng):
    pool = topic_lists.HOBBIES + topic_lists.SPORTS + ["playing the " + i for i in topic_lists.INSTRUMENTS] + ["studying " + s for s in topic_lists.SUBJECTS]
    h = rng.choice(pool)
    frames = topic_lists.split("""How do I get started with {h}?|Is {h} hard to learn?|What are the benefits of {h}?|
Why do people enjoy {h}?|What equipment do I need for {h}?|How can I get better at {h}?|Is {h} a good hobby for kids?|
How much time should I spend on {h} each week?""")
    return _t(rng.choice(frames).format(h=h)), [lambda r: _t(r.choice(frames).format(h=r.choice(pool)))], "advice"


def _compare(rng):
    cat = rng.choice([topic_lists.ANIMALS, topic_lists.FOODS, topic_lists.OBJECTS, topic_lists.SPORTS, topic_lists.INSTRUMENTS, topic_lists.SUBJECTS, topic_lists.HOBBIES])
    x, y = rng.sample(cat, 2)
    frames = topic_lists.split("""What's the difference between {x} and {y}?|Which is better, {x} or {y}?|
How are {x} and {y} alike?|{X} or {y}: which would you pick, and why?|Compare {x} and {y} in two sentences.""")
    text = rng.choice(frames).format(x=x, y=y, X=x[0].upper() + x[1:])
    more = topic_lists.split("""Which one do you prefer?|What do they have in common?|Which one is cheaper?|
Which is easier for a beginner?|Which one would a child like more?|Is one of them healthier?|Which is older?|
Which one is more popular?|Can you give one example of each?|Which would you choose for a gift?""")
    return _t(text), [lambda r: _t(r.choice(more)),
                      lambda r: _t(r.choice(topic_lists.split("What about {y}?|And how does {y} compare?")).format(y=r.choice(cat)))], "compare"


def _define(rng):
    w = rng.choice(topic_words())
    frames = topic_lists.split("""What does the word "{w}" mean?|Define "{w}".|What is the meaning of "{w}"?|
Can you use the word "{w}" in a sentence?|What's a synonym for "{w}"?|Explain the word "{w}" to a child.""")
    return _t(rng.choice(frames).format(w=w)), [lambda r: _t(r.choice(topic_lists.split(
        "Can you use it in a sentence?|What is the opposite?|Give me a synonym.|Where does the word come from?")))], "define"


def _opinion(rng):
    a, b = rng.sample(topic_lists.PLACES, 2)
    frames = [f"Would you rather visit {a} or {b}?", f"Do you like {rng.choice(topic_lists.FOODS)}?",
              f"What do you think about {rng.choice(topic_lists.HOBBIES)}?", f"Is {rng.choice(topic_lists.SPORTS)} fun to watch?",
              f"What's better for a rainy day: {rng.choice(topic_lists.HOBBIES)} or {rng.choice(topic_lists.HOBBIES)}?",
              f"Would a {rng.choice(topic_lists.ANIMALS)} make a good pet?",
              f"Which is more useful, {article(rng.choice(topic_lists.OBJECTS))} or {article(rng.choice(topic_lists.OBJECTS))}?"]
    return _t(rng.choice(frames)), [lambda r: _t(r.choice(topic_lists.split("Why do you think so?|What would change your mind?|"
                                                                   "Interesting! And what about me?")))], "opinion"


def _creative(rng):
    any_ = rng.choice([article(rng.choice(topic_lists.ANIMALS)), rng.choice(topic_lists.FOODS), article(rng.choice(topic_lists.OBJECTS)),
                       rng.choice(topic_lists.PLACES), rng.choice(topic_words())])
    frames = topic_lists.split("""Write a haiku about {x}.|Write a two-line poem about {x}.|Tell me a joke about {x}.|
Describe {x} in three words.|Write one sentence that makes {x} sound exciting.|Give me a fun name for a {a}.|
Tell me a very short story about a {a} who loves {h}.|Write a riddle about {x}.""")
    text = rng.choice(frames).format(x=any_, a=rng.choice(topic_lists.ANIMALS), h=rng.choice(topic_lists.HOBBIES))
    return _t(text), [lambda r: _t(r.choice(topic_lists.split("Make it funnier.|Now make it rhyme.|Can you write another one?|"
                                                    "Give it a title.|Make it shorter, please.")))], "creative"


def _advice(rng):
    trait, task = rng.choice(topic_lists.TRAITS), rng.choice(topic_lists.TASKS)
    frames = [f"How can I be more {trait}?", f"My friend wants to {task}. What should I tell them?",
              f"I'm nervous about {rng.choice(SITUATIONS)}. Any advice?",
              f"What's a good way to spend a free afternoon {rng.choice(WHEN)}?",
              f"How do I stay motivated to keep {rng.choice(topic_lists.HOBBIES)}?",
              f"What should I do if I can't {task}?"]
    return _t(rng.choice(frames)), [lambda r: _t(r.choice(topic_lists.split("What if that doesn't work?|What should I do first?|"
                                                                   "How long will it take?|Any other advice?")))], "advice"


WHEN = topic_lists.split("in winter|in summer|on a rainy day|with kids|alone|with friends|on a budget|in a small town|at home")
SITUATIONS = topic_lists.split("""my exams|a new job|moving to a new city|my presentation tomorrow|my first day at school|
a job interview|my driving test|meeting new people|a long flight|speaking in class|a doctor's appointment|a big game""")


def _chitchat(rng, openings):
    return _t(rng.choice(openings)), [], "chitchat"


def _pool(rng, pool):
    return _t(rng.choice(pool)), [], "self-instruct"


KIND_WEIGHTS = {
    "country": 0.08, "animal_fact": 0.05, "colour": 0.03, "opposite": 0.03, "arithmetic": 0.05, "calendar": 0.03,
    "memory": 0.06, "animal": 0.05, "howto": 0.06, "job": 0.05, "food": 0.05, "object": 0.05, "place": 0.03,
    "hobby": 0.05, "compare": 0.05, "define": 0.04, "opinion": 0.03, "creative": 0.05, "advice": 0.04,
    "chitchat": 0.06, "self-instruct": 0.06,
}
MAKERS = {"country": _country, "animal_fact": _animal_fact, "colour": _colour, "opposite": _opposite,
          "arithmetic": _arithmetic, "calendar": _calendar, "memory": _memory, "animal": _animal_open,
          "howto": _howto, "job": _job, "food": _food, "object": _explain_object, "place": _place, "hobby": _hobby,
          "compare": _compare, "define": _define, "opinion": _opinion, "creative": _creative, "advice": _advice,
          "creator": _creator}
# v3 (issue #32: the v2 data held each capital about once, so the student could not learn any): twice the checkable
# facts and memory, the openings and advice kinds trimmed to make room, countries drawn by popularity.
KIND_WEIGHTS_V3 = {
    "country": 0.16, "animal_fact": 0.08, "colour": 0.04, "opposite": 0.05, "arithmetic": 0.06, "calendar": 0.05,
    "memory": 0.08, "animal": 0.03, "howto": 0.04, "job": 0.03, "food": 0.03, "object": 0.03, "place": 0.02,
    "hobby": 0.03, "compare": 0.03, "define": 0.04, "opinion": 0.03, "creative": 0.04, "advice": 0.03,
    "chitchat": 0.05, "self-instruct": 0.05,
}
# name -> (kind weights, popular countries, share of later turns that change the subject). v4 (issue #32: the
# student answered "Who wrote Hamlet?" after two capitals with another capital): v3, and a fifth of the later turns
# ask the opening question of another kind, whose own follow-ups come after it.
# v5 (the student made up a capital for "Who wrote Hamlet?": no plan asked who made something): v4 with a kind
# asking who wrote, painted, invented, discovered or composed a famous work, its share taken from countries/animals.
KIND_WEIGHTS_V5 = {**KIND_WEIGHTS_V3, "country": 0.13, "animal_fact": 0.06, "creator": 0.05}
MIXES = {"v2": (KIND_WEIGHTS, False, 0.0), "v3": (KIND_WEIGHTS_V3, True, 0.0), "v4": (KIND_WEIGHTS_V3, True, 0.2),
         "v5": (KIND_WEIGHTS_V5, True, 0.2)}
TURN_WEIGHTS = {1: 0.2, 2: 0.35, 3: 0.27, 4: 0.18}


def make_plan(rng: random.Random, openings=(), pool=(), mix: str = "v2") -> Plan:
    weights, popular, switch = MIXES[mix]
    kinds = [k for k in weights if (k != "chitchat" or openings) and (k != "self-instruct" or pool)]
    kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
    if kind == "chitchat":
        first, makers, label = _chitchat(rng, openings)
    elif kind == "self-instruct":
        first, makers, label = _pool(rng, pool)
    else:
        made = _country(rng, popular) if kind == "country" else MAKERS[kind](rng)
        if made is None:                     # an optional package is missing: another kind
            return make_plan(rng, (), pool, mix)
        first, makers, label = made
    n = rng.choices(list(TURN_WEIGHTS), weights=list(TURN_WEIGHTS.values()))[0]
    if label == "memory":
        n = 2 if n <= 2 else 3 if n == 3 else 3
    turns, now = [first], kind                 # now: the kind the chat is on (a change of subject moves it)
    while len(turns) < n:
        if label == "memory":            # the recall question comes last; a detail follow-up may come before it
            turns.append(Turn("", dynamic="detail") if len(turns) < n - 1 else makers[0](rng))
            continue
        if switch and rng.random() < switch:          # drawn only in mixes that switch: v2 / v3 streams unchanged
            # another of the mix's own kinds (so v4 never asks v5's creator questions); a memory opening only
            # makes sense first
            other = rng.choice([k for k in MAKERS if k in weights and k not in ("memory", now)])
            made = _country(rng, popular) if other == "country" else MAKERS[other](rng)
            if made is not None:
                turns.append(made[0])
                now, makers = other, made[1]         # its follow-ups ("the same about ...") from here on
                continue
        r = rng.random()
        turn = None
        if r < 0.35:
            turn = Turn("", dynamic="detail")
        elif r < 0.75 and makers:
            turn = rng.choice(makers)(rng)
        if turn is None:
            turn = _generic(rng)
        if turn.text and turn.text == turns[-1].text:
            continue
        turns.append(turn)
    source = "chitchat-dataset" if label == "chitchat" else "self-instruct" if label == "self-instruct" else "template"
    return Plan(label if label != "fact" else f"fact-{kind}", tuple(turns), source)


def plan_stream(seed: int, use_chitchat: bool = True, pool_path: str | None = None,
                mix: str = "v2") -> Iterator[Plan]:
    """An endless, deterministic stream of plans of one mix (MIXES: v2, v3's facts-heavy one, or v4: v3 with changes
    of subject)."""
    openings = chitchat_pool()[0] if use_chitchat else ()
    pool = question_pool(pool_path)
    rng = random.Random(seed)
    while True:
        yield make_plan(rng, openings, pool, mix)
