"""A chat turn: what it is asked to do (TurnPlan), how it samples (GenerateConfig: the Decoder's generate arguments
and the device loop's per-turn state, set in one place), what it gives back (TurnResult), and the TurnRunner that
runs it on the chat's cache timeline (timeline.py): the feed, a fork's given tokens, the decode loop, the reply
recorded in the history and the cache's turn done. The context-full policy (drop the oldest turns) is here too."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampler import KEEP_REPLY, Cancelled, TokenTrace, TurnHook, TurnStats, ngram_table, penalty_ids
from ..sessions.session import Message, Session
from ..settings import ChatError, ChatSettings
from ..tokenizer import StreamDecoder
from .quant_steps import describe_step
from .timeline import CacheTimeline, context_ids, first_turn_at


@dataclass(frozen=True)
class Fork:
    """A reply forced at a token: its sampled tokens before `position` kept, `token` forced there, then sampling goes on
    with a new seed. `given` is what the turn steps before it samples (the kept tokens, then the forced one); the
    stop token forced ends the reply there. Recorded in the reply as {"position", "token"}: the kept tokens are the
    reply's own first `position` tokens, so a replay rebuilds `given` from the record (Branches.recorded_fork)."""
    position: int
    token: int
    given: tuple[int, ...]

    def record(self) -> dict:
        return {"position": self.position, "token": self.token}


@dataclass
class TurnResult:
    text: str
    token_ids: list[int]            # sampled content tokens (the stop token excluded)
    finish: str                     # "stop", "length", "cancelled" (or "edited": a replayed hand-written reply)
    seed: int
    prefill_tokens: int
    ttft_ms: float
    decode_tok_s: float
    traces: list[TokenTrace] = field(default_factory=list)
    stats: TurnStats = field(default_factory=TurnStats)
    dropped_turns: int = 0          # oldest turns dropped to make room (context full)
    mode: str = "eager"
    probs: list = field(default_factory=list, repr=False)   # replay only: each step's final distribution
    save_warning: str | None = None  # one line when the autosave after this turn failed (the turn stays in the chat)
    notice: str | None = None       # one line worth telling: this turn ran on another int8 step than the one before

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def summary(self) -> dict:
        return {"text": self.text, "n_tokens": self.n_tokens, "finish": self.finish, "seed": self.seed,
                "ttft_ms": round(self.ttft_ms, 2), "decode_tok_s": round(self.decode_tok_s, 2),
                "prefill_tokens": self.prefill_tokens, "dropped_turns": self.dropped_turns, "mode": self.mode,
                "banned_steps": self.stats.banned_steps, "ban_lifts": self.stats.lifts}


@dataclass(frozen=True)
class TurnPlan:
    """One turn to run. settings: this turn's (recorded with it; None: the chat's). on_token(index, token_id,
    text_piece, trace, ms) as each token is sampled; on_reply(result) once the turn is complete, before it is saved.
    context_start: a replay shortens the context exactly as the recorded turn did. fork: the reply's first tokens
    are given (Fork): stepped one by one after the prefill (the restore rule), then sampling goes on in the
    eager loop, the sampler seeing them as the reply so far. dead_end: what the sampler's dead-end guard lifts
    (sampler.KEEP_REPLY; a replay passes what the recorded turn ran with). autosave: save after the turn."""
    user: Message
    settings: ChatSettings | None = None
    trace: bool = False
    on_token: Callable | None = None
    on_reply: Callable | None = None
    keep_probs: bool = False
    context_start: int | None = None
    fork: Fork | None = None
    dead_end: str = KEEP_REPLY
    autosave: bool = True


@dataclass(frozen=True)
class GenerateConfig:
    """Decoder.generate's arguments for one turn, and the device loop's per-turn state (on_sync: streaming every
    few tokens; keep_logits: the draws' logits for traces afterwards)."""
    max_new: int
    stop: int
    temperature: float
    top_p: float
    penalty: float
    pen_ids: list[int]
    generator: torch.Generator
    hook: Callable                  # logits_hook: a TurnHook (the device loop takes its table), or a plain callable
    on_sync: Callable | None = None
    keep_logits: bool = False

    def prepare(self, decoder) -> None:
        """Set the decoder's per-turn state (before the feed: nothing of an earlier turn's is left)."""
        decoder.on_sync = self.on_sync
        decoder.keep_logits = self.keep_logits
        decoder.last_logits = None

    def run(self, decoder, logits: torch.Tensor) -> list[int]:
        return decoder.generate(logits, self.max_new, self.stop, temperature=self.temperature, top_p=self.top_p,
                                pen=self.penalty, pen_ids=self.pen_ids, ban_ids=(), generator=self.generator,
                                logits_hook=self.hook)


