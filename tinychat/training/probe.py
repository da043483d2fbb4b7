"""``python -m tinychat.training probe``: does the model answer the question that was asked?

A probe is a short conversation (one to three user messages) whose last reply must contain one of its answers
(whole word, any case): capitals, continents, an animal's legs, sound or young, colours, opposites, small sums, the
day or month that follows, counts, and what the user said earlier (a name, a colour).

Held out from training by construction (tinychat.training.questions): the probe's question frames ("Tell me the
capital of Japan.") are never used to make training data; its first names (memory probes) and operand pairs
(sums) never occur there at all. Knowledge probes ask about entities training covers, in words it never used.

    python -m tinychat.training probe --build --out data/probe.jsonl      # keep the candidates the teacher gets right
    python -m tinychat.training probe --model assets --probes data/probe.jsonl [--out runs/x/probe.json]
    python -m tinychat.training probe --teacher-switched     # the teacher on the probes after a change of subject

``--build`` runs the teacher greedily (its system prompt of the data) on every candidate and keeps those it
answers right; the file records each probe and the teacher's reply. Evaluation chats each probe through the real
runtime at the app's defaults (a fixed seed per probe) and, with ``--greedy``, at temperature 0 too; each also
after a change of subject (``switched``: the one-question probes asked as the second message of a chat whose first
was another category's question).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from . import topic_lists
from .dialogue import contains_answer
from .entities import countries, first_names
from .questions import article, held_out, plural

# Frames used only here: questions.py never writes these (tests/unit/test_training_probe.py checks it).
CAPITAL_FRAMES = ["Tell me the capital of {c}.", "Quick question: which city is the capital of {c}?"]
WELL_KNOWN = topic_lists.split("""Japan|France|Italy|Germany|Spain|Portugal|United Kingdom|Ireland|Norway|Sweden|Finland|
Denmark|Poland|Greece|Turkey|Egypt|Kenya|Nigeria|Morocco|South Africa|India|China|Russia|Canada|Mexico|Brazil|
Argentina|Peru|Chile|Colombia|Australia|New Zealand|Thailand|Vietnam|Indonesia|Philippines|South Korea|Iran|Iraq|
Israel|Saudi Arabia|Pakistan|Cuba|Austria|Switzerland|Belgium|Netherlands|Hungary|Ukraine|Venezuela""")


def candidates() -> list[dict]:
    """Every probe candidate: {"id", "category", "turns": [user messages], "answers": [...]}."""
    rng = random.Random(1234)
    out: list[dict] = []

    def add(cat, turns, answers):
        out.append({"id": f"{cat}-{sum(p['category'] == cat for p in out):03d}", "category": cat,
                    "turns": list(turns), "answers": [str(a) for a in answers]})

    by_name = {c["name"]: c for c in countries()}
    for i, name in enumerate(WELL_KNOWN):
        c = by_name.get(name)
        if c:
            add("capital", [CAPITAL_FRAMES[i % 2].format(c=name)], [c["capital"]])
    for name in WELL_KNOWN:
        c = by_name.get(name)
        if c and c["continent"]:
            add("continent", [f"In which continent would I find {name}?"], [c["continent"]])
    for a, n in list(sorted(topic_lists.ANIMAL_LEGS.items()))[::4]:
        add("legs", [f"Tell me how many legs {article(a)} has."], [n, topic_lists.NUMBER_WORDS[int(n)]])
    for a, s in sorted(topic_lists.ANIMAL_SOUNDS.items())[::2]:
        add("sound", [f"Which sound does {article(a)} make?"], [s, s + "s", s + "ing", s + "es"])
    for a, b in sorted(topic_lists.BABY_ANIMALS.items())[::2]:
        add("young", [f"Tell me what a young {a} is called."], [b, plural(b)])
    for x, col in sorted(topic_lists.COLOURS_OF.items())[::2]:
        add("colour", [f"Tell me the color of {x}."], [col])
    for w, o in sorted(topic_lists.OPPOSITES.items())[::2]:
        add("opposite", [f"Which word means the opposite of {w}?"], [o])
    sums = [(a, b) for a in range(1, 20) for b in range(1, 20) if held_out(f"{a}+{b}", "sum")]
    for a, b in rng.sample(sums, min(30, len(sums))):
        add("sum", [rng.choice(["Please compute {a} + {b}.", "Tell me what {a} plus {b} equals."]).format(a=a, b=b)],
            [a + b] + ([topic_lists.NUMBER_WORDS[a + b]] if a + b < len(topic_lists.NUMBER_WORDS) else []))
    for i in range(7):
        add("next-day", [f"Tell me which day follows {topic_lists.WEEKDAYS[i]}."], [topic_lists.WEEKDAYS[(i + 1) % 7]])
    for i in range(0, 12, 2):
        add("next-month", [f"Tell me which month follows {topic_lists.MONTHS[i]}."], [topic_lists.MONTHS[(i + 1) % 12]])
    for q, a in [("Tell me how many days a week has.", ["7", "seven"]), ("Tell me how many months a year has.",
                 ["12", "twelve"]), ("Tell me how many legs a person has.", ["2", "two"]),
                 ("Tell me how many sides a square has.", ["4", "four"]),
                 ("Tell me how many wheels a car usually has.", ["4", "four"])]:
        add("count", [q], a)
    names = [n for n in first_names() if held_out(n, "name")]
    topics = ["Tell me a fun fact about " + plural(a) + "." for a in topic_lists.ANIMALS[:40]]
    for n in rng.sample(names, min(40, len(names))):   # (fewer without faker's names)
        add("name", [f"Hello! I am {n}. {rng.choice(topics)}", rng.choice(["Tell me my name.", "What name did I give you?"])],
            [n])
    for col in ["red", "blue", "green", "yellow", "purple", "orange"]:
        add("my-colour", [f"The color I like most is {col}. {rng.choice(topics)}", "Which color do I like most?"], [col])
    return out


def switched(probes: list[dict]) -> list[dict]:
    """Each one-question probe asked after an unrelated question: the first turn is the question of the probe half
    the file away (the first after it of another category, wrapping round), so the last reply must answer a change
    of subject ("Tell me the capital of Japan." after "Which sound does a cow make?") and every probe gets its own
    opener. Multi-turn probes are left out."""
    single = [p for p in probes if len(p["turns"]) == 1]
    n, out = len(single), []
    for i, p in enumerate(single):
        other = next((single[(i + n // 2 + k) % n] for k in range(n)
                      if single[(i + n // 2 + k) % n]["category"] != p["category"]), None)
        if other is not None:
            out.append({**p, "id": p["id"] + "+switch", "turns": [other["turns"][0], p["turns"][0]]})
    return out


def teacher_check(probes: list[dict], model=None, htok=None, max_new: int = 80, batch: int = 32) -> list[dict]:
    """The teacher's greedy replies (its data's system prompt); returns the probes it answered right, each with
    ``teacher_reply``."""
    from .batched import BatchedGenerator, Sampling
    from .generate import SYSTEM
    from .judge import FixedTurns
    from .teacher import IM_END, Llama, chatml, load_teacher, tokenizer_from_gguf

    if model is None:
        cfg, weights, reader = load_teacher()
        htok = tokenizer_from_gguf(reader)
        model = Llama(cfg, weights, max_len=1024)
        del weights
    drivers = [FixedTurns(p["turns"], htok, max_new) for p in probes]
    prefix = htok.encode(chatml([{"role": "system", "content": SYSTEM}], False)).ids
    gen = BatchedGenerator(model, min(batch, len(drivers)), Sampling(0.0, 1.0, 40, max_new),
                           htok.token_to_id(IM_END), prefix, 0)
    for _ in gen.run(drivers):
        pass
    kept = []
    for p, d in zip(probes, drivers):
        if len(d.turns) == len(p["turns"]) and contains_answer(d.turns[-1]["reply"], p["answers"]):
            kept.append({**p, "teacher_reply": d.turns[-1]["reply"]})
    return kept


def student_answers(model, tok, probes: list[dict], settings=None, seed: int = 0, max_new: int = 120) -> list[dict]:
    """Each probe chatted through the runtime (fresh chat; the app's defaults unless ``settings``)."""
    from .chatrun import chat_conversations
    convs = [[{"role": "user", "content": u} for u in p["turns"]] for p in probes]
    chats = chat_conversations(model, tok, convs, max_new=max_new, seed=seed, max_turns=4, settings=settings)
    return [{"id": p["id"], "category": p["category"], "reply": c["turns"][-1]["reply"],
             "right": contains_answer(c["turns"][-1]["reply"], p["answers"])} for p, c in zip(probes, chats)]


def accuracy(results: list[dict]) -> dict:
    n = Counter(r["category"] for r in results)
    right = Counter(r["category"] for r in results if r["right"])
    return {"accuracy": sum(right.values()) / max(len(results), 1), "probes": len(results),
            "by_category": {c: round(right[c] / n[c], 3) for c in sorted(n)}}


def read_probes(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build", action="store_true", help="run the teacher on the candidates; keep those it gets right")
    p.add_argument("--probes", type=Path, default=Path("data/probe.jsonl"), help="the probe file (--build writes it)")
    p.add_argument("--model", type=Path, default=None, help="a model folder to evaluate (e.g. assets)")
    p.add_argument("--greedy", action="store_true", help="also evaluate at temperature 0")
    p.add_argument("--teacher-switched", action="store_true",
                   help="the teacher's greedy accuracy on the probes asked after an unrelated question (switched())")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")


def run(args) -> int:
    import torch
    torch.set_num_threads(args.threads)
    if args.build:
        cands = candidates()
        kept = teacher_check(cands)
        tmp = args.probes.with_name(f".{args.probes.name}.tmp")
        tmp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in kept), encoding="utf-8")
        tmp.replace(args.probes)
        cats = Counter(p["category"] for p in kept)
        print(f"{len(kept)} of {len(cands)} candidates answered right by the teacher -> {args.probes} "
              f"({', '.join(f'{c} {n}' for c, n in sorted(cats.items()))})")
        if not args.model:
            return 0
    if args.teacher_switched:
        sw = switched(read_probes(args.probes))
        right = teacher_check(sw)
        print(f"teacher, after a change of subject: {len(right)} of {len(sw)} right ({len(right) / max(len(sw), 1):.1%})")
        if not args.model:
            return 0
    if not args.model:
        print("error: give --model FOLDER to evaluate, --build or --teacher-switched", file=sys.stderr)
        return 2
    from tinychat.model import TinyAgentLM
    from tinychat.settings import ChatSettings
    from tinychat.tokenizer import Tokenizer
    probes = read_probes(args.probes)
    model = TinyAgentLM.from_pretrained(args.model)
    tok = Tokenizer.from_file(args.model / "tokenizer.json")
    result = {"model": str(args.model), "probes": str(args.probes), "command": getattr(args, "command_line", None)}
    runs = [("defaults", None)] + ([("greedy", ChatSettings().with_value("temperature", "0"))] if args.greedy else [])
    for name, settings in runs:
        res = student_answers(model, tok, probes, settings=settings, seed=args.seed)
        acc = accuracy(res)
        result[name] = {**acc, "answers": res}
        print(f"{name}: {acc['accuracy']:.1%} of {acc['probes']} probes right ("
              + ", ".join(f"{c} {v:.0%}" for c, v in acc["by_category"].items()) + ")")
        res = student_answers(model, tok, switched(probes), settings=settings, seed=args.seed)
        acc = accuracy(res)
        result[name + "_switched"] = {**acc, "answers": res}
        print(f"{name}, after a change of subject: {acc['accuracy']:.1%} of {acc['probes']} right")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0
