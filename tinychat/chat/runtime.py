"""The chat runtime's facade: `Chat`, one conversation with one model on one batch-1 KV cache (each turn appends only
its new tokens), recorded to the token and autosaved. What its users call (the app, plain mode, serve, replay, /ab,
tests); the work is done by what it owns:

timeline.py  CacheTimeline: the cache, the marks, the pending ids, the caches of paths left: the restore rule
turns.py     TurnRunner: a turn (TurnPlan in, TurnResult out; GenerateConfig: how it samples); the context-full policy
store.py     SessionStore: save, lock, snapshot, the autosave's result
branches.py  Branches: regenerate, edit, fork, alternatives (sessions/tree.py)
quant_steps.py  Int8Steps: which int8 step runs, by the name sessions record

How the model runs (its quant mode, kernels, prefill GEMM) is the ExecutionPlan (plan.py) loading decided."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..engine import Decoder, EngineOptions, KVCache
from ..identity import model_identity, other_model
from ..model import TinyAgentLM
from ..plan import ExecutionPlan
from ..plan import decide as decide_plan
from ..sampler import LIFT_ALL
from ..sessions import session as session_files
from ..sessions import snapshot
from ..sessions import tree
from ..sessions.session import Message, Session
from ..settings import ChatError, ChatSettings, OtherModel
from ..tokenizer import Tokenizer
from .branches import Branches, Fork
from .quant_steps import Int8Steps
from .store import SessionStore
from .timeline import CacheTimeline, first_turn_at
from .turns import TurnPlan, TurnResult, TurnRunner

__all__ = ["Chat", "ChatError", "ChatSettings", "Fork", "TurnPlan", "TurnResult", "check_model", "check_recorded",
           "model_identity", "settings_from_session"]


class Chat:
    """One conversation with one model. Not thread-safe except `cancel()`: run turns on one thread."""

    def __init__(self, model: TinyAgentLM, tokenizer: Tokenizer, settings: ChatSettings | None = None, *,
                 plan: ExecutionPlan | None = None, quant: str | None = None, device: str = "cpu",
                 max_len: int | None = None, model_name: str = "", model_hash: str | None = None, autosave: bool = True,
                 sessions_dir: Path | None = None, graph=None, session: Session | None = None, rebuild: bool = True,
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
        self.cache = KVCache(model, 1, self.max_len, self.device, dtype=plan.kv_dtype())   # fp16 / fp32 / bf16
        self.decoder = Decoder(model, self.cache, graph=plan.graph, plan=plan)
        self.steps = Int8Steps(model, self.decoder, plan)
        self.timeline = CacheTimeline(model, self.cache, self.decoder, self.steps, tokenizer, plan.options.pad_shapes)
        self.runner = TurnRunner(self.timeline, self.steps, tokenizer, self.max_len, self.device)
        self.store = SessionStore(sessions_dir, autosave)
        self.branches = Branches(self)
        self.stop_id = tokenizer.im_end
        self.special_ids = frozenset(tokenizer.special_ids)
        self.trace = False
        self.session = session or self._new_session()
        self.notice: str | None = None        # one line for the user about the restore (a snapshot not used, why)
        if rebuild:
            self.timeline.rebuild(self.session)

    # -- what the store and the timeline own, by the names users read -----------------------------------------------
    @property
    def autosave(self) -> bool:
        return self.store.autosave

    @autosave.setter
    def autosave(self, on: bool) -> None:
        self.store.autosave = on

    @property
    def sessions_dir(self) -> Path | None:
        return self.store.sessions_dir

    @property
    def save_warning(self) -> str | None:
        """The last autosave's failure, one line (None: saved)."""
        return self.store.save_warning

    @property
    def used_snapshot(self) -> bool:
        """The cache came from the session's KV snapshot (not rebuilt from the token ids)."""
        return self.timeline.used_snapshot

    # -- sessions -----------------------------------------------------------------------------------------------
    def _new_session(self) -> Session:
        sess = Session.new(model={"name": self.model_name, "hash": self.model_hash, "max_len": self.max_len},
                           tokenizer_hash=self.tok.sha256, quant=self.quant, device=self.device.type,
                           settings=self.settings.sampler())
        if self.settings.system_prompt:
            sess.messages.append(Message("system", self.settings.system_prompt,
                                         self.tok.message_ids("system", self.settings.system_prompt)))
        return sess

    def new_session(self) -> None:
        """Start a fresh conversation (the current one stays saved)."""
        self.close()
        self.session = self._new_session()
        self.timeline.marks.clear()
        self.timeline.left.clear()
        self.timeline.rebuild(self.session)

    def save(self, title: str | None = None) -> Path | None:
        """Write the session (atomic) and then its KV snapshot, whose checksum the session records. Nothing to save
        before the first turn. Raises what the save raises (OSError, SessionError: SessionLocked, SessionConflict,
        SnapshotError when only the snapshot failed)."""
        if title:
            self.session.title = title
        if self.session.n_turns == 0 and not title:
            return None
        self.hold_lock()
        return self.store.write(self.session, self.cache.state_dict(), self.snapshot_meta)

    def hold_lock(self) -> None:
        """Hold the session's lock from now until close() (SessionLocked when another process has it open)."""
        self.store.hold_lock(self.session.id)

    def close(self) -> None:
        """Let go of the session's lock (another process may then open it). The chat may save again later."""
        self.store.close()

    def autosave_now(self) -> str | None:
        """Save after a change when autosaving; never raises. Returns (and keeps in `save_warning`) one line when it
        failed: the turn stays in the chat and the next save writes it."""
        return self.store.save_quietly(self.save)

    def snapshot_meta(self) -> dict[str, str]:
        """A KV snapshot's metadata: what it was made with and what the cache holds (a snapshot is used only where
        every entry is this chat's)."""
        return {**self._made_with(), **self.timeline.meta(self.session, snapshot.hash_bytes)}

    def _made_with(self) -> dict[str, str]:
        return {"model_hash": self.model_hash, "quant": self.quant, "device": self.device.type,
                "dtype": str(self.cache.gk.dtype)}

    @classmethod
    def restore(cls, session_ref, model: TinyAgentLM, tokenizer: Tokenizer, *, use_snapshot: bool = True,
                **kw) -> "Chat":
        """Continue a saved session (a Session, or an id or path as tinychat.sessions.session.load reads it): load its
        KV snapshot when it matches this model and context exactly (fast), else rebuild the cache by replaying the
        recorded feed schedule (always exact)."""
        sess = session_ref if isinstance(session_ref, Session) else \
            session_files.load(session_ref, kw.get("sessions_dir"))
        kw["model_hash"] = kw.get("model_hash") or model_identity(model)
        check_recorded(sess, model, tokenizer, kw.get("model_name", ""), kw["model_hash"])
        settings = kw.pop("settings", None) or settings_from_session(sess)
        chat = cls(model, tokenizer, settings, session=sess, rebuild=False, **kw)
        if chat.autosave:                   # one writer per session; never save over a newer copy
            chat.store.open_for_writing(sess)
        if not (use_snapshot and chat._load_snapshot()):
            chat.timeline.rebuild(chat.session)
        if getattr(sess, "notice", None):   # the file's last save had not finished (sessions/log.py)
            chat.notice = "; ".join(filter(None, [sess.notice, chat.notice]))
        return chat

    def _load_snapshot(self) -> bool:
        """Use the KV snapshot when it is the one the session recorded (its checksum) and fits this chat."""
        snap, why = self.store.read_snapshot(self.session)
        if why:
            self.notice = why
        if snap is None:
            return False
        return self.timeline.load_snapshot(self.session, snap[0], snap[1], self._made_with(), snapshot.hash_bytes)

    # -- turns ----------------------------------------------------------------------------------------------
    def settle_threads(self) -> int:
        """Let the decode step measure its thread count before the first turn (Decoder.settle_threads: steps on
        this chat's cache, put back after; ~11 steps, at most 1 s). The app calls it while the user types."""
        return self.decoder.settle_threads()

    def cancel(self) -> None:
        """Stop the running turn (thread-safe): it ends at the next token, the cache stays well-formed."""
        self.runner.cancel.set()

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
                msgs.insert(0, Message("system", new.system_prompt, self.tok.message_ids("system", new.system_prompt)))
            self.settings = new
            self.timeline.rebuild(self.session)
        self.settings = new
        return self.settings

    def send(self, text: str, on_token=None, trace: bool | None = None, on_reply=None) -> TurnResult:
        """One turn: the user's text in, the assistant's reply out. on_token(index, token_id, text_piece, trace,
        ms) is called as each token is sampled (from this thread); on_reply(result) once the turn is complete and
        before it is saved (a turn is shown, then saved: a failed save never hides the reply)."""
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        self.check_length(text)
        user = Message("user", text, self.tok.message_ids("user", text))
        return self.run_turn(TurnPlan(user, trace=self.trace if trace is None else trace, on_token=on_token,
                                      on_reply=on_reply))

    def run_turn(self, plan: TurnPlan) -> TurnResult:
        """Run one turn (every turn goes through here: send, regenerate, edit, fork, replay): the reply appended to
        the session and the cache, on_reply called, then the autosave (when plan.autosave)."""
        if plan.settings is None:
            plan = dataclasses.replace(plan, settings=self.settings)
        result = self.runner.run(plan, self.session)
        self.session.settings = self.settings.sampler()
        if plan.on_reply is not None:
            plan.on_reply(result)
        if plan.autosave:
            result.save_warning = self.autosave_now()
        return result

    def max_new_room(self) -> int:
        """The longest reply a turn can have here: the context less the system prompt, a one-token message's frame,
        the assistant header and the stop token."""
        msgs = self.session.messages
        sys_n = len(msgs[0].token_ids) if first_turn_at(msgs) else 0
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

    def undo(self) -> Message:
        """Remove the last user message and its reply, with their alternatives; returns the user message (to edit
        and resend)."""
        user = self.timeline.pop_turn(self.session)
        tree.prune(self.session)
        self.autosave_now()
        return user

    def step_name(self) -> str | None:
        """Which int8 steps run here, as sessions record them per turn (None for other modes): the decode step
        ("native-int8-v<N>" or "torch-int8", the fallback without kernels), then the prefill's GEMM where it is not
        the decode step's own rounding ("+native-prefill-v<N>", "+bf16-prefill", "+fp32-prefill"), then, where
        native kernels run, "@" and their path (avx512-vnni, avx2-vnni, neon-dotprod, ...). They round differently,
        so replay runs each turn on the step it recorded where this machine has it (quant_steps.py)."""
        return self.steps.name()

    # -- branches (branches.py) -----------------------------------------------------------------------------------
    def regenerate(self, on_token=None, trace: bool | None = None, on_reply=None,
                   settings: ChatSettings | None = None) -> TurnResult:
        """Sample the last reply again; the old one stays as its sibling (Branches.regenerate)."""
        return self.branches.regenerate(on_token, trace, on_reply, settings)

    def edit(self, index: int, text: str, on_token=None, trace: bool | None = None, on_reply=None) -> TurnResult:
        """Send `text` in place of user message `index`: a new branch from there (Branches.edit)."""
        return self.branches.edit(index, text, on_token, trace, on_reply)

    def fork(self, position: int, token: int | str, index: int | None = None, on_token=None, trace: bool | None = None,
             on_reply=None, seed: int | None = None) -> TurnResult:
        """Fork reply `index` at its token `position`, `token` forced there (Branches.fork)."""
        return self.branches.fork(position, token, index, on_token, trace, on_reply, seed)

    def check_fork(self, position: int, token: int | str, index: int | None = None) -> int:
        """What fork() would refuse, refused the same way; the token id to force (Branches.check_fork)."""
        return self.branches.check_fork(position, token, index)

    def recorded_fork(self, rec: Message) -> Fork | None:
        """The Fork a recorded reply was made with (Branches.recorded_fork)."""
        return self.branches.recorded_fork(rec)

    def edit_reply(self, index: int | None, text: str) -> tuple[int, int]:
        """Put `text` in place of reply `index`, as written (Branches.edit_reply)."""
        return self.branches.edit_reply(index, text)

    def alternatives(self, index: int | None = None) -> tuple[int, int]:
        """(1-based place, count) of message `index` among its siblings (Branches.alternatives)."""
        return self.branches.alternatives(index)

    def switch_alternative(self, which: str | int, index: int | None = None) -> tuple[int, int]:
        """Make another alternative of message `index` active (Branches.switch_alternative)."""
        return self.branches.switch_alternative(which, index)

    # -- replay ---------------------------------------------------------------------------------------------------
    def start_replay(self, sess: Session) -> None:
        """Start replaying `sess` on this (fresh) chat: the conversation becomes the session's system message alone,
        the cache rebuilt to it; then replay_turn each recorded turn in order."""
        msgs = sess.messages
        self.session.messages = list(msgs[:1] if msgs and msgs[0].role == "system" else [])
        self.timeline.left.clear()
        self.timeline.rebuild(self.session)

    def replay_turn(self, user: Message, recorded: Message, on_token=None) -> TurnResult:
        """Regenerate one recorded turn (user message, recorded reply) with the chat's current settings (a replay
        sets the recorded ones first), shortening the context where the recorded turn did, forced where a fork
        recorded it (its kept tokens taken from the record, branches.Fork), with traces and each
        step's final distribution (TurnResult.probs); then put the recorded turn in place of the regenerated one,
        in the history and in the cache, so the next turn runs on the recorded context. on_token as in send()."""
        msgs = self.session.messages
        at = len(msgs)
        if recorded.finish == "edited":         # written by the user, not sampled: given as it is
            msgs.extend([user, recorded])
            self.timeline.play(msgs, at)
            content = self.timeline.content(recorded)
            return TurnResult(text=recorded.content, token_ids=content, finish="edited", seed=recorded.seed or 0,
                              prefill_tokens=0, ttft_ms=0.0, decode_tok_s=0.0, mode=self.decoder.mode)
        pending, mark = list(self.timeline.pending), self.cache.mark()
        start = (recorded.settings or {}).get("context_start")
        res = self.run_turn(TurnPlan(Message("user", user.content, list(user.token_ids)), trace=True,
                                     on_token=on_token, keep_probs=True, context_start=start,
                                     fork=self.recorded_fork(recorded),
                                     dead_end=(recorded.settings or {}).get("dead_end", LIFT_ALL)))   # as it ran
        del msgs[at:]
        self.timeline.take_back(mark if start is None else None, pending)
        msgs.extend([user, recorded])
        self.timeline.play(msgs, at)
        return res

    # -- facts for the status bar -----------------------------------------------------------------------------
    def status(self) -> dict:
        return {"model": self.model_name, "mode": self.decoder.mode, "device": self.device.type,
                "quant": self.quant, **({"auto": self.quant_auto} if self.quant_auto else {}),
                "cache_tokens": self.timeline.length(), "max_len": self.max_len,
                "cache_bytes": self.cache.used_bytes(), "session": self.session.id, "turns": self.session.n_turns}


