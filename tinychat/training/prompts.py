"""Conversation plans for the teacher: what the simulated user says, turn by turn.

A :class:`Plan` is 2-4 user messages. The first one opens the conversation; later ones are
follow-ups that only make sense with the history ("Can you say more?", "Why?", "Now make it
rhyme.", "What about cats?"), so the student has to learn to use the context.

Sources, mixed by :data:`KIND_WEIGHTS`:

* ``chitchat``: real human openings and self-contained questions from the chitchat-dataset
  (BYU PCC lab, MIT licence; the PyPI package ``chitchat-dataset`` ships ``dataset.json``). Optional:
  without the package the other kinds take its share.
* everything else: our own topic lists and templates (questions, explanations, advice, short poems
  and stories, lists of ideas, comparisons, definitions, everyday chit-chat).

Everything is deterministic given the seed (and whether chitchat-dataset is installed).
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Plan:
    kind: str
    turns: tuple[str, ...]   # user messages, in order
    source: str              # "chitchat-dataset" or "template"


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split("|") if x.strip()]


# ----------------------------------------------------------------------------------------------
# Topic lists (plain data; "|"-separated to keep the file short)
# ----------------------------------------------------------------------------------------------

CONCEPTS = _split("""
gravity|photosynthesis|the water cycle|electricity|magnetism|evolution|inflation|interest rates|
the internet|computer viruses|black holes|the moon's phases|the seasons|rainbows|thunder and lightning|
earthquakes|volcanoes|tides|the immune system|vaccines|DNA|the heart|sleep|dreams|memory|
climate change|recycling|solar power|wind energy|batteries|gravity on the moon|friction|sound|light|
the speed of light|atoms|molecules|chemical reactions|rust|fire|ice|clouds|weather forecasts|
democracy|taxes|a budget|credit scores|the stock market|supply and demand|a bank account|
machine learning|a programming language|an algorithm|encryption|passwords|Wi-Fi|GPS|a search engine|
email|smartphones|microwave ovens|refrigerators|flight|bicycles|car engines|
the pyramids of Egypt|the Roman Empire|the printing press|the Industrial Revolution|the Olympic Games|
music notes|rhythm|perspective in drawing|the alphabet|grammar|metaphors|poetry|a haiku|
bees making honey|bird migration|hibernation|camouflage|the food chain|dinosaurs|fossils|coral reefs|
ocean currents|deserts|rainforests|mountains|rivers|the solar system|stars|the sun|comets|satellites
""")

QUESTIONS = _split("""
What is the capital of France?|Why is the sky blue?|How many days are in a leap year?|
Why do cats purr?|How do plants grow?|What makes a rainbow?|Why do we need sleep?|
How far away is the moon?|What is the biggest animal in the world?|Why is the ocean salty?|
How do airplanes stay in the air?|What do bees do?|Why do leaves change color in autumn?|
How does a compass work?|What is the tallest mountain in the world?|Why do we have seasons?|
How do fish breathe underwater?|What is the fastest land animal?|Why do onions make you cry?|
How long does it take to boil an egg?|What is the largest planet in our solar system?|
Why do dogs wag their tails?|How does the heart pump blood?|What causes the wind?|
Why is exercise good for you?|What is a healthy breakfast?|How many legs does a spider have?|
Why do stars twinkle?|What is the difference between weather and climate?|How are clouds made?|
Why does ice float?|How do birds know where to fly in winter?|What language is spoken in Brazil?|
What is the boiling point of water?|How do vaccines work?|Why do we yawn?|What is a noun?|
How does the internet work?|What is the smallest country in the world?|Why do we dream?|
What do pandas eat?|How do you make a paper airplane?|Why is the grass green?|
How much water should I drink a day?|What is the longest river in the world?|How do magnets work?|
What is a volcano?|Why do we get hiccups?|How many continents are there?|Who invented the telephone?|
What is the sun made of?|How do I tie a tie?|What is a good name for a puppy?|Why is reading important?
""")

GOALS = _split("""
sleep better|wake up earlier|stay focused while studying|learn a new language|save money|
make new friends|be more productive|stop procrastinating|eat healthier|start running|
drink more water|reduce stress|prepare for a job interview|speak in public without fear|
keep my room tidy|learn to cook|learn to play the guitar|read more books|write better essays|
remember things better|get along with my roommate|manage my time|start a small garden|
take care of a houseplant|train my dog|keep my cat entertained|plan a birthday party|
plan a trip on a budget|pack for a weekend trip|stay motivated to exercise|spend less time on my phone|
be more confident|deal with a difficult coworker|ask for a raise|learn to draw|make a good first impression|
cheer up a friend|apologize to a friend|stay calm before an exam|learn to code|choose a good book|
cook a simple dinner|bake bread|make a cup of good coffee|start journaling|keep a budget|
learn to swim|get better at chess|be a better listener|say no politely|make my mornings less rushed
""")

FEELINGS = _split("""nervous|bored|tired|stressed|lonely|excited|sad|overwhelmed|unmotivated|anxious|
happy|confused|frustrated|homesick|worried""")

SITUATIONS = _split("""my exams|a new job|moving to a new city|my presentation tomorrow|a long week|
my first day at school|a fight with my friend|the weekend|starting university|learning to drive|
my birthday|a job interview|the holidays|a rainy day|working from home""")

SUBJECTS = _split("""
the sea|the moon|autumn leaves|a rainy day|a cup of coffee|a lazy cat|a loyal dog|the city at night|
friendship|the first snow|a summer morning|the stars|a mountain|a river|an old tree|spring flowers|
the wind|a lighthouse|a train journey|home|the sunrise|the sunset|a garden|a butterfly|the ocean waves|
a snowman|a candle|books|music|a quiet library|a busy market|the forest|a little bird|the rain|
a cozy winter evening|a birthday|a bicycle ride|the desert|a thunderstorm|the beach|a kite|an owl
""")

CHARACTERS = _split("""a brave mouse|a lonely robot|a curious cat|a little dragon|a young wizard|
an old fisherman|a clever fox|a shy girl|a lost puppy|a friendly giant|a tiny turtle|a baker|
a kind teacher|a space explorer|a talking tree|a penguin|a princess|a young inventor|a sleepy bear|
two best friends""")

EVENTS = _split("""finds a secret door|wants to fly|loses a favorite toy|makes a new friend|
goes on an adventure|learns to be brave|gets lost in the forest|finds a treasure map|
discovers a hidden garden|has a very strange day|wants to see the ocean|bakes a magic cake|
meets a dragon|builds a rocket|cannot fall asleep|helps a stranger""")

THINGS = _split("""book|movie|food|color|season|animal|song|hobby|place to travel|sport|dessert|
holiday|kind of music|game|fruit|subject at school|time of day|flower""")

PAIRS = _split("""cats and dogs|tea and coffee|the sun and the moon|a lake and a sea|weather and climate|
a virus and bacteria|a frog and a toad|a city and a town|speed and velocity|a fruit and a vegetable|
summer and winter|reading and listening to audiobooks|a laptop and a tablet|a crocodile and an alligator|
baking and frying|a poem and a song|renting and buying a home|running and walking|email and letters""")

WORDS = _split("""curious|brave|gentle|ancient|generous|patient|serendipity|nostalgia|resilient|
humble|vivid|empathy|ambition|harmony|courage|wisdom|gratitude|optimism|routine|habit""")

IDEA_TARGETS = _split("""a rainy weekend|a birthday gift for my mom|a science fair project|
a healthy snack|a name for my cat|a short trip|a family dinner|a picnic|things to do in the evening|
a new hobby|a school club|a fun game for kids|a small garden|a story title|a team name|
a quick lunch|a thank-you note|a date night|a board game night|a summer day""")

CHAT = _split("""Hi!|Hello there!|Hey, how are you?|Good morning!|How is your day going?|
Can you tell me a joke?|Tell me something interesting.|I'm bored. Any ideas?|What can you do?|
What do you like to talk about?|Tell me a fun fact.|Can you help me?|I had a great day today!|
I'm feeling a bit down today.|What should I cook tonight?|Do you like music?|Let's play a game.|
Can you recommend a good book?|What's a good movie to watch tonight?|Good night!|
Guess what? I got a new puppy!|I just finished my exams!|It's raining again here.|
I can't decide what to do this weekend.|What's the best way to start the day?""")

# ----------------------------------------------------------------------------------------------
# Openings and follow-ups per kind (templates; {x} etc. filled from the lists above)
# ----------------------------------------------------------------------------------------------

GENERIC_FOLLOWUPS = _split("""Can you say more?|Why?|Can you give me an example?|Thanks! Anything else?|
Can you explain that more simply?|Interesting. Tell me more.|Can you make it shorter?|How so?|
What else should I know?|Thank you!|Really? Why is that?|
Can you sum that up in one sentence?|Okay, and then what?|Cool! What else?""")

KIND_FOLLOWUPS = {
    "question": _split("""Why is that?|How do we know that?|Can you explain it to a child?|
