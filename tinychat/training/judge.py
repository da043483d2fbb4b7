"""The teacher as judge: how likely the teacher finds the student's replies, next to its own.

``training eval --judge`` chats through held-out conversations with the student (the app's defaults), then:

- **student NLL**: the teacher (its tokenizer, its ChatML template, the system prompt it generated the data with)
  reads each conversation with the student's replies in place and scores the reply tokens (content and the closing
  ``<|im_end|>``) in context: nats per teacher token;
- **teacher NLL**: the teacher samples its own replies to the same user messages (same temperature, top-p and
  reply cap as the student; its own top-k 40), and the same scoring runs on them.

The ratio student / teacher is the honest figure: the teacher's own samples are not free of cost under it (sampling
at temperature > 0 picks tokens it finds less likely than its mode), and the ratio removes that floor.
Both sides also report the **loop rate**: the fraction of replies in which one word 4-gram occurs three or more
times (the degenerate repetition a user sees).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .textmetrics import assistant_bytes, loop_rate

LOOP_MAX = 0.02       # the bar: at most this fraction of replies loop


class FixedTurns:
    """A :class:`~tinychat.training.batched.BatchedGenerator` driver that feeds a conversation's user messages in
    turn and keeps the teacher's replies (none are dropped: the judge scores whatever the teacher said)."""

    def __init__(self, users: Sequence[str], tok, max_new: int):
        from .teacher import IM_END, chatml
        self.users, self.tok, self.max_new = list(users), tok, max_new
        self._chatml, self._im_end = chatml, IM_END
        self.turns: list[dict] = []

    def _user(self, i: int) -> str:
        return self._chatml([{"role": "user", "content": self.users[i]}])

    def first_prompt(self) -> list[int]:
        return self.tok.encode(self._user(0)).ids

    def on_reply(self, ids: list[int], stopped: bool, room: int) -> list[int] | None:
        i = len(self.turns)
        self.turns.append({"user": self.users[i], "reply": self.tok.decode(ids, skip_special_tokens=True).strip(),
                           "finish": "stop" if stopped else "length", "tokens": len(ids)})
        if i + 1 >= len(self.users):
            return None
        cont = self.tok.encode(self._im_end + "\n" + self._user(i + 1)).ids
        return cont if len(cont) + self.max_new <= room else None


def messages_of(chat: dict) -> list[dict]:
    """[{"turns": [{"user", "reply"}, ...]}] -> ChatML messages, the replies as assistant messages."""
    out: list[dict] = []
    for t in chat["turns"]:
        out += [{"role": "user", "content": t["user"]}, {"role": "assistant", "content": t["reply"]}]
    return out


def teacher_replies(user_turns: Sequence[Sequence[str]], model, htok, system: str, temperature: float, top_p: float,
                    max_new: int, seed: int = 0, batch: int = 16) -> list[dict]:
    """The teacher's own sampled replies to each conversation's user messages, in input order."""
    from .batched import BatchedGenerator, Sampling
    from .teacher import IM_END, chatml
    drivers = [FixedTurns(u, htok, max_new) for u in user_turns]
    prefix = htok.encode(chatml([{"role": "system", "content": system}], False)).ids if system else []
    gen = BatchedGenerator(model, min(batch, max(len(drivers), 1)), Sampling(temperature, top_p, 40, max_new),
                           htok.token_to_id(IM_END), prefix, seed)
    for _ in gen.run(drivers):
        pass
    return [{"turns": d.turns} for d in drivers]