def check_recorded(sess: Session, model: TinyAgentLM, tokenizer: Tokenizer, name: str, identity: str) -> None:
    """OtherModel when `sess` was recorded with another model (check_model), then SessionError for token ids this
    model cannot take: before anything reads the ids (another model's are not errors in the file)."""
    check_model(sess, name, identity, tokenizer)
    session_files.check_tokens(sess, model.cfg.vocab_size, tokenizer)


def check_model(sess: Session, name: str, identity: str, tokenizer: Tokenizer) -> None:
    """OtherModel when `sess` was recorded with another model (or tokenizer) than (name, identity): checked before
    anything reads the session's token ids, whose range belongs to the recording model."""
    why = other_model(sess, name, identity)
    if why:
        was = sess.model.get("name") or ""
        raise OtherModel(f"{why}; load that model to continue it", sess.id, was, same_name=bool(was) and was == name)
    if sess.tokenizer_hash and sess.tokenizer_hash != tokenizer.sha256:
        raise OtherModel(f"session {sess.id} was recorded with another tokenizer", sess.id,
                         sess.model.get("name") or "")


def settings_from_session(sess: Session) -> ChatSettings:
    """The settings a session's next turn continues with: its last recorded ones, its system prompt."""
    known = {f.name for f in dataclasses.fields(ChatSettings)}
    d = {k: v for k, v in (sess.settings or {}).items() if k in known}
    d["system_prompt"] = sess.system_prompt
    try:
        return ChatSettings(**d)
    except (TypeError, ChatError) as e:
        raise ChatError(f"session {sess.id}: unusable settings ({e})") from None
