"""The chat runtime: history -> tokens -> prefill -> generate -> text, one batch-1 KV cache for the whole
conversation (each turn appends only its new tokens), sessions recorded to the token and autosaved.

Feed schedule (what makes restores exact): a turn feeds `pending + user message + generation prompt` with one
`append`, then the decoder steps every sampled token and the stop token (appended too when a turn is cut off or
cancelled). `pending` is what the conversation holds but the cache does not yet: the system message before the
first turn, the newline after each `<|im_end|>`. Restoring replays exactly this schedule, so the cache comes back
bit-identical and the next turn is token-identical to the uninterrupted chat's."""
from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..sessions import session as S
from ..sessions import snapshot as SS
from ..sessions import tree as T
from .branch_cache import BranchCache
from .branches import BranchesMixin, Fork
from ..engine import Decoder, EngineOptions, KVCache, append
from ..identity import model_identity, other_model
from .quant_steps import Int8Steps, describe_step
from ..model import TinyAgentLM
from ..plan import ExecutionPlan
from ..plan import decide as decide_plan
from ..sampler import (KEEP_REPLY, LIFT_ALL, Cancelled, TokenTrace, TurnHook, TurnStats, ngram_table,
                      penalty_ids)
from ..settings import ChatError, ChatSettings, OtherModel
from ..tokenizer import StreamDecoder, Tokenizer


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


