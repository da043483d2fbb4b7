"""The adapter between the server and the chat runtime: the only module here that talks to Chat. Runs on the worker
thread alone (Chat is not thread-safe; `cancel` is the one call another thread may make).

A request's messages onto the one Chat (prefix reuse): the Chat holds the conversation it served last, its KV cache
exactly as the chat runtime's feed schedule left it. A request whose system prompt and earlier turns are that
conversation's (same texts; the chat's own recorded tokens stand for its replies) extends it: the cache is kept and
only the new message is prefilled. A request that shares the first k turns takes the later ones back (Chat.undo:
the cache cut back to its mark). A request that brings turns the chat never had (replies written by the client) gets
a Chat restored from a session built of them (the restore rule: one prefill per turn, one step per reply token). A
reply this server sampled in that same conversation comes back as it was recorded (its sampled token ids, seed and
settings: text re-encoded would be other tokens); any other is recorded as "edited" (given as written). So every turn
runs on the context a live chat would have: the same tokens for the same seed and settings as `tinychat -p`, the
same reply whether the cache was kept or rebuilt, and each request saved as a session replays exactly."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import bad
from .logprobs import entry
from .schema import TurnRequest
from .stops import StopScanner

REMEMBERED = 512        # replies remembered (their recorded tokens) for conversations that come back later


@dataclass
class Delta:
    """Reply text given out, with the logprobs entries of its tokens (and each one's character offset)."""
    text: str
    entries: list[dict]
    offsets: list[int]


@dataclass
class Outcome:
    text: str
    finish: str                 # stop, length (cancelled: the client went away; nobody reads it)
    completion_tokens: int      # tokens sampled (a stop string's own included)
    prompt_tokens: int          # the context the reply was decoded on (cached ones included)
    cached_tokens: int          # of those, how many the KV cache already held (prefix reuse)
    seed: int
    session: str | None = None  # the saved session's id (--save-sessions)
    dropped_turns: int = 0
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0
    tokens_after_cancel: int | None = None   # tokens sampled after cancel was asked (None: never asked)


class ChatRunner:
    """Owns the one Chat: the model's decoder and KV cache."""

    def __init__(self, rt, quant: str, device: str = "cpu", options=None, save_dir: Path | None = None,
                 quant_why: str | None = None):
        from tinychat.loading import open_chat
        self.rt = rt
        self.chat = open_chat(rt, quant, device, None, {}, None, options, quant_why=quant_why, autosave=False)
        self.base = self.chat.settings          # tinychat's < the model's defaults (sampler.json, template system)
        self.model_id = rt.name
        self.save_dir = save_dir
        self.options = options
        self._replies: collections.OrderedDict[str, object] = collections.OrderedDict()   # _key -> reply Message

    @property
    def tok(self):
        return self.chat.tok

    def cancel(self) -> None:
        """Stop the running turn at its next token (any thread)."""
        self.chat.cancel()

    def status(self) -> dict:
        return self.chat.status()

    # -- one request --------------------------------------------------------------------------------------------
    def run(self, req: TurnRequest, sink, cancelled) -> Outcome:
        """One turn for `req`: sink(Delta) as text is settled (from this thread); cancelled() -> True stops it at
        the next token. ApiError for what the request cannot have."""
        from tinychat.chat import ChatError
        system = self.base.system_prompt if req.system is None else req.system
        try:
            st = dataclasses.replace(self.base, system_prompt=system, **req.settings)
        except ChatError as e:
            raise bad(str(e)) from None
        try:
            kept = self._sync(system, req.history, st)
        except ChatError as e:
            raise bad(str(e), "messages") from None
        chat = self.chat
        chat.settings = st
        room = chat.max_new_room()
        if st.max_new > room:
            raise bad(f"max_tokens {st.max_new:,} does not fit the model's {chat.max_len:,}-token context (at most "
                      f"{max(room, 0):,} here)", "max_tokens", "context_length_exceeded")
        try:
            chat.check_length(req.user)
        except ChatError as e:
            raise bad(str(e), "messages", "context_length_exceeded") from None
        before = chat.status()["cache_tokens"]  # the context already in the cache (kept, or just restored)
        cached = before if kept else 0
        stream = _Stream(chat.tok, req, sink)
        cancel_seen: list[int] = []

        def on_token(i, tid, piece, tr, ms):
            stream.token(tid, piece, tr)
            if stream.scanner.stopped_at is not None:
                chat.cancel()                   # a stop string: the turn ends before its next draw
            if cancelled():
                if not cancel_seen:
                    cancel_seen.append(stream.n_tokens)
                chat.cancel()

        trace = (req.top_logprobs or True) if req.logprobs else False
        try:
            res = chat.send(req.user, on_token=on_token, trace=trace)
        except ChatError as e:
            raise bad(str(e), "messages", "context_length_exceeded" if "context" in str(e) else None) from None
        stream.end()
        finish = "stop" if stream.scanner.stopped_at is not None else res.finish
        out = Outcome(text=stream.given, finish=finish, completion_tokens=res.n_tokens,
                      prompt_tokens=res.prefill_tokens + (before if not res.dropped_turns else 0),
                      cached_tokens=cached if not res.dropped_turns else 0, seed=res.seed,
                      dropped_turns=res.dropped_turns, ttft_ms=res.ttft_ms, decode_tok_s=res.decode_tok_s,
                      tokens_after_cancel=res.n_tokens - cancel_seen[0] if cancel_seen else None)
        if finish in ("stop", "length") and stream.scanner.stopped_at is None:    # what the client got, whole
            self._remember(_key(system, req.history, req.user, out.text), chat.session.messages[-1])
        if self.save_dir is not None:
            from .saving import save_copy
            out.session = save_copy(chat.session, self.save_dir)
        return out

    # -- the conversation -------------------------------------------------------------------------------------
    def _sync(self, system: str, history: list[tuple[str, str]], st) -> bool:
        """Bring the chat to `system` + `history` (the turns before the new message); True when its cache was kept
        (what it holds is reused), False when it was rebuilt."""
        chat = self.chat
        sess = chat.session
        k = 0
        if sess.system_prompt == system:
            turns = _turns(sess.messages)
            while k < min(len(turns), len(history)) and turns[k] == history[k]:
                k += 1
        if k == 0:
            chat.settings = dataclasses.replace(chat.settings, system_prompt=system)
            chat.new_session()                  # a new conversation: the system prompt is fed with its first turn
        else:
            while chat.session.n_turns > k:
                chat.undo()                     # the cache cut back to the turn's mark (exact)
        if len(history) == k:
            return True
        self._restore(system, history, k, st)
        return False

    def _remember(self, key: str, reply) -> None:
        self._replies[key] = reply
        self._replies.move_to_end(key)
        while len(self._replies) > REMEMBERED:
            self._replies.popitem(last=False)

    def _restore(self, system: str, history: list[tuple[str, str]], k: int, st) -> None:
        """A Chat restored from the current conversation (its first k turns) plus history[k:]: each reply as this
        server recorded it when it sampled it in this conversation, else as written (recorded "edited": given,
        never sampled)."""
        from tinychat.sessions import session as session_files
        from tinychat.chat import Chat
        old = self.chat
        tok = old.tok
        sess = dataclasses.replace(old.session, id=session_files.new_id(), messages=list(old.session.messages), branches=[],
                                   revision=0, kv_sha256="")
        n = sum(len(m.token_ids) for m in sess.messages)
        for j in range(k, len(history)):
            user, reply = history[j]
            sess.messages.append(session_files.Message("user", user, tok.message_ids("user", user)))
            known = self._replies.get(_key(system, history[:j], user, reply))
            if known is not None:
                sess.messages.append(dataclasses.replace(known, id=0, parent=None))
            else:
                sess.messages.append(session_files.Message("assistant", reply, tok.message_ids("assistant", reply),
                                               settings={**st.sampler(), "seed": 0}, seed=0, finish="edited"))
            n += len(sess.messages[-1].token_ids) + len(sess.messages[-2].token_ids)
        if n + st.max_new + 1 > old.max_len:
            raise bad(f"the conversation ({n:,} tokens) and max_tokens {st.max_new:,} do not fit the model's "
                      f"{old.max_len:,}-token context", "messages", "context_length_exceeded")
        for m in sess.messages:
            if max(m.token_ids, default=0) >= old.model.cfg.vocab_size:
                raise bad("a message holds a token outside the model's vocabulary", "messages")
        self.chat = Chat.restore(sess, old.model, tok, settings=st, plan=old.plan,   # the plan the server decided
                                 model_name=old.model_name, model_hash=old.model_hash, autosave=False,
                                 max_len=old.max_len)
        old.close()


def _key(system: str, history, user: str, reply: str) -> str:
    """A reply's place: the whole conversation that led to it, and its text."""
    return hashlib.sha256(json.dumps([system, [list(t) for t in history], user, reply]).encode()).hexdigest()


def _turns(msgs) -> list[tuple[str, str]]:
    """The (user, assistant) texts of a chat's active path."""
    body = [m for m in msgs if m.role != "system"]
    return [(body[i].content, body[i + 1].content) for i in range(0, len(body) - 1, 2)]


class _Stream:
    """One turn's tokens -> Deltas: the text through the stop strings' hold-back, each token's logprobs entry given
    out with the text it ends in (dropped with a stop string's)."""

    def __init__(self, tok, req: TurnRequest, sink):
        self.tok, self.req, self.sink = tok, req, sink
        self.scanner = StopScanner(req.stop)
        self.pending: list[tuple[int, int, dict]] = []    # (start, end) offsets in the reply, entry
        self.total = 0
        self.n_tokens = 0
        self.given = ""

    def token(self, tid: int, piece: str, tr) -> None:
        if tid >= 0:
            self.n_tokens += 1
        if self.scanner.stopped_at is not None:
            return
        start = self.total
        self.total += len(piece)
        if tid >= 0 and tr is not None and self.req.logprobs:
            self.pending.append((start, self.total, entry(self.tok, tr, self.req.top_logprobs)))
        self._give(self.scanner.push(piece))

    def end(self) -> None:
        self._give(self.scanner.flush(), last=True)

    def _give(self, text: str, last: bool = False) -> None:
        stop = self.scanner.stopped_at
        if stop is not None:
            out = [p for p in self.pending if p[0] < stop]
            self.pending = []
        elif last:
            out, self.pending = self.pending, []
        else:
            upto = self.scanner.released
            out = [p for p in self.pending if p[1] <= upto]
            self.pending = self.pending[len(out):]
        self.given += text
        if text or out:
            self.sink(Delta(text, [p[2] for p in out], [p[0] for p in out]))
