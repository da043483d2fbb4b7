"""``python -m tinychat.training questions``: the teacher writes user questions for sampled topics (self-instruct).

Topics are drawn from the v2 entity lists and wordfreq's common words (:mod:`tinychat.training.questions`); the
teacher is asked for one question a curious person might ask about each, sampled at temperature 0.9. A question is
kept when it is one line of 4-20 words ending in "?", ASCII, mentions its topic, and is not already in the pool
(compared lower-cased, punctuation dropped). The pool is written atomically as gzipped JSON lines
(``{"question", "topic"}``) and grows when the command runs again (existing questions are read back first);
``generate --prompts v2 --questions POOL`` mixes it into the openings.

    python -m tinychat.training questions --out data/questions/pool-7.jsonl.gz --target 30000 --seed 7
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import re
import time
from pathlib import Path

from . import topic_lists

INSTRUCTIONS = ["Write one short question that a curious person might ask about {t}. Write only the question.",
                "Ask me one interesting question about {t}. Only the question, please.",
                "What is a good question someone could ask a helpful assistant about {t}? Reply with the question only.",
                "Write a question a student might ask about {t}. Just the question."]
_BAD_START = re.compile(r"^(sure|here|certainly|question|q:|of course|absolutely|great)\b", re.I)


def topics(rng: random.Random) -> str:
    from .entities import countries, jobs, topic_words
    pools = [topic_lists.ANIMALS, topic_lists.FOODS, topic_lists.OBJECTS, topic_lists.PLACES, topic_lists.HOBBIES, topic_lists.SPORTS, topic_lists.INSTRUMENTS, topic_lists.SUBJECTS,
             list(jobs()), [c["name"] for c in countries()], list(topic_words())]
    weights = [1, 1, 1, 1, 1, 0.5, 0.5, 0.5, 1, 1, 4]
    return rng.choice(rng.choices(pools, weights=weights)[0])


def key(q: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", q.lower()))


_QUOTED = re.compile(r'^[^"?]{0,80}[:,]\s*"([^"]+\?)"?\s*$')
_META = re.compile(r"\b(good question|helpful assistant|curious person|a student|ask me|answer with|"
                   r"question about|you'?ve ever|interesting question)\b", re.I)


def keep_question(text: str, topic: str) -> str | None:
    """The cleaned question, or None when the reply is not one good question about the topic. A question the
    teacher introduced ('A student might ask: "What is ...?"') is taken from its quotes."""
    t = text.strip()
    m = _QUOTED.match(t)
    if m:
        t = m.group(1)
    t = t.strip().strip('"').strip()
    if _META.search(t):
        return None
    if "\n" in t or not t.endswith("?") or not t.isascii() or _BAD_START.match(t):
        return None
    if t.count("?") > 1 or not 4 <= len(t.split()) <= 20:
        return None
    stem = topic.lower()[:max(4, len(topic) - 2)]
    if stem not in t.lower():
        return None
    return t[0].upper() + t[1:]


class Ask:
    """A one-turn driver: one instruction, one reply."""

    def __init__(self, topic: str, instruction: str, tok):
        from .teacher import chatml
        self.topic, self.tok, self.reply = topic, tok, None
        self._prompt = tok.encode(chatml([{"role": "user", "content": instruction.format(t=topic)}])).ids

    def first_prompt(self):
        return self._prompt

    def on_reply(self, ids, stopped, room):
        self.reply = self.tok.decode(ids, skip_special_tokens=True) if stopped else None
        return None


def read_pool(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_pool(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        for it in items:
            gz.write((json.dumps(it, ensure_ascii=False) + "\n").encode())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the pool file (.jsonl.gz); grown if it exists")
    p.add_argument("--target", type=int, default=20000, help="stop when the pool holds this many questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--flush-every", type=int, default=500, help="write the pool after this many new questions")


def run(args, model=None, tok=None, log=print) -> int:
    import torch

    from .batched import BatchedGenerator, Sampling
    from .teacher import IM_END, Llama, load_teacher, tokenizer_from_gguf

    pool = read_pool(args.out)
    seen = {key(it["question"]) for it in pool}
    if len(pool) >= args.target:
        log(f"{args.out} already holds {len(pool):,} questions")
        return 0
    if model is None:
        torch.set_num_threads(args.threads)
        cfg, weights, reader = load_teacher()
        tok = tokenizer_from_gguf(reader)
        model = Llama(cfg, weights, max_len=256)
        del weights
    rng = random.Random(args.seed * 1_000_003 + len(pool))          # a resumed run draws new topics

    def asks():
        while True:
            yield Ask(topics(rng), rng.choice(INSTRUCTIONS), tok)
    gen = BatchedGenerator(model, args.batch, Sampling(args.temperature, 0.95, 40, 40), tok.token_to_id(IM_END),
                           [], args.seed + len(pool))
    new, asked, t0 = 0, 0, time.time()
    for d in gen.run(asks()):
        asked += 1
        q = keep_question(d.reply, d.topic) if d.reply else None
        if q and key(q) not in seen:
            seen.add(key(q))
            pool.append({"question": q, "topic": d.topic})
            new += 1
            if new % args.flush_every == 0 or len(pool) >= args.target:
                write_pool(args.out, pool)
                log(f"{time.strftime('%H:%M:%S')} {len(pool):,} questions ({new:,} new of {asked:,} asked, "
                    f"{new / max(asked, 1):.0%} kept, {time.time() - t0:,.0f}s)")
            if len(pool) >= args.target:
                break
    write_pool(args.out, pool)
    return 0