Is that always true?|What is a fun fact about it?|Can you explain it in one sentence?"""),
    "explain": _split("""Can you give an everyday example?|Why does that matter?|
How is it used in real life?|Explain it like I'm five.|What is a common mistake people make about it?|
Who discovered it?"""),
    "advice": _split("""What if that doesn't work?|How long will it take?|What should I do first?|
Can you give me three quick tips?|What's the most important tip?|Do you have any other advice?|
How do I stay consistent?|That's helpful. What's the next step?"""),
    "poem": _split("""Now make it rhyme.|Can you make it funnier?|Can you write another one?|
Make it shorter, please.|Can you give it a title?|Now write one about the night.|
What is the poem about?"""),
    "story": _split("""What happens next?|Can you give it a happy ending?|Make it funnier.|
What is the lesson of the story?|Can you give the main character a name?|Tell me another one.|
Can you make it shorter?"""),
    "ideas": _split("""Which one is the best?|Can you give me more ideas?|Tell me more about the first one.|
Which one is the cheapest?|Which one is easiest?"""),
    "compare": _split("""Which one is better?|Which one do you prefer?|What do they have in common?|
Can you give an example of each?"""),
    "define": _split("""Can you use it in a sentence?|What is the opposite?|Give me a synonym.|
Can you use it in another sentence?"""),
    "chat": _split("""What about you?|Haha, tell me another one.|Why do you say that?|