class Chat(BranchesMixin):
    """One conversation with one model. Not thread-safe except `cancel()`: run turns on one thread."""

    def __init__(self, model: TinyAgentLM, tokenizer: Tokenizer, settings: ChatSettings | None = None, *,
                 plan: ExecutionPlan | None = None, quant: str | None = None, device: str = "cpu",
                 max_len: int | None = None, model_name: str = "", model_hash: str | None = None, autosave: bool = True,
                 sessions_dir: Path | None = None, graph=None, session: S.Session | None = None, rebuild: bool = True,
                 options: EngineOptions | None = None):
        """plan: how the model runs (plan.py; loading.open_chat decides it, the model already quantized to its
        mode). Without one it is decided from quant (none, int8, bf16; None: the model's as it is), device, options
        (EngineOptions; None: from the environment) and graph, by the same plan.decide: an fp32 model is quantized
        in place, one already quantized to another mode is a ChatError, never a silent switch."""
        if plan is None:
            plan = decide_plan(model, quant, device, options, graph=graph)
        self.plan = plan
        self.model, self.tok = model, tokenizer
        self.settings = settings or ChatSettings()
        self.sources: dict[str, str] = {}  # setting -> where its value came from (sampler_defaults.resolve; "/set")
        self.device = torch.device(plan.device)
        self.options = plan.options
        self.model_name = model_name
        self.model_hash = model_hash or model_identity(model)
        self.quant = plan.quant
        self.quant_auto: str | None = plan.quant_why   # why `--quant auto` chose this mode (None: given by hand)
        self.max_len = min(max_len or model.cfg.max_seq_len, model.cfg.max_seq_len)
        dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.cache = KVCache(model, 1, self.max_len, self.device, dtype=dtype)
        self.decoder = Decoder(model, self.cache, graph=plan.graph, plan=plan)
        self.steps = Int8Steps(model, self.decoder, plan)
        self.autosave, self.sessions_dir = autosave, sessions_dir
        self.stop_id = tokenizer.im_end
        self._special = set(tokenizer.special_ids)
        self._cancel = threading.Event()
        self._marks: list[dict] = []          # cache mark before each turn (undo / regenerate)
        self._left = BranchCache()            # the caches of paths this chat switched away from
        self.trace = False
        self.session = session or self._new_session()
        self._pending: list[int] = []
        self.used_snapshot = False
        self.notice: str | None = None        # one line for the user about the restore (a snapshot not used, why)
        self.save_warning: str | None = None  # the last autosave's failure, one line (None: saved)
        self._lock = None                     # the session's lock while this chat writes it (sessions/lock.py)
        if rebuild:
            self._rebuild()

    # -- sessions -----------------------------------------------------------------------------------------------
    def _new_session(self) -> S.Session:
        sess = S.Session.new(model={"name": self.model_name, "hash": self.model_hash, "max_len": self.max_len},
                             tokenizer_hash=self.tok.sha256, quant=self.quant, device=self.device.type,
                             settings=self.settings.sampler())
        if self.settings.system_prompt:
            sess.messages.append(S.Message("system", self.settings.system_prompt,
                                           self.tok.message_ids("system", self.settings.system_prompt)))
        return sess

    def new_session(self) -> None:
        """Start a fresh conversation (the current one stays saved)."""
        self.close()
        self.session = self._new_session()
        self._marks.clear()
        self._left.clear()
        self._rebuild()

    def save(self, title: str | None = None) -> Path | None:
        """Write the session (atomic) and then its KV snapshot, whose checksum the session records. Nothing to save
        before the first turn. Raises what the save raises (OSError, SessionError: SessionLocked, SessionConflict,
        SnapshotError when only the snapshot failed)."""
        if title:
            self.session.title = title
        if self.session.n_turns == 0 and not title:
            return None
        self.hold_lock()
        tensors = self.cache.state_dict()
        self.session.kv_sha256 = SS.tensors_sha256(tensors)
        path = S.save(self.session, self.sessions_dir)
        SS.save_snapshot(self.session.id, tensors, self._snapshot_meta(), self.sessions_dir)
        return path

    def hold_lock(self) -> None:
        """Hold the session's lock from now until close() (SessionLocked when another process has it open)."""
        if self._lock is None or self._lock.session_id != self.session.id:
            self.close()
            self._lock = S.lock(self.session.id, self.sessions_dir)

    def close(self) -> None:
        """Let go of the session's lock (another process may then open it). The chat may save again later."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _autosave(self) -> str | None:
        """Save after a change; never raises. Returns (and keeps in `save_warning`) one line when it failed: the
        turn stays in the chat and the next save writes it."""
        self.save_warning = None
        if not self.autosave:
            return None
        try:
            self.save()
        except S.SnapshotError as e:
            self.save_warning = f"saved the chat, but not its KV snapshot ({e}); it is rebuilt from the tokens " \
                                f"when continued"
        except (OSError, S.SessionError, RuntimeError) as e:
            what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.save_warning = f"not saved: {what} (the turn is kept here and saved with the next one)"
        return self.save_warning

    def _snapshot_meta(self) -> dict[str, str]:
        ids = self._cached_ids()
        return {"model_hash": self.model_hash, "quant": self.quant, "device": self.device.type,
                "dtype": str(self.cache.gk.dtype), "context": SS.hash_bytes(str(ids).encode()),
                "pending": ",".join(map(str, self._pending))}

    def _cached_ids(self) -> list[int]:
        ids = self.session.context_ids()
        return ids[:len(ids) - len(self._pending)] if self._pending else ids

    @classmethod
    def restore(cls, session_ref, model: TinyAgentLM, tokenizer: Tokenizer, *, use_snapshot: bool = True,
                **kw) -> "Chat":
        """Continue a saved session (a Session, or an id or path as tinychat.sessions.session.load reads it): load its KV
        snapshot when it matches this model and context exactly (fast), else rebuild the cache by replaying the
        recorded feed schedule (always exact)."""
        sess = session_ref if isinstance(session_ref, S.Session) else S.load(session_ref, kw.get("sessions_dir"))
        kw["model_hash"] = kw.get("model_hash") or model_identity(model)
        check_recorded(sess, model, tokenizer, kw.get("model_name", ""), kw["model_hash"])
        settings = kw.pop("settings", None) or settings_from_session(sess)
        chat = cls(model, tokenizer, settings, session=sess, rebuild=False, **kw)
        if chat.autosave:                   # one writer per session; never save over a newer copy
            try:
                chat.hold_lock()
                S.check_current(sess, chat.sessions_dir)
            except S.SessionError:
                chat.close()
                raise
            except OSError:                 # a folder that cannot hold a lock file cannot hold a save either:
                chat.close()                # the chat goes on and each save warns
        if not (use_snapshot and chat._load_snapshot()):
            chat._rebuild()
        return chat

    def _load_snapshot(self) -> bool:
        """Use the KV snapshot when it is the one the session recorded (its checksum) and fits this chat."""
        if not self.session.kv_sha256:       # none recorded (a file from before checksums): not verifiable
            return False
        try:
            snap = SS.load_snapshot(self.session.id, self.sessions_dir)
        except S.SessionError:              # a damaged snapshot only costs the fast path
            self.notice = "the KV snapshot could not be read: rebuilt the cache from the token ids"
            return False
        if snap is None:
            return False
        tensors, meta = snap
        if SS.tensors_sha256(tensors) != self.session.kv_sha256:
            self.notice = "the KV snapshot does not match the checksum the session recorded: rebuilt the cache " \
                          "from the token ids"
            return False
        try:
            self._pending = [int(x) for x in meta.get("pending", "").split(",") if x]
        except ValueError:
            return False
        if any(meta.get(k) != v for k, v in self._snapshot_meta().items()):
            self._pending = []
            return False
        try:
            self.cache.load_state_dict(tensors)
        except (ValueError, KeyError, RuntimeError):
            self.cache.reset([0])
            self._pending = []
            return False
        self.used_snapshot = True
        self._marks.clear()          # earlier turns' marks are unknown: taking one back rebuilds the cache
        return True

    # -- the cache from the recorded messages ---------------------------------------------------------------
    def _rebuild(self) -> None:
        """Bring the cache to the session's messages by replaying the live feed schedule (bit-exact)."""
        self.cache.reset([0])
        self.used_snapshot = False
        self._marks.clear()
        msgs = self.session.messages
        pending: list[int] = []
        i = 0
        while i < len(msgs):
            m = msgs[i]
            if m.role == "system":
                pending += m.token_ids
                i += 1
                continue
            if m.role != "user" or i + 1 >= len(msgs) or msgs[i + 1].role != "assistant":
                raise ChatError(f"session {self.session.id}: message {i} breaks the user/assistant alternation")
            self._pending = pending
            self._play(m, msgs[i + 1], i)
            pending = self._pending
            i += 2
        self._pending = pending

    def _play(self, user: S.Message, reply: S.Message, at: int) -> None:
        """Feed one recorded turn (messages[at], messages[at + 1]) exactly as it ran live: on the int8 step it
        recorded, where this machine has it (quant_steps.py)."""
        start = (reply.settings or {}).get("context_start")
        self._marks.append(self.cache.mark() if start is None else None)
        pending = self._pending
        with self.steps.running((reply.settings or {}).get("step")):
            if start is not None:            # this turn re-prefilled a shortened context: do the same
                self.cache.reset([0])
                pending = self._context_ids(start, at)
            self._feed(pending + user.token_ids + self.tok.generation_prompt_ids())
            for t in self._content(reply) + [self.stop_id]:
                self.decoder.step(t)
        self._pending = self.tok.end_ids()[1:]

    def _context_ids(self, start: int, upto: int) -> list[int]:
        """System message + messages[start:upto] ids: a shortened context to re-prefill."""
        msgs = self.session.messages
        sys_ids = msgs[0].token_ids if msgs and msgs[0].role == "system" else []
        return sys_ids + [t for m in msgs[start:upto] for t in m.token_ids]

    def _feed(self, ids: list[int]):
        if ids and not 0 <= min(ids) <= max(ids) < self.model.cfg.vocab_size:   # the kernels index tables by id
            raise ChatError(f"token id {max(ids) if max(ids) >= 0 else min(ids)} is outside the model's vocabulary "
                            f"(0..{self.model.cfg.vocab_size - 1})")
        return append(self.model, self.cache, torch.tensor([ids], dtype=torch.long, device=self.device), [len(ids)],
                      pad_shapes=self.options.pad_shapes)

    # -- turns ----------------------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the running turn (thread-safe): it ends at the next token, the cache stays well-formed."""
        self._cancel.set()

    def set(self, key: str, value: str) -> ChatSettings:
        """Change one setting from the next turn. A new system prompt replaces the current one while the chat has
        no turns yet; later it applies from the next new chat (the history was prefilled with the old one)."""
        new = self.settings.with_value(key, value)
        self.sources[ChatSettings.field_name(key)] = "/set"
        if new.max_new != self.settings.max_new:
            self.check_max_new(new.max_new)
        if new.system_prompt != self.settings.system_prompt and self.session.n_turns == 0:
            msgs = self.session.messages
            if msgs and msgs[0].role == "system":
                msgs.pop(0)
            if new.system_prompt:
                msgs.insert(0, S.Message("system", new.system_prompt,
                                         self.tok.message_ids("system", new.system_prompt)))
            self.settings = new
            self._rebuild()
        self.settings = new
        return self.settings

    def send(self, text: str, on_token=None, trace: bool | None = None, on_reply=None) -> TurnResult:
        """One turn: the user's text in, the assistant's reply out. on_token(index, token_id, text_piece, trace,
        ms) is called as each token is sampled (from this thread); on_reply(result) once the turn is complete and
        before it is saved (a turn is shown, then saved: a failed save never hides the reply)."""
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        self.check_length(text)
        user = S.Message("user", text, self.tok.message_ids("user", text))
        return self._turn(user, on_token, self.trace if trace is None else trace, on_reply=on_reply)

    def max_new_room(self) -> int:
        """The longest reply a turn can have here: the context less the system prompt, a one-token message's frame,
        the assistant header and the stop token."""
        msgs = self.session.messages
        sys_n = len(msgs[0].token_ids) if msgs and msgs[0].role == "system" else 0
        return self.max_len - sys_n - len(self.tok.message_ids("user", ".")) - len(self.tok.generation_prompt_ids()) - 1

    def check_max_new(self, max_new: int) -> None:
        """ChatError when no turn could ever hold a reply of max_new tokens (`/set max-new 100000` on a 2,048-token
        model was taken, and every turn after it failed, blaming the system prompt)."""
        room = self.max_new_room()
        if max_new > room:
            raise ChatError(f"max-new {max_new:,} does not fit the {self.max_len:,}-token context: at most "
                            f"{max(room, 0):,} with this system prompt")

    def input_limit(self) -> int:
        """The most characters a message may have: more cannot fit the context whatever they tokenize to (context x
        the longest token's bytes, x4 for normalizers that merge characters). Inputs are read with this bound (-f,
        -p -, a line of --plain) and a longer message is refused before it is tokenized: a 30 MB file took 41 s and
        5.2 GB to tokenize before it was refused as too long."""
        return 4 * self.max_len * self.tok.max_token_bytes

    def check_length(self, text: str) -> None:
        """ChatError when text is longer than input_limit()."""
        if len(text) > self.input_limit():
            raise ChatError(f"message too long: {len(text):,} characters cannot fit the {self.max_len:,}-token "
                            f"context")

    def regenerate(self, on_token=None, trace: bool | None = None, on_reply=None,
                   settings: ChatSettings | None = None) -> TurnResult:
        """Sample the last reply again (a new seed unless the settings fix one). The old reply is kept: the new one
        becomes its sibling (an alternative, sessions/tree.py) and the active one. settings: this reply's own (the
        sampler A/B, ab.py; recorded with the reply), else the chat's."""
        msgs = self.session.messages
        if len(msgs) < 2 or msgs[-1].role != "assistant":
            raise ChatError("no turn to take back")
        T.link(self.session)
        old, at = msgs[-1], len(msgs) - 2
        if len(self._marks) == self.session.n_turns and self._marks[-1] is not None:   # switching back is a copy
            self._left.leave(tuple(m.id for m in msgs), self.cache, self._marks[-1], self._marks[-1:], self._pending)
        user = self._pop_turn()
        try:
            res = self._turn(user, on_token, self.trace if trace is None else trace, on_reply=on_reply,
                             autosave=False, settings=settings)
        except BaseException:                   # the old reply stays the active one, the cache rebuilt to it
            del msgs[at:]
            msgs.extend([user, old])
            self._rebuild()
            raise
        self.session.branches.append(old)
        T.link(self.session)
        res.save_warning = self._autosave()
        return res

    def undo(self) -> S.Message:
        """Remove the last user message and its reply, with their alternatives; returns the user message (to edit
        and resend)."""
        user = self._pop_turn()
        T.prune(self.session)
        self._autosave()
        return user

    def _pop_turn(self) -> S.Message:
        msgs = self.session.messages
        if len(msgs) < 2 or msgs[-1].role != "assistant":
            raise ChatError("no turn to take back")
        msgs.pop()                          # the reply
        user = msgs.pop()
        mark = self._marks.pop() if self._marks else None
        if mark is None:
            self._rebuild()                 # a turn that re-prefilled a shortened context, or one from a snapshot
        else:
            self.cache.truncate(mark)
            self._pending = self.tok.end_ids()[1:] if any(m.role == "assistant" for m in msgs) \
                else (msgs[0].token_ids if msgs and msgs[0].role == "system" else [])
        return user

    def _room(self, n_feed: int, max_new: int) -> bool:
        return int(self.cache.lens_cpu[0]) + n_feed + max_new + 1 <= self.max_len

    def _turn(self, user: S.Message, on_token, trace: bool, keep_probs: bool = False,
              context_start: int | None = None, on_reply=None, autosave: bool = True,
              settings: ChatSettings | None = None, fork: Fork | None = None, dead_end: str = KEEP_REPLY) -> TurnResult:
        """settings: this turn's (recorded with it; the chat's stay as they are). fork: the reply's first tokens are
        given (branches.Fork): stepped one by one after the prefill (the restore rule), then sampling goes on in
        the eager loop, the sampler seeing them as the reply so far. dead_end: what the sampler's dead-end guard lifts
        (sampler.KEEP_REPLY; a replay passes what the recorded turn ran with)."""
        st = settings or self.settings
        self._cancel.clear()
        gen = self.tok.generation_prompt_ids()
        feed = self._pending + user.token_ids + gen
        dropped = 0
        if context_start is not None:        # replay: shorten the context exactly as the recorded turn did
            feed = self._context_ids(context_start, len(self.session.messages)) + user.token_ids + gen
        elif not self._room(len(feed), st.max_new):
            if fork is not None:             # a fork re-decodes the turn on its own context: never a shorter one
                raise ChatError(f"this fork does not fit the {self.max_len}-token context (the turn's prompt and a "
                                f"{st.max_new}-token reply); continue the session with a longer context to fork it")
            feed, context_start, dropped = self._shorten(user, gen, st.max_new)
        seed = st.seed if st.seed is not None else random.SystemRandom().randrange(2 ** 63)
        g = torch.Generator(device=self.device).manual_seed(seed)
        msgs = self.session.messages
        table = {}
        if st.ban:
            table = ngram_table([self._content(m) for m in msgs if m.role == "assistant"])
        if st.no_parrot:
            table = ngram_table([self.tok.encode(user.content)], table=table)
        recent = [t for m in msgs if m.role != "system" for t in self._content(m)] + self.tok.encode(user.content)
        pen_ids = penalty_ids(recent, st.penalty_window, self._special) if st.penalty != 1.0 else []
        stream = StreamDecoder(self.tok, skip_special=True)

        def emit(i, tok, tr, ms):
            if on_token is not None:
                on_token(i, tok, stream.push(tok), tr, ms)

        given = list(fork.given) if fork is not None else []
        hook = TurnHook(table, st.temperature, st.top_p, st.penalty, pen_ids, self.stop_id, trace=trace,
                        on_token=emit, cancel=self._cancel, keep_probs=keep_probs, reply=st.ban_reply, given=given,
                        dead_end=dead_end)
        mark = self.cache.mark()
        if context_start is not None:
            self.cache.reset([0])
        graph = self.decoder.graph and not given   # device loop: streams every few tokens, traces afterwards
        self.decoder.on_sync = hook.on_sync if graph else None
        self.decoder.keep_logits = bool(trace and graph)
        self.decoder.last_logits = None
        t0 = time.perf_counter()
        logits = self._feed(feed)
        for t in given:                          # a fork's kept tokens and the forced one: one step each
            logits = self.decoder.step(t)
        finish = "stop"
        try:
            if given and given[-1] == self.stop_id:  # the forced token ends the reply
                out = given
            elif given:                          # the eager loop (a plain callable), the hook adding the given tokens
                out = given + self.decoder.generate(logits, max(0, st.max_new - len(given)), self.stop_id,
                                                    st.temperature, st.top_p, st.penalty, pen_ids, (), g, hook.__call__)
            else:
                out = self.decoder.generate(logits, st.max_new, self.stop_id, st.temperature, st.top_p, st.penalty,
                                            pen_ids, (), g, hook)
        except Cancelled:
            out = list(hook.out)
            self.decoder.step(self.stop_id)       # every assistant turn ends in <|im_end|> in the cache
            finish = "cancelled"
        hook.finish(out)
        if graph and trace and getattr(self.decoder, "last_logits", None) is not None:
            hook.traces_from_logits(out, self.decoder.last_logits)
        if graph and self._cancel.is_set() and (not out or out[-1] != self.stop_id):
            finish = "cancelled"
        t1 = time.perf_counter()
        tail = stream.flush()
        if tail and on_token is not None:
            on_token(len(out), -1, tail, None, 0.0)
        sampled = out[:-1] if out and out[-1] == self.stop_id else out
        if finish == "stop" and (not out or out[-1] != self.stop_id):
            finish = "length"
        ttft = ((hook.t_first or t1) - t0) * 1000
        n = len(out) - len(given)                # sampled here (a fork's given tokens are not)
        rate = (n - 1) / (t1 - hook.t_first) if hook.t_first and n > 1 and t1 > hook.t_first else 0.0
        sampler = {**st.sampler(), "seed": seed, "dead_end": dead_end}
        if context_start is not None:
            sampler["context_start"] = context_start
        step = self.step_name()
        if step:
            sampler["step"] = step
        notice = self._step_notice(step, msgs)
        text = self.tok.decode(sampled, skip_special=True)
        reply = S.Message("assistant", text, gen + sampled + self.tok.end_ids(), settings=sampler, seed=seed,
                          finish=finish, timing_ms=[round(ms, 3) for ms in hook.times] or None,
                          fork=fork.record() if fork is not None else None)
        msgs.extend([user, reply])
        self.session.settings = self.settings.sampler()
        self._marks.append(mark if context_start is None else None)
        self._pending = self.tok.end_ids()[1:]
        result = TurnResult(text=text, token_ids=sampled, finish=finish, seed=seed, prefill_tokens=len(feed),
                            ttft_ms=ttft, decode_tok_s=rate, traces=hook.traces, stats=hook.stats,
                            dropped_turns=dropped, mode=self.decoder.mode,
                            probs=[None] * min(len(given), len(sampled)) + hook.probs, notice=notice)
        if on_reply is not None:
            on_reply(result)
        if autosave:
            result.save_warning = self._autosave()
        return result

    def step_name(self) -> str | None:
        """Which int8 steps run here, as sessions record them per turn (None for other modes): the decode step
        ("native-int8-v<N>" or "torch-int8", the fallback without kernels), then the prefill's GEMM where it is not
        the decode step's own rounding ("+native-prefill-v<N>", "+bf16-prefill", "+fp32-prefill"), then, where
        native kernels run, "@" and their path (avx512-vnni, avx2-vnni, neon-dotprod, ...). They round differently,
        so replay runs each turn on the step it recorded where this machine has it (quant_steps.py)."""
        return self.steps.name()

    def _step_notice(self, step: str | None, msgs: list) -> str | None:
        """One line when this turn's int8 step is not the one the turn before it on this path recorded (a chat
        continued where the native kernels did not build): they round differently."""
        before = next(((m.settings or {}).get("step") for m in reversed(msgs) if m.role == "assistant"), None)
        if not step or not before or before == step:
            return None
        from ..engine import native
        why = f" (native kernels: {native.why_not})" if native.why_not and step.startswith("torch") else ""
        return (f"this turn ran on {describe_step(step)}{why}, the one before on {describe_step(before)}: they round "
                f"differently; replay --check compares each turn with its own step where this machine has it")

    def _shorten(self, user: S.Message, gen: list[int], max_new: int):
        """Context full: drop the oldest turns (the system prompt stays) until this turn fits; the cache is
        rebuilt from the shortened history in one prefill."""
        msgs = self.session.messages
        first = 1 if msgs and msgs[0].role == "system" else 0
        starts = [i for i in range(first, len(msgs)) if msgs[i].role == "user"] + [len(msgs)]
        for dropped, start in enumerate(starts):
            if dropped == 0:
                continue
            feed = self._context_ids(start, len(msgs)) + user.token_ids + gen
            if len(feed) + max_new + 1 <= self.max_len:
                return feed, start, dropped
        sys_n = len(msgs[0].token_ids) if first else 0
        room = self.max_len - sys_n - len(user.token_ids) - len(gen) - 1
        if room >= 1:                           # the message fits, with a shorter reply: max-new is what does not
            raise ChatError(f"max-new {max_new:,} is too large for this message: its {len(user.token_ids)} tokens "
                            f"and the system prompt's {sys_n} leave room for a {room:,}-token reply in the "
                            f"{self.max_len:,}-token context (/set max-new {room})")
        if sys_n > len(user.token_ids):         # the system prompt is what does not fit, not the message
            raise ChatError(f"system prompt too long: its {sys_n} tokens, this message's {len(user.token_ids)} and "
                            f"a {max_new}-token reply do not fit the {self.max_len}-token context")
        raise ChatError(f"message too long: {len(user.token_ids)} tokens plus a {max_new}-token "
                        f"reply do not fit the {self.max_len}-token context")

    def _content(self, m: S.Message) -> list[int]:
        return self.tok.content_ids(m.role, m.token_ids)

    # -- replay ---------------------------------------------------------------------------------------------------
    def start_replay(self, sess: S.Session) -> None:
        """Start replaying `sess` on this (fresh) chat: the conversation becomes the session's system message alone,
        the cache rebuilt to it; then replay_turn each recorded turn in order."""
        msgs = sess.messages
        self.session.messages = list(msgs[:1] if msgs and msgs[0].role == "system" else [])
        self._left.clear()
        self._rebuild()

    def replay_turn(self, user: S.Message, recorded: S.Message, on_token=None) -> TurnResult:
        """Regenerate one recorded turn (user message, recorded reply) with the chat's current settings (a replay
        sets the recorded ones first), shortening the context where the recorded turn did, forced where a fork
        recorded it (its kept tokens taken from the record, branches.Fork), with traces and each
        step's final distribution (TurnResult.probs); then put the recorded turn in place of the regenerated one,
        in the history and in the cache, so the next turn runs on the recorded context. on_token as in send()."""
        at = len(self.session.messages)
        if recorded.finish == "edited":         # written by the user, not sampled: given as it is
            self.session.messages.extend([user, recorded])
            self._play(user, recorded, at)
            content = self._content(recorded)
            return TurnResult(text=recorded.content, token_ids=content, finish="edited", seed=recorded.seed or 0,
                              prefill_tokens=0, ttft_ms=0.0, decode_tok_s=0.0, mode=self.decoder.mode)
        pending, mark = self._pending, self.cache.mark()
        start = (recorded.settings or {}).get("context_start")
        res = self._turn(S.Message("user", user.content, list(user.token_ids)), on_token, True, keep_probs=True,
                         context_start=start, fork=self.recorded_fork(recorded),
                         dead_end=(recorded.settings or {}).get("dead_end", LIFT_ALL))   # as the turn ran
        del self.session.messages[at:]
        if start is None:
            self.cache.truncate(mark)
        self._marks.pop()
        self._pending = pending
        self.session.messages.extend([user, recorded])
        self._play(user, recorded, at)
        return res

    # -- facts for the status bar -----------------------------------------------------------------------------
    def status(self) -> dict:
        L = int(self.cache.lens_cpu[0])
        return {"model": self.model_name, "mode": self.decoder.mode, "device": self.device.type,
                "quant": self.quant, **({"auto": self.quant_auto} if self.quant_auto else {}),
                "cache_tokens": L, "max_len": self.max_len,
                "cache_bytes": self.cache.used_bytes(), "session": self.session.id, "turns": self.session.n_turns}