class TurnRunner:
    """Runs turns on a timeline; `cancel` (a threading.Event) stops the running one at its next token."""

    def __init__(self, timeline: CacheTimeline, steps, tokenizer, max_len: int, device: torch.device):
        self.timeline, self.steps, self.tok = timeline, steps, tokenizer
        self.max_len, self.device = max_len, device
        self.stop_id = tokenizer.im_end
        self.special = set(tokenizer.special_ids)
        self.cancel = threading.Event()

    def room(self, n_feed: int, max_new: int) -> bool:
        return self.timeline.length() + n_feed + max_new + 1 <= self.max_len

    def run(self, plan: TurnPlan, session: Session) -> TurnResult:
        """Run `plan` (its settings given) on the session's active path: the reply appended to the history, the
        cache's turn done."""
        st, fork, tl, context_start = plan.settings, plan.fork, self.timeline, plan.context_start
        user = plan.user
        self.cancel.clear()
        gen = self.tok.generation_prompt_ids()
        feed = tl.pending + user.token_ids + gen
        dropped = 0
        msgs = session.messages
        if context_start is not None:        # replay: shorten the context exactly as the recorded turn did
            feed = context_ids(msgs, context_start, len(msgs)) + user.token_ids + gen
        elif not self.room(len(feed), st.max_new):
            if fork is not None:             # a fork re-decodes the turn on its own context: never a shorter one
                raise ChatError(f"this fork does not fit the {self.max_len:,}-token context (the turn's prompt and "
                                f"a {st.max_new:,}-token reply); continue the session with a longer context to fork it")
            feed, context_start, dropped = self.shorten(msgs, user, gen, st.max_new)
        seed = st.seed if st.seed is not None else random.SystemRandom().randrange(2 ** 63)
        hook, stream = self._hook(plan, st, msgs)
        given = list(fork.given) if fork is not None else []
        graph = tl.decoder.graph and not given   # device loop: streams every few tokens, traces afterwards
        config = GenerateConfig(max(0, st.max_new - len(given)) if given else st.max_new, self.stop_id,
                                st.temperature, st.top_p, st.penalty, hook.pen_ids,
                                torch.Generator(device=self.device).manual_seed(seed),
                                hook.__call__ if given else hook,   # given: the eager loop (a plain callable)
                                on_sync=hook.on_sync if graph else None, keep_logits=bool(plan.trace and graph))
        mark = tl.cache.mark()
        if context_start is not None:
            tl.cache.reset([0])
        config.prepare(tl.decoder)
        t0 = time.perf_counter()
        logits = tl.feed(feed)
        for t in given:                          # a fork's kept tokens and the forced one: one step each
            logits = tl.decoder.step(t)
        finish = "stop"
        try:
            if given and given[-1] == self.stop_id:  # the forced token ends the reply
                out = given
            else:                                # the hook adds the given tokens to what it sees
                out = given + config.run(tl.decoder, logits)
        except Cancelled:
            out = list(hook.out)
            tl.decoder.step(self.stop_id)         # every assistant turn ends in <|im_end|> in the cache
            finish = "cancelled"
        hook.finish(out)
        if graph and plan.trace and getattr(tl.decoder, "last_logits", None) is not None:
            hook.traces_from_logits(out, tl.decoder.last_logits)
        if graph and self.cancel.is_set() and (not out or out[-1] != self.stop_id):
            finish = "cancelled"
        t1 = time.perf_counter()
        tail = stream.flush()
        if tail and plan.on_token is not None:
            plan.on_token(len(out), -1, tail, None, 0.0)
        sampled = out[:-1] if out and out[-1] == self.stop_id else out
        if finish == "stop" and (not out or out[-1] != self.stop_id):
            finish = "length"
        ttft = ((hook.t_first or t1) - t0) * 1000
        n = len(out) - len(given)                # sampled here (a fork's given tokens are not)
        rate = (n - 1) / (t1 - hook.t_first) if hook.t_first and n > 1 and t1 > hook.t_first else 0.0
        sampler = {**st.sampler(), "seed": seed, "dead_end": plan.dead_end}
        if context_start is not None:
            sampler["context_start"] = context_start
        step = self.steps.name()
        if step:
            sampler["step"] = step
        notice = self.step_notice(step, msgs)
        text = self.tok.decode(sampled, skip_special=True)
        reply = Message("assistant", text, gen + sampled + self.tok.end_ids(), settings=sampler, seed=seed,
                        finish=finish, timing_ms=[round(ms, 3) for ms in hook.times] or None,
                        fork=fork.record() if fork is not None else None)
        msgs.extend([user, reply])
        tl.turn_done(mark if context_start is None else None)
        return TurnResult(text=text, token_ids=sampled, finish=finish, seed=seed, prefill_tokens=len(feed),
                          ttft_ms=ttft, decode_tok_s=rate, traces=hook.traces, stats=hook.stats,
                          dropped_turns=dropped, mode=tl.decoder.mode,
                          probs=[None] * min(len(given), len(sampled)) + hook.probs, notice=notice)

    def _hook(self, plan: TurnPlan, st: ChatSettings, msgs: list[Message]) -> tuple[TurnHook, StreamDecoder]:
        """The turn's sampler hook (phrase ban, penalty window, dead-end guard, traces, streaming) and its stream."""
        content = self.timeline.content
        table = {}
        if st.ban:
            table = ngram_table([content(m) for m in msgs if m.role == "assistant"])
        if st.no_parrot:
            table = ngram_table([self.tok.encode(plan.user.content)], table=table)
        recent = [t for m in msgs if m.role != "system" for t in content(m)] + self.tok.encode(plan.user.content)
        pen_ids = penalty_ids(recent, st.penalty_window, self.special) if st.penalty != 1.0 else []
        stream = StreamDecoder(self.tok, skip_special=True)
        on_token = plan.on_token

        def emit(i, tok, tr, ms):
            if on_token is not None:
                on_token(i, tok, stream.push(tok), tr, ms)

        given = list(plan.fork.given) if plan.fork is not None else []
        hook = TurnHook(table, st.temperature, st.top_p, st.penalty, pen_ids, self.stop_id, trace=plan.trace,
                        on_token=emit, cancel=self.cancel, keep_probs=plan.keep_probs, reply=st.ban_reply,
                        given=given, dead_end=plan.dead_end)
        return hook, stream

    def step_notice(self, step: str | None, msgs: list[Message]) -> str | None:
        """One line when this turn's int8 step is not the one the turn before it on this path recorded (a chat
        continued where the native kernels did not build): they round differently."""
        before = next(((m.settings or {}).get("step") for m in reversed(msgs) if m.role == "assistant"), None)
        if not step or not before or before == step:
            return None
        from ..engine import native
        why = f" (native kernels: {native.why_not})" if native.why_not and step.startswith("torch") else ""
        return (f"this turn ran on {describe_step(step)}{why}, the one before on {describe_step(before)}: they round "
                f"differently; replay --check compares each turn with its own step where this machine has it")

    def shorten(self, msgs: list[Message], user: Message, gen: list[int], max_new: int):
        """Context full: drop the oldest turns (the system prompt stays) until this turn fits; the cache is
        rebuilt from the shortened history in one prefill. (feed, context start, turns dropped)."""
        first = first_turn_at(msgs)
        starts = [i for i in range(first, len(msgs)) if msgs[i].role == "user"] + [len(msgs)]
        for dropped, start in enumerate(starts):
            if dropped == 0:
                continue
            feed = context_ids(msgs, start, len(msgs)) + user.token_ids + gen
            if len(feed) + max_new + 1 <= self.max_len:
                return feed, start, dropped
        sys_n = len(msgs[0].token_ids) if first else 0
        room = self.max_len - sys_n - len(user.token_ids) - len(gen) - 1
        if room >= 1:                           # the message fits, with a shorter reply: max-new is what does not
            raise ChatError(f"max-new {max_new:,} is too large for this message: its {len(user.token_ids):,} tokens "
                            f"and the system prompt's {sys_n:,} leave room for a {room:,}-token reply in the "
                            f"{self.max_len:,}-token context (/set max-new {room})")
        if sys_n > len(user.token_ids):         # the system prompt is what does not fit, not the message
            raise ChatError(f"system prompt too long: its {sys_n:,} tokens, this message's {len(user.token_ids):,} "
                            f"and a {max_new:,}-token reply do not fit the {self.max_len:,}-token context")
        raise ChatError(f"message too long: {len(user.token_ids):,} tokens plus a {max_new:,}-token "
                        f"reply do not fit the {self.max_len:,}-token context")
