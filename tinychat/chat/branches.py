"""The Chat's branch operations (issue #14; sessions/tree.py has the tree itself): edit an earlier message into a new
branch, fork a reply at a token, list and switch a reply's alternatives. The cache follows the active path: cut back to the switched turn's
mark, then the new path's part put back from what the chat kept when it left it (branch_cache.py) or fed by the
restore rule (one prefill per turn, one decoder step per sampled token), so it is bit-identical to the cache that
path was decoded with. A mixin of Chat (runtime.py), which owns the cache, the marks and the turn loop."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from ..sessions import session as S
from ..sessions import tree as T
from ..numbers import is_count
from ..settings import ChatError, ChatSettings


@dataclass(frozen=True)
class Fork:
    """A reply forced at a token: its sampled tokens before `position` kept, `token` forced there, then sampling goes on
    with a new seed. `given` is what the turn steps before it samples (the kept tokens, then the forced one); the
    stop token forced ends the reply there. Recorded in the reply as {"position", "token"}: the kept tokens are the
    reply's own first `position` tokens, so a replay rebuilds `given` from the record (recorded_fork)."""
    position: int
    token: int
    given: tuple[int, ...]

    def record(self) -> dict:
        return {"position": self.position, "token": self.token}


def turn_settings(base: ChatSettings, rec: S.Message) -> ChatSettings:
    """The settings a recorded reply was sampled with (its recorded sampler settings over `base`; the system prompt
    stays base's). ChatError for settings this version cannot take."""
    known = {f.name for f in dataclasses.fields(ChatSettings)} - {"system_prompt"}
    d = {k: v for k, v in (rec.settings or {}).items() if k in known}
    d.setdefault("ban_reply", False)      # turns recorded before the reply ban existed were sampled without it
    d["seed"] = rec.seed if rec.seed is not None else d.get("seed")
    try:
        return dataclasses.replace(base, **d)
    except (TypeError, ChatError) as e:
        raise ChatError(f"unusable turn settings ({e})") from None