def check_recorded(sess: S.Session, model: TinyAgentLM, tokenizer: Tokenizer, name: str, identity: str) -> None:
    """OtherModel when `sess` was recorded with another model (check_model), then SessionError for token ids this
    model cannot take: before anything reads the ids (another model's are not errors in the file)."""
    check_model(sess, name, identity, tokenizer)
    S.check_tokens(sess, model.cfg.vocab_size, tokenizer)


def check_model(sess: S.Session, name: str, identity: str, tokenizer: Tokenizer) -> None:
    """OtherModel when `sess` was recorded with another model (or tokenizer) than (name, identity): checked before
    anything reads the session's token ids, whose range belongs to the recording model."""
    why = other_model(sess, name, identity)
    if why:
        was = sess.model.get("name") or ""
        raise OtherModel(f"{why}; load that model to continue it", sess.id, was, same_name=bool(was) and was == name)
    if sess.tokenizer_hash and sess.tokenizer_hash != tokenizer.sha256:
        raise OtherModel(f"session {sess.id} was recorded with another tokenizer", sess.id,
                         sess.model.get("name") or "")


def settings_from_session(sess: S.Session) -> ChatSettings:
    """The settings a session's next turn continues with: its last recorded ones, its system prompt."""
    known = {f.name for f in dataclasses.fields(ChatSettings)}
    d = {k: v for k, v in (sess.settings or {}).items() if k in known}
    d["system_prompt"] = sess.system_prompt
    try:
        return ChatSettings(**d)
    except (TypeError, ChatError) as e:
        raise ChatError(f"session {sess.id}: unusable settings ({e})") from None