Any other ideas?|That sounds fun!|What do you think I should do?|Can you tell me a joke?"""),
    "chitchat": _split("""What about you?|Why do you think so?|That's cool. What else do you like?|
Haha. Tell me more.|What do you think?|How about you?"""),
}

TOPIC_FOLLOWUPS = {  # follow-ups that re-use another topic from the same list: "What about {y}?"
    "explain": _split("""What about {y}?|How is that different from {y}?|Now explain {y}."""),
    "advice": _split("""And how can I {y}?|What about when I want to {y}?"""),
    "poem": _split("""Now write one about {y}.|Can you write a haiku about {y}?"""),
    "story": _split("""Now tell me one about {y}.|What if the hero was {y}?"""),
    "define": _split("""What does "{y}" mean?|And "{y}"?"""),
    "compare": _split("""What about {y}?"""),
}


def _openings(kind: str, rng: random.Random) -> tuple[str, list[str] | None]:
    """(first message, the topic list used for "{y}" follow-ups)."""
    c = rng.choice
    if kind == "question":
        return c(QUESTIONS), None
    if kind == "explain":
        x = c(CONCEPTS)
        t = c(_split("""What is {x}?|Can you explain {x}?|Explain {x} in simple terms.|
Tell me about {x}.|Can you tell me how {x} works in simple words?|Why is {x} important?|I never understood {x}. Can you help?|
What should I know about {x}?|Explain {x} in two sentences."""))
        return t.format(x=x), CONCEPTS
    if kind == "advice":
        r = rng.random()
        if r < 0.7:
            t = c(_split("""How can I {x}?|Any tips to {x}?|I want to {x}. Where do I start?|