def teacher_loss(conversations, system: str | None = None, model=None, htok=None, log=None) -> dict:
    """The teacher's loss on the same assistant text, with its own tokenizer and (by default) the system prompt
    it generated with. model/htok: a teacher `Llama` and its HF tokenizer (default: the real one, loaded)."""
    import torch
    import torch.nn.functional as F

    from .teacher import DEFAULT_SYSTEM as TEACHER_SYSTEM
    from .teacher import IM_END, IM_START, TEACHER_NAME
    system = TEACHER_SYSTEM if system is None else system
    name = TEACHER_NAME if model is None else "given teacher"
    if model is None:
        from .teacher import Llama, load_teacher, tokenizer_from_gguf
        cfg, weights, reader = load_teacher()
        htok = tokenizer_from_gguf(reader)
        model = Llama(cfg, weights, max_len=4096)
        del weights

    def enc(text):
        return htok.encode(text).ids
    nats, n = 0.0, 0
    by_turn = {"first": [0.0, 0], "later": [0.0, 0]}      # the first assistant reply, and every reply after it
    for ci, msgs in enumerate(conversations):
        ids, mask = [], []                                 # mask: 0 off, 1 the first reply, 2 a later one
        if system:
            part = enc(f"{IM_START}system\n{system}{IM_END}\n")
            ids += part
            mask += [0] * len(part)
        replies = 0
        for m in msgs:
            head, body, end = enc(f"{IM_START}{m['role']}\n"), enc(m["content"]), enc(f"{IM_END}\n")
            on = 0
            if m["role"] == "assistant":
                replies += 1
                on = 1 if replies == 1 else 2
            ids += head + body + end
            mask += [0] * len(head) + [on] * len(body) + [on] + [0] * (len(end) - 1)
        x = torch.tensor([ids])
        logits = model.forward_full(x[:, :-1]).float()[0]
        tgt, which = x[0, 1:], torch.tensor(mask[1:])
        loss = F.cross_entropy(logits, tgt, reduction="none")
        for key, v in (("first", 1), ("later", 2)):
            sel = which == v
            by_turn[key][0] += float(loss[sel].sum())
            by_turn[key][1] += int(sel.sum())
        msk = which > 0
        nats += float(loss[msk].sum())
        n += int(msk.sum())
        if log and (ci + 1) % 25 == 0:
            log(f"  teacher: {ci + 1}/{len(conversations)} conversations")
    b = assistant_bytes(conversations)
    return {"model": name, "system": system, "conversations": len(conversations), "target_tokens": n,
            "loss_per_token": nats / max(n, 1), "bits_per_byte": nats / math.log(2) / max(b, 1),
            "first_turn_loss": by_turn["first"][0] / max(by_turn["first"][1], 1),
            "later_turns_loss": by_turn["later"][0] / max(by_turn["later"][1], 1),
            "later_turn_tokens": by_turn["later"][1],
            "assistant_bytes": b}


def load_judge():
    """The real teacher as (Llama, tokenizer), loaded once for every seed an eval judges."""
    from .teacher import Llama, load_teacher, tokenizer_from_gguf
    cfg, weights, reader = load_teacher()
    return Llama(cfg, weights, max_len=2048), tokenizer_from_gguf(reader)


def judge(student_chats: Sequence[dict], system: str, temperature: float, top_p: float, max_new: int,
          seed: int = 0, teacher=None, log=None) -> dict:
    """Teacher NLL per teacher token of the student's replies and of the teacher's own, and both loop rates.
    teacher: (Llama, tokenizer) to judge with (default: the real teacher, loaded here)."""
    model, htok = teacher if teacher is not None else load_judge()
    if log:
        log(f"judge: scoring {len(student_chats)} student conversations under the teacher ...")
    student = teacher_loss([messages_of(c) for c in student_chats], system=system, model=model, htok=htok)
    users = [[t["user"] for t in c["turns"]] for c in student_chats]
    if log:
        log("judge: sampling the teacher's own replies ...")
    own = teacher_replies(users, model, htok, system, temperature, top_p, max_new, seed)
    mine = teacher_loss([messages_of(c) for c in own], system=system, model=model, htok=htok)
    s_replies = [t["reply"] for c in student_chats for t in c["turns"]]
    t_replies = [t["reply"] for c in own for t in c["turns"]]
    return {"student_nll": student["loss_per_token"], "teacher_nll": mine["loss_per_token"],
            "student_nll_first": student["first_turn_loss"], "student_nll_later": student["later_turns_loss"],
            "teacher_nll_first": mine["first_turn_loss"], "teacher_nll_later": mine["later_turns_loss"],
            "ratio": student["loss_per_token"] / max(mine["loss_per_token"], 1e-9),
            "student_tokens": student["target_tokens"], "teacher_tokens": mine["target_tokens"],
            "student_loops": loop_rate(s_replies), "teacher_loops": loop_rate(t_replies),
            "system": system, "temperature": temperature, "top_p": top_p, "max_new": max_new,
            "teacher_conversations": own}


def seed_mean(by_seed: dict[int, dict]) -> dict:
    """{eval seed: judge()} -> the plain mean over seeds of each figure, and each seed's figures.

    One seed's student NLL moves by about +-0.05 between seeds (docs/benchmarks.md), as much as a training stage
    gains, so a stage is judged by this mean over the same seeds before and after."""
    if not by_seed:
        raise ValueError("seed_mean: no seeds")
    keys = ("student_nll", "teacher_nll", "student_nll_first", "student_nll_later", "student_loops",
            "teacher_loops")
    seeds = sorted(by_seed)
    out: dict = {"seeds": seeds}
    for k in keys:
        out[k] = sum(by_seed[s][k] for s in seeds) / len(seeds)
    out["by_seed"] = {str(s): {k: by_seed[s][k] for k in keys} for s in seeds}
    return out
