"""A chat's branch operations (issue #14; sessions/tree.py has the tree itself): regenerate, edit an earlier
message into a new branch, fork a reply at a token, write a reply by hand, list and switch a message's alternatives.
The cache follows the active path through the chat's timeline (timeline.py): cut back to the changed turn's mark,
then the new path's part put back from what the chat kept when it left it (branch_cache.py) or fed by the restore
rule (one prefill per turn, one decoder step per sampled token), so it is bit-identical to the cache that path was
decoded with. A collaborator of Chat (runtime.py), on the chat's public names: its session, timeline, run_turn."""
from __future__ import annotations

import dataclasses
import random

from ..numbers import is_count
from ..sessions import tree
from ..sessions.session import Message
from ..settings import ChatError, ChatSettings
from .timeline import turn_of
from .turns import Fork, TurnPlan

__all__ = ["Branches", "Fork", "turn_settings"]


def turn_settings(base: ChatSettings, rec: Message) -> ChatSettings:
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


class Branches:
    """Chat's branch operations. chat: the Chat they work on (its session, timeline, settings, run_turn, ...)."""

    def __init__(self, chat):
        self.chat = chat

    def _plan(self, user: Message, on_token, trace: bool | None, on_reply, **kw) -> TurnPlan:
        return TurnPlan(user, trace=self.chat.trace if trace is None else trace, on_token=on_token,
                        on_reply=on_reply, **kw)

    def _fail_back(self, cut: int, restore: list[Message], dropped: list[Message] = ()) -> None:
        """An operation failed (or was cancelled) part-way: the old branch the active one again (messages[cut:] =
        `restore`, `dropped` taken back out of the branches), the cache rebuilt to it."""
        chat = self.chat
        msgs = chat.session.messages
        del msgs[cut:]
        msgs.extend(restore)
        if dropped:
            chat.session.branches = [m for m in chat.session.branches if all(m is not o for o in dropped)]
        chat.timeline.rebuild(chat.session)

    def regenerate(self, on_token=None, trace: bool | None = None, on_reply=None,
                   settings: ChatSettings | None = None):
        """Sample the last reply again (a new seed unless the settings fix one). The old reply is kept: the new one
        becomes its sibling (an alternative, sessions/tree.py) and the active one. settings: this reply's own (the
        sampler A/B, ab.py; recorded with the reply), else the chat's."""
        chat = self.chat
        msgs = chat.session.messages
        if len(msgs) < 2 or msgs[-1].role != "assistant":
            raise ChatError("no turn to take back")
        tree.link(chat.session)
        old, at = msgs[-1], len(msgs) - 2
        chat.timeline.keep_path(chat.session, chat.session.n_turns - 1)     # switching back is a copy
        user = chat.timeline.pop_turn(chat.session)
        try:
            res = chat.run_turn(self._plan(user, on_token, trace, on_reply, autosave=False, settings=settings))
        except BaseException:                   # the old reply stays the active one, the cache rebuilt to it
            self._fail_back(at, [user, old])
            raise
        chat.session.branches.append(old)
        tree.link(chat.session)
        res.save_warning = chat.autosave_now()
        return res

    def edit(self, index: int, text: str, on_token=None, trace: bool | None = None, on_reply=None):
        """Send `text` in place of the active path's user message `index`: a new branch from there (the edited
        message is a sibling of the old one, which stays in the tree with what followed it); returns the reply's
        TurnResult, as send() does."""
        chat = self.chat
        msgs = chat.session.messages
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        chat.check_length(text)
        if not 0 <= index < len(msgs) or msgs[index].role != "user":
            raise ChatError(f"message {index} is not one of your messages")
        tree.link(chat.session)
        turn = turn_of(msgs, index)
        mark = chat.timeline.keep_path(chat.session, turn)
        old = msgs[index:]
        del msgs[index:]
        chat.session.branches.extend(old)
        chat.timeline.cut_back(chat.session, turn, mark)
        user = Message("user", text, chat.tok.message_ids("user", text))
        try:
            return chat.run_turn(self._plan(user, on_token, trace, on_reply))
        except BaseException:                   # the old branch stays the active one, the cache rebuilt to it
            self._fail_back(index, old, old)
            raise

    def fork(self, position: int, token: int | str, index: int | None = None, on_token=None, trace: bool | None = None,
             on_reply=None, seed: int | None = None):
        """Fork the active path's reply `index` (default: the last) at its token `position` (0-based; its length: go
        on past where it ended): the tokens before it kept, `token` (an id, or text that is exactly one token)
        forced there, and decoding goes on with that turn's own settings and a new seed (`seed`, else the fixed seed
        of the current settings, else a fresh one; recorded). The new reply is a sibling of the old one (which stays
        in the tree with what followed it) and the active one; returns its TurnResult, as send() does. ChatError,
        with nothing changed, for a position or token it cannot take or a fork that does not fit the context."""
        chat = self.chat
        if seed is None:
            seed = chat.settings.seed if chat.settings.seed is not None else random.SystemRandom().randrange(2 ** 63)
        index, fork, st = self._fork_plan(position, token, index, seed)
        msgs = chat.session.messages
        old = msgs[index]
        tree.link(chat.session)
        turn = turn_of(msgs, index)
        tail = msgs[index - 1:]                  # the turn's user message, the old reply, what followed them
        mark = chat.timeline.keep_path(chat.session, turn)
        del msgs[index - 1:]
        chat.timeline.cut_back(chat.session, turn, mark)
        try:                                     # the turn's own settings; the chat's (and the next turn's) stay
            res = chat.run_turn(self._plan(tail[0], on_token, trace, on_reply, autosave=False, settings=st,
                                           context_start=(old.settings or {}).get("context_start"), fork=fork))
        except BaseException:                   # the old reply stays the active one, the cache rebuilt to it
            self._fail_back(index - 1, tail)
            raise
        chat.session.branches.extend(tail[1:])
        tree.link(chat.session)
        res.save_warning = chat.autosave_now()
        return res

    def check_fork(self, position: int, token: int | str, index: int | None = None) -> int:
        """What fork() would refuse, refused the same way (ChatError), without changing anything; returns the token
        id to force."""
        return self._fork_plan(position, token, index, 0)[1].token

    def _fork_plan(self, position, token, index, seed: int):
        """(reply index, Fork, the turn's settings with `seed`) for a fork; ChatError for one it cannot take."""
        chat = self.chat
        index = self._reply_index(index)
        old = chat.session.messages[index]
        content = chat.timeline.content(old)
        tok_id = self._fork_token(token)
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= len(content):
            raise ChatError(f"no token {position} in this reply: it has {len(content)} (fork at 0..{len(content)})")
        st = dataclasses.replace(turn_settings(chat.settings, old), seed=seed)
        if tok_id != chat.stop_id and position + 1 > st.max_new:
            raise ChatError(f"token {position} is this turn's last (max-new {st.max_new:,}): nothing can follow it")
        return index, Fork(position, tok_id, tuple(content[:position]) + (tok_id,)), st

    def _fork_token(self, token: int | str) -> int:
        """A token to force: an id (int, or digits), or text that is exactly one token (" cat")."""
        chat = self.chat
        if isinstance(token, str) and not is_count(token.strip()):
            ids = chat.tok.encode(token)
            if len(ids) != 1:
                raise ChatError(f"{token!r} is {len(ids)} tokens, not one: give a token id, or the text of one token")
            token = ids[0]
        elif isinstance(token, bool) or not isinstance(token, (int, str)):
            raise ChatError(f"not a token: {token!r}")
        token = int(token)
        vocab = chat.model.cfg.vocab_size
        if not 0 <= token < vocab:
            raise ChatError(f"token {token} is outside the model's vocabulary (0..{vocab - 1})")
        if token in chat.special_ids and token != chat.stop_id:
            raise ChatError(f"token {token} is a special token: of those only the stop token can be forced (it ends "
                            f"the reply)")
        return token

    def recorded_fork(self, rec: Message) -> Fork | None:
        """The Fork a recorded reply was made with (None: not a fork), its kept tokens taken from the reply itself.
        ChatError when the record cannot be one (a position past the reply, a token the model does not have)."""
        chat = self.chat
        if not rec.fork:
            return None
        content = chat.timeline.content(rec)
        p, t = rec.fork["position"], rec.fork["token"]
        if p > len(content):
            raise ChatError(f"session {chat.session.id}: a reply forked at token {p} has only {len(content)}")
        if not 0 <= t < chat.model.cfg.vocab_size:
            raise ChatError(f"session {chat.session.id}: a reply forked to token {t}, outside the model's vocabulary")
        return Fork(p, t, tuple(content[:p]) + (t,))

    def edit_reply(self, index: int | None, text: str) -> tuple[int, int]:
        """Put `text`, as written, in place of the active path's reply `index` (default: the last): a new sibling of
        it (finish "edited"; the turn's settings and seed kept for the record), active, with nothing after it, so
        the user types on from there; the old reply and what followed it stay in the tree. Its tokens are fed by
        the restore rule (one decoder step each), so a restore gives the same cache. Returns (place, count).
        ChatError, with nothing changed, for an empty text or one that does not fit the context."""
        chat = self.chat
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
        chat.check_length(text)
        index = self._reply_index(index)
        msgs = chat.session.messages
        old = msgs[index]
        ids = chat.tok.message_ids("assistant", text)
        if max(ids) >= chat.model.cfg.vocab_size:
            raise ChatError(f"token id {max(ids)} is outside the model's vocabulary")
        before = sum(len(m.token_ids) for m in msgs[:index]) + len(chat.timeline.pending)
        if before + len(ids) > chat.max_len:
            raise ChatError(f"the edited reply does not fit the {chat.max_len:,}-token context")
        tree.link(chat.session)
        turn = turn_of(msgs, index)
        mark = chat.timeline.keep_path(chat.session, turn)
        tail = msgs[index:]
        new = Message("assistant", text, ids, settings=dict(old.settings or {}), seed=old.seed, finish="edited")
        del msgs[index:]
        msgs.append(new)
        chat.session.branches.extend(tail)
        tree.link(chat.session)
        try:
            if not chat.timeline.cut_back(chat.session, turn, mark):
                chat.timeline.play(msgs, index - 1)
        except BaseException:                   # the old branch stays the active one, the cache rebuilt to it
            self._fail_back(index, tail, tail)
            raise
        chat.autosave_now()
        return self.alternatives(index)

    def alternatives(self, index: int | None = None) -> tuple[int, int]:
        """(1-based place, count) of the active path's message `index` (default: the last reply; a user message: its
        edits) among its siblings."""
        index = self._alt_index(index)
        sibs, at = tree.siblings(self.chat.session, index)
        return at + 1, len(sibs)

    def switch_alternative(self, which: str | int, index: int | None = None) -> tuple[int, int]:
        """Make another alternative of message `index` active (default: the last reply; a user message: one of its
        edits, with the replies that followed it): "next", "prev" or a 1-based number. The cache is cut back to the
        turn before it and the new branch's turns are fed by the restore rule (one prefill per turn, one step per
        sampled token), so it is the cache that branch was decoded with. Returns (place, count). ChatError (nothing
        changed) for a number out of range."""
        chat = self.chat
        index = self._alt_index(index)
        sibs, at = tree.siblings(chat.session, index)
        n = len(sibs)
        what = "reply" if chat.session.messages[index].role == "assistant" else "message"
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
            chat.timeline.switch(chat.session, index, sibs[to], tree.switch)
            chat.autosave_now()
        return to + 1, n

    def _alt_index(self, index: int | None) -> int:
        """A reply's or a user message's index (None: the last reply); ChatError for the system prompt."""
        msgs = self.chat.session.messages
        if index is not None and 0 <= index < len(msgs) and msgs[index].role == "user":
            return index
        return self._reply_index(index)

    def _reply_index(self, index: int | None) -> int:
        msgs = self.chat.session.messages
        if index is None:
            index = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "assistant"), None)
            if index is None:
                raise ChatError("no reply yet")
        if not 0 <= index < len(msgs) or msgs[index].role != "assistant":
            raise ChatError(f"message {index} is not a reply")
        return index