What's the best way to {x}?|Can you help me {x}?|Give me some advice: I want to {x}.|
What are some easy ways to {x}?"""))
            return t.format(x=c(GOALS)), GOALS
        t = c(_split("""I'm feeling {f} about {s}. What should I do?|I feel {f} because of {s}.|
Any advice? I'm {f} about {s}.|How do I stop feeling {f} about {s}?"""))
        return t.format(f=c(FEELINGS), s=c(SITUATIONS)), None
    if kind == "poem":
        t = c(_split("""Write a short poem about {x}.|Write a haiku about {x}.|
Can you write a four-line poem about {x}?|Write a funny poem about {x}.|
Write a rhyming poem about {x}.|I'd love a little poem about {x}."""))
        return t.format(x=c(SUBJECTS)), SUBJECTS
    if kind == "story":
        t = c(_split("""Tell me a short story about {a} who {e}.|Write a very short story about {a}.|
Can you tell me a bedtime story about {a} who {e}?|Write a story in five sentences about {a} who {e}.|
Tell me a story about {a}."""))
        return t.format(a=c(CHARACTERS), e=c(EVENTS)), CHARACTERS
    if kind == "ideas":
        t = c(_split("""Give me three ideas for {x}.|I need ideas for {x}.|What are some ideas for {x}?|
Can you suggest something for {x}?|List a few ideas for {x}."""))
        return t.format(x=c(IDEA_TARGETS)), None
    if kind == "compare":
        t = c(_split("""What is the difference between {x}?|Compare {x}.|
Which is better: {x}?|How are {x} different?"""))
        return t.format(x=c(PAIRS)), PAIRS
    if kind == "define":
        t = c(_split("""What does "{x}" mean?|Define the word "{x}".|What is the meaning of "{x}"?|
Can you use the word "{x}" in a sentence?"""))
        return t.format(x=c(WORDS)), WORDS
    if kind == "favorite":
        t = c(_split("""What's your favorite {x}?|What is a good {x}?|Can you recommend a {x}?|
Tell me about a {x} you like."""))
        return t.format(x=c(THINGS)), None
    return c(CHAT), None  # "chat"


# ----------------------------------------------------------------------------------------------
# chitchat-dataset
# ----------------------------------------------------------------------------------------------

_GREETING = re.compile(r"^(hi|hello|hey|good (morning|afternoon|evening)|howdy|yo|greetings)\b", re.I)
_QSTART = re.compile(r"^(what|how|do you|have you|are you|where|which|who|why|would you|if you could|"
                     r"is there|can you|did you|what's|whats|when)\b", re.I)
_BAD = re.compile(r"\b(prompt|chit ?chat|chat|partner|the question|this question|lol|lmao|omg|glitch\w*|"
                  r"anyone|anybody|someone there|connect\w*|ok,? goodbye|bye|who is this)\b|\\\\", re.I)
_PRONOUN = re.compile(r"\b(that|it|this|those|them|they|he|she|him|her)\b", re.I)


def _clean(t: str) -> str:
    return re.sub(r"\s+", " ", t).strip()


def _ok_text(t: str) -> bool:
    return t.isascii() and any(ch.isalpha() for ch in t) and not _BAD.search(t)


