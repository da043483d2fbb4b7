"""One v2 conversation as a :class:`~tinychat.training.grouped.GroupDriver`: checks, detail follow-ups, best-of-N.

For each user turn of a :class:`~tinychat.training.questions.Plan` the teacher samples N replies. A reply is
*invalid* when :func:`~tinychat.training.degenerate.degenerate_reason` finds it unusable (cut off, a loop, not
English, ...), when it parrots (:func:`echo_reason`), or when the turn has a check and the reply does not contain one of its answers ("wrong"). Among the
valid replies the one with the best :func:`reply_score` is kept; when none is valid, the conversation ends there
(the exchanges before it are kept, as in v1). A follow-up with ``dynamic="detail"`` is written from the kept reply
(:func:`~tinychat.training.questions.detail_followup`).

Score: the mean log-probability the teacher gave its own tokens (the stop token included), minus 0.15 per
sentence beyond three when the question was short (<= 12 words, not a request for a story, poem or steps): the
student should copy the teacher's confident, short answers, not its rambling ones.
"""
from __future__ import annotations

import random
import re

from .degenerate import degenerate_reason
from .grouped import Candidate
from .questions import GENERIC, Plan, detail_followup

_SENT = re.compile(r"[.!?]+(?:\s|$)")
_LONG_OK = re.compile(r"\b(story|poem|haiku|steps|recipe|list|riddle|describe|explain)\b", re.I)


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def echo_reason(text: str, user: str, previous: str | None) -> str | None:
    """"echo" when a reply repeats the previous reply (the same words) or copies the user's message of six words or
    more into itself: a teacher that parrots scores high on its own log-probabilities, so best-of-N would pick it."""
    t = _norm(text)
    if previous is not None and t == _norm(previous):
        return "echo"
    u = _norm(user)
    if len(u.split()) >= 6 and u in t:
        return "echo"
    return None


def contains_answer(text: str, answers) -> bool:
    """Whether ``text`` contains one of ``answers`` as a whole word or phrase, any case."""
    low = text.lower()
    for a in answers:
        a = str(a).lower().strip()
        if a and re.search(r"(?<![a-z0-9])" + re.escape(a) + r"(?![a-z0-9])", low):
            return True
    return False


def sentences(text: str) -> int:
    return max(1, len(_SENT.findall(text.strip())))


def reply_score(text: str, logprobs: list[float], user: str) -> float:
    score = sum(logprobs) / max(len(logprobs), 1)
    if len(user.split()) <= 12 and not _LONG_OK.search(user):
        score -= 0.15 * max(0, sentences(text) - 3)
    return score


class Dialogue:
    def __init__(self, plan: Plan, tok, max_new: int, special_ids: frozenset[int], seed: int):
        from .teacher import IM_END, chatml

        self.plan, self.tok, self.max_new, self.special = plan, tok, max_new, special_ids
        self._chatml, self._im_end = chatml, IM_END
        self.rng = random.Random(seed)
        self.messages: list[dict] = []
        self.ended = "planned"
        self.reasons: list[str | None] = []        # one per candidate reply (None = valid)
        self.selection: list[dict] = []            # per kept turn: candidates, valid ones, the kept score
        self.dropped: dict | None = None
        self.assistant_tokens = 0
        self.user = self._text(0)

    def _text(self, i: int) -> str:
        t = self.plan.turns[i]
        if not t.dynamic:
            return t.text
        prev = self.messages[-1]["content"] if self.messages else ""
        prev_user = self.messages[-2]["content"] if len(self.messages) >= 2 else ""
        return detail_followup(prev, prev_user, self.rng) or self.rng.choice(GENERIC)

    def _user_tokens(self, text: str) -> list[int]:
        return self.tok.encode(self._chatml([{"role": "user", "content": text}])).ids

    def first_prompt(self) -> list[int]:
        return self._user_tokens(self.user)

    def on_replies(self, cands: list[Candidate], room: int) -> tuple[int, list[int] | None]:
        turn = len(self.messages) // 2
        check = self.plan.turns[turn].check
        texts, valid = [], []
        for i, c in enumerate(cands):
            text = self.tok.decode(c.ids, skip_special_tokens=True).strip()
            texts.append(text)
            reason = degenerate_reason(text, c.stopped, any(t in self.special for t in c.ids))
            if reason is None:
                reason = echo_reason(text, self.user, self.messages[-1]["content"] if self.messages else None)
            if reason is None and check and not contains_answer(text, check):
                reason = "wrong"
            self.reasons.append(reason)
            if reason is None:
                valid.append((reply_score(text, c.logprobs, self.user), i))
        if not valid:
            reasons = [r for r in self.reasons[-len(cands):]]
            self.ended = max(set(reasons), key=reasons.count)
            self.dropped = {"reason": self.ended, "user": self.user, "reply": texts[0]}
            return 0, None
        score, w = max(valid)
        self.messages += [{"role": "user", "content": self.user}, {"role": "assistant", "content": texts[w]}]
        self.selection.append({"n": len(cands), "valid": len(valid), "score": round(score, 4)})
        self.assistant_tokens += len(cands[w].ids) + 1        # + <|im_end|>
        if turn + 1 >= len(self.plan.turns):
            return w, None
        self.user = self._text(turn + 1)
        cont = self.tok.encode(self._im_end + "\n" + self._chatml([{"role": "user", "content": self.user}])).ids
        if len(cont) + self.max_new > room:
            self.ended = "context"
            return w, None
        return w, cont

    def record(self, cid: str, teacher_meta: dict) -> dict | None:
        if not self.messages:
            return None
        total = len(self.tok.encode(self._chatml(self.messages, add_generation_prompt=False)).ids)
        return {"id": cid, "kind": self.plan.kind, "source": self.plan.source, "messages": self.messages,
                "ended": self.ended, "tokens": {"total": total, "assistant": self.assistant_tokens},
                "selection": self.selection, "teacher": teacher_meta,
                **({"dropped": self.dropped} if self.dropped else {})}