class BranchesMixin:
    """Chat's branch methods; they use Chat's session, cache, _marks, _pending, _left, _play, _turn, _rebuild."""

    def edit(self, index: int, text: str, on_token=None, trace: bool | None = None, on_reply=None):
        """Send `text` in place of the active path's user message `index`: a new branch from there (the edited
        message is a sibling of the old one, which stays in the tree with what followed it); returns the reply's
        TurnResult, as send() does."""
        msgs = self.session.messages
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        self.check_length(text)
        if not 0 <= index < len(msgs) or msgs[index].role != "user":
            raise ChatError(f"message {index} is not one of your messages")
        T.link(self.session)
        first = 1 if msgs and msgs[0].role == "system" else 0
        turn = (index - first) // 2
        mark = self._marks[turn] if len(self._marks) == self.session.n_turns else None
        old = msgs[index:]
        if mark is not None:
            self._left.leave(tuple(m.id for m in msgs), self.cache, mark, self._marks[turn:], self._pending)
        del msgs[index:]
        self.session.branches.extend(old)
        self._cut_back(turn, mark)
        user = S.Message("user", text, self.tok.message_ids("user", text))
        try:
            return self._turn(user, on_token, self.trace if trace is None else trace, on_reply=on_reply)
        except BaseException:                   # the old branch stays the active one, the cache rebuilt to it
            del msgs[index:]
            msgs.extend(old)
            self.session.branches = [m for m in self.session.branches if all(m is not o for o in old)]
            self._rebuild()
            raise

    def fork(self, position: int, token: int | str, index: int | None = None, on_token=None, trace: bool | None = None,
             on_reply=None, seed: int | None = None):
        """Fork the active path's reply `index` (default: the last) at its token `position` (0-based; its length: go
        on past where it ended): the tokens before it kept, `token` (an id, or text that is exactly one token)
        forced there, and decoding goes on with that turn's own settings and a new seed (`seed`, else the fixed seed
        of the current settings, else a fresh one; recorded). The new reply is a sibling of the old one (which stays
        in the tree with what followed it) and the active one; returns its TurnResult, as send() does. ChatError,
        with nothing changed, for a position or token it cannot take or a fork that does not fit the context."""
        if seed is None:
            seed = self.settings.seed if self.settings.seed is not None else random.SystemRandom().randrange(2 ** 63)
        index, fork, st = self._fork_plan(position, token, index, seed)
        msgs = self.session.messages
        old = msgs[index]
        T.link(self.session)
        first = 1 if msgs and msgs[0].role == "system" else 0
        turn = (index - 1 - first) // 2
        mark = self._marks[turn] if len(self._marks) == self.session.n_turns else None
        tail = msgs[index - 1:]                  # the turn's user message, the old reply, what followed them
        if mark is not None:
            self._left.leave(tuple(m.id for m in msgs), self.cache, mark, self._marks[turn:], self._pending)
        del msgs[index - 1:]
        self._cut_back(turn, mark)
        try:
            res = self._turn(tail[0], on_token, self.trace if trace is None else trace, on_reply=on_reply,
                             autosave=False, context_start=(old.settings or {}).get("context_start"), fork=fork,
                             settings=st)        # the turn's own settings; the chat's (and the next turn's) stay
        except BaseException:                   # the old reply stays the active one, the cache rebuilt to it
            del msgs[index - 1:]
            msgs.extend(tail)
            self._rebuild()
            raise
        self.session.branches.extend(tail[1:])
        T.link(self.session)
        res.save_warning = self._autosave()
        return res

    def check_fork(self, position: int, token: int | str, index: int | None = None) -> int:
        """What fork() would refuse, refused the same way (ChatError), without changing anything; returns the token
        id to force."""
        return self._fork_plan(position, token, index, 0)[1].token

    def _fork_plan(self, position, token, index, seed: int):
        """(reply index, Fork, the turn's settings with `seed`) for a fork; ChatError for one it cannot take."""
        index = self._reply_index(index)
        old = self.session.messages[index]
        content = self._content(old)
        tok_id = self._fork_token(token)
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= len(content):
            raise ChatError(f"no token {position} in this reply: it has {len(content)} (fork at 0..{len(content)})")
        st = dataclasses.replace(turn_settings(self.settings, old), seed=seed)
        if tok_id != self.stop_id and position + 1 > st.max_new:
            raise ChatError(f"token {position} is this turn's last (max-new {st.max_new}): nothing can follow it")
        return index, Fork(position, tok_id, tuple(content[:position]) + (tok_id,)), st

    def _fork_token(self, token: int | str) -> int:
        """A token to force: an id (int, or digits), or text that is exactly one token (" cat")."""
        if isinstance(token, str) and not is_count(token.strip()):
            ids = self.tok.encode(token)
            if len(ids) != 1:
                raise ChatError(f"{token!r} is {len(ids)} tokens, not one: give a token id, or the text of one token")
            token = ids[0]
        elif isinstance(token, bool) or not isinstance(token, (int, str)):
            raise ChatError(f"not a token: {token!r}")
        token = int(token)
        V = self.model.cfg.vocab_size
        if not 0 <= token < V:
            raise ChatError(f"token {token} is outside the model's vocabulary (0..{V - 1})")
        if token in self._special and token != self.stop_id:
            raise ChatError(f"token {token} is a special token: of those only the stop token can be forced (it ends "
                            f"the reply)")
        return token

    def recorded_fork(self, rec: S.Message) -> Fork | None:
        """The Fork a recorded reply was made with (None: not a fork), its kept tokens taken from the reply itself.
        ChatError when the record cannot be one (a position past the reply, a token the model does not have)."""
        if not rec.fork:
            return None
        content = self._content(rec)
        p, t = rec.fork["position"], rec.fork["token"]
        if p > len(content):
            raise ChatError(f"session {self.session.id}: a reply forked at token {p} has only {len(content)}")
        if not 0 <= t < self.model.cfg.vocab_size:
            raise ChatError(f"session {self.session.id}: a reply forked to token {t}, outside the model's vocabulary")
        return Fork(p, t, tuple(content[:p]) + (t,))

    def edit_reply(self, index: int | None, text: str) -> tuple[int, int]:
        """Put `text`, as written, in place of the active path's reply `index` (default: the last): a new sibling of
        it (finish "edited"; the turn's settings and seed kept for the record), active, with nothing after it, so
        the user types on from there; the old reply and what followed it stay in the tree. Its tokens are fed by
        the restore rule (one decoder step each), so a restore gives the same cache. Returns (place, count).
        ChatError, with nothing changed, for an empty text or one that does not fit the context."""
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        self.check_length(text)
        index = self._reply_index(index)
        msgs = self.session.messages
        old = msgs[index]
        ids = self.tok.message_ids("assistant", text)
        if max(ids) >= self.model.cfg.vocab_size:
            raise ChatError(f"token id {max(ids)} is outside the model's vocabulary")
        before = sum(len(m.token_ids) for m in msgs[:index]) + len(self._pending)
        if before + len(ids) > self.max_len:
            raise ChatError(f"the edited reply does not fit the {self.max_len}-token context")
        T.link(self.session)
        first = 1 if msgs and msgs[0].role == "system" else 0
        turn = (index - 1 - first) // 2
        mark = self._marks[turn] if len(self._marks) == self.session.n_turns else None
        if mark is not None:
            self._left.leave(tuple(m.id for m in msgs), self.cache, mark, self._marks[turn:], self._pending)
        tail = msgs[index:]
        new = S.Message("assistant", text, ids, settings=dict(old.settings or {}), seed=old.seed, finish="edited")
        del msgs[index:]
        msgs.append(new)
        self.session.branches.extend(tail)
        T.link(self.session)
        try:
            if not self._cut_back(turn, mark):
                self._play(msgs[index - 1], new, index - 1)
        except BaseException:                   # the old branch stays the active one, the cache rebuilt to it
            del msgs[index:]
            msgs.extend(tail)
            self.session.branches = [m for m in self.session.branches if all(m is not o for o in tail)]
            self._rebuild()
            raise
        self._autosave()
        return self.alternatives(index)

    def alternatives(self, index: int | None = None) -> tuple[int, int]:
        """(1-based place, count) of the active path's message `index` (default: the last reply; a user message: its
        edits) among its siblings."""
        index = self._alt_index(index)
        sibs, at = T.siblings(self.session, index)
        return at + 1, len(sibs)

    def switch_alternative(self, which: str | int, index: int | None = None) -> tuple[int, int]:
        """Make another alternative of message `index` active (default: the last reply; a user message: one of its
        edits, with the replies that followed it): "next", "prev" or a 1-based number. The cache is cut back to the
        turn before it and the new branch's turns are fed by the restore rule (one prefill per turn, one step per
        sampled token), so it is the cache that branch was decoded with. Returns (place, count). ChatError (nothing
        changed) for a number out of range."""
        index = self._alt_index(index)
        sibs, at = T.siblings(self.session, index)
        n = len(sibs)
        what = "reply" if self.session.messages[index].role == "assistant" else "message"
        if which == "next":
            to = (at + 1) % n
        elif which == "prev":
            to = (at - 1) % n
        elif isinstance(which, int) or is_count(which):
            k = int(which)
            if not 1 <= k <= n:
                raise ChatError(f"no alternative {k}: this {what} has {n} (1..{n})" if n > 1
                                else f"no alternative {k}: this {what} has no others "
                                     f"({'regenerate' if what == 'reply' else 'editing it'} makes one)")
            to = k - 1
        else:
            raise ChatError("usage: /alt next|prev|N")
        if to != at:
            self._switch(index, sibs[to])
            self._autosave()
        return to + 1, n

    def _cut_back(self, turn: int, mark) -> bool:
        """The cache back to the start of turn `turn` (its mark), the marks and pending ids with it; with no mark
        known, the active path rebuilt instead (True)."""
        if mark is None:
            self._rebuild()
            return True
        msgs = self.session.messages
        self.cache.truncate(mark)
        del self._marks[turn:]
        system = msgs[0].token_ids if msgs and msgs[0].role == "system" else []
        self._pending = self.tok.end_ids()[1:] if turn > 0 else list(system)
        return False

    def _alt_index(self, index: int | None) -> int:
        """A reply's or a user message's index (None: the last reply); ChatError for the system prompt."""
        msgs = self.session.messages
        if index is not None and 0 <= index < len(msgs) and msgs[index].role == "user":
            return index
        return self._reply_index(index)

    def _reply_index(self, index: int | None) -> int:
        msgs = self.session.messages
        if index is None:
            index = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "assistant"), None)
            if index is None:
                raise ChatError("no reply yet")
        if not 0 <= index < len(msgs) or msgs[index].role != "assistant":
            raise ChatError(f"message {index} is not a reply")
        return index

    def _switch(self, index: int, target: S.Message) -> None:
        """Activate `target` in place of messages[index] (a reply, or a user message), moving the cache to the new
        path: cut back to the mark before that turn, then feed the new path's turns as they ran live."""
        msgs = self.session.messages
        first = 1 if msgs and msgs[0].role == "system" else 0
        start = index if msgs[index].role == "user" else index - 1    # the turn's user message
        turn = (start - first) // 2              # 0-based turn
        marks_known = len(self._marks) == self.session.n_turns   # not after a snapshot restore
        left = tuple(m.id for m in msgs)
        T.switch(self.session, index, target)
        mark = self._marks[turn] if marks_known else None
        if mark is None:                         # a shortened-context turn, or marks unknown: rebuild exactly
            self._rebuild()
            return
        self._left.leave(left, self.cache, mark, self._marks[turn:], self._pending)
        self.cache.truncate(mark)
        del self._marks[turn:]
        kept = self._left.enter(tuple(m.id for m in msgs), self.cache, mark)
        if kept is not None:                     # a path this chat left earlier: its exact cache, put back
            self._marks += kept[0]
            self._pending = kept[1]
            return
        self._pending = self.tok.end_ids()[1:] if turn > 0 else list(msgs[0].token_ids if first else [])
        for at in range(start, len(msgs) - 1, 2):
            self._play(msgs[at], msgs[at + 1], at)