@functools.lru_cache(maxsize=2)
def chitchat_pool(path: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(openings, follow-up questions) from chitchat-dataset; empty tuples when not installed.

    Openings: the first speaker's first message (their utterances joined), kept when it is a
    greeting (deduplicated, so 587 x "hello?" counts once), a question of >= 3 words, or a
    statement of 5-40 words starting with "I"/"My"/"Today" (others answer an unseen prompt).
    Follow-ups: self-contained questions (4-14 words, starting with a wh-word or "do you" etc.,
    no pronoun that points back into the human conversation).
    """
    if path is None:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("chitchat_dataset")
        if spec is None or not spec.submodule_search_locations:
            return (), ()
        path = str(Path(list(spec.submodule_search_locations)[0]) / "dataset.json")
    with open(path) as f:
        data = json.load(f)
    openings, followups, seen = [], [], set()
    for key in sorted(data):
        msgs = data[key]["messages"]
        if not msgs:
            continue
        first = _clean(" ".join(u["text"] for u in msgs[0]))
        words = first.split()
        low = first.lower()
        keep = _ok_text(first) and low not in seen and (
            (_GREETING.match(first) and len(words) <= 8)
            or ("?" in first and 3 <= len(words) <= 30)
            or (5 <= len(words) <= 40 and re.match(r"^(i|i'm|my|today)\b", low)))
        if keep:
            seen.add(low)
            openings.append(first)
        for m in msgs[1:]:
            for u in m:
                t = _clean(u["text"])
                if (t.endswith("?") and 4 <= len(t.split()) <= 14 and _QSTART.match(t)
                        and _ok_text(t) and not _PRONOUN.search(t) and t.lower() not in seen):
                    seen.add(t.lower())
                    followups.append(t[0].upper() + t[1:])
    return tuple(openings), tuple(followups)


# ----------------------------------------------------------------------------------------------
# Plans
# ----------------------------------------------------------------------------------------------

KIND_WEIGHTS = {
    "chitchat": 0.22, "chat": 0.08, "question": 0.14, "explain": 0.12, "advice": 0.13,
    "poem": 0.07, "story": 0.07, "ideas": 0.06, "compare": 0.04, "define": 0.03, "favorite": 0.04,
}
TURN_WEIGHTS = {2: 0.45, 3: 0.35, 4: 0.20}   # user turns per conversation


CHAT_GENERIC = _split("""Why?|Can you say more?|Interesting. Tell me more.|How so?|Really? Why is that?|
Thank you!|Cool! What else?""")


def _followup(kind: str, topics: list[str] | None, rng: random.Random, pool: tuple[str, ...]) -> str:
    r = rng.random()
    if kind == "chitchat" and pool and r < 0.5:
        return rng.choice(pool)
    if kind in ("chat", "chitchat", "favorite") and r >= 0.65:
        return rng.choice(CHAT_GENERIC)
    if topics and kind in TOPIC_FOLLOWUPS and r < 0.3:
        return rng.choice(TOPIC_FOLLOWUPS[kind]).format(y=rng.choice(topics))
    if r < 0.65 and kind in KIND_FOLLOWUPS:
        return rng.choice(KIND_FOLLOWUPS[kind])
    return rng.choice(GENERIC_FOLLOWUPS)


def make_plan(rng: random.Random, openings=(), followups=()) -> Plan:
    kinds = [k for k in KIND_WEIGHTS if k != "chitchat" or openings]
    kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
    n = rng.choices(list(TURN_WEIGHTS), weights=list(TURN_WEIGHTS.values()))[0]
    if kind == "chitchat":
        first, topics = rng.choice(openings), None
    else:
        first, topics = _openings(kind, rng)
    turns = [first]
    while len(turns) < n:
        f = _followup(kind, topics, rng, followups)
        if f != turns[-1]:
            turns.append(f)
    return Plan(kind, tuple(turns), "chitchat-dataset" if kind == "chitchat" else "template")


def plan_stream(seed: int, use_chitchat: bool = True) -> Iterator[Plan]:
    """An endless, deterministic stream of plans."""
    openings, followups = chitchat_pool() if use_chitchat else ((), ())
    rng = random.Random(seed)
    while True:
        yield make_plan(rng, openings, followups)


def make_plans(n: int, seed: int, use_chitchat: bool = True) -> list[Plan]:
    it = plan_stream(seed, use_chitchat)
    return [next(it) for _ in range(n)]
