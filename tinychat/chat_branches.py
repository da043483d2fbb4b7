"""The Chat's branch operations (issue #14; session_tree.py has the tree itself): edit an earlier message into a new
branch, list and switch a reply's alternatives. The cache follows the active path: cut back to the switched turn's
mark, then the new path's part put back from what the chat kept when it left it (branch_cache.py) or fed by the
restore rule (one prefill per turn, one decoder step per sampled token), so it is bit-identical to the cache that
path was decoded with. A mixin of Chat (chat.py), which owns the cache, the marks and the turn loop."""
from __future__ import annotations

from . import session as S
from . import session_tree as T
from .settings import ChatError


class BranchesMixin:
    """Chat's branch methods; they use Chat's session, cache, _marks, _pending, _left, _play, _turn, _rebuild."""

    def edit(self, index: int, text: str, on_token=None, trace: bool | None = None, on_reply=None):
        """Send `text` in place of the active path's user message `index`: a new branch from there (the edited
        message is a sibling of the old one, which stays in the tree with what followed it); returns the reply's
        TurnResult, as send() does."""
        msgs = self.session.messages
        if not isinstance(text, str) or not text.strip():
            raise ChatError("empty message")
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
        if mark is None:
            self._rebuild()
        else:
            self.cache.truncate(mark)
            del self._marks[turn:]
            self._pending = self.tok.end_ids()[1:] if turn > 0 else list(msgs[0].token_ids if first else [])
        user = S.Message("user", text, self.tok.message_ids("user", text))
        try:
            return self._turn(user, on_token, self.trace if trace is None else trace, on_reply=on_reply)
        except BaseException:                   # the old branch stays the active one, the cache rebuilt to it
            del msgs[index:]
            msgs.extend(old)
            self.session.branches = [m for m in self.session.branches if all(m is not o for o in old)]
            self._rebuild()
            raise

    def alternatives(self, index: int | None = None) -> tuple[int, int]:
        """(1-based place, count) of the active path's message `index` (default: the last reply) among its
        siblings."""
        index = self._reply_index(index)
        sibs, at = T.siblings(self.session, index)
        return at + 1, len(sibs)

    def switch_alternative(self, which: str | int, index: int | None = None) -> tuple[int, int]:
        """Make another alternative of message `index` (default: the last reply) active: "next", "prev" or a 1-based
        number. The cache is cut back to the turn before it and the new branch's turns are fed by the restore rule
        (one prefill per turn, one step per sampled token), so it is the cache that branch was decoded with.
        Returns (place, count). ChatError (nothing changed) for a number out of range."""
        index = self._reply_index(index)
        sibs, at = T.siblings(self.session, index)
        n = len(sibs)
        if which == "next":
            to = (at + 1) % n
        elif which == "prev":
            to = (at - 1) % n
        elif isinstance(which, int) or (isinstance(which, str) and which.isdigit()):
            k = int(which)
            if not 1 <= k <= n:
                raise ChatError(f"no alternative {k}: this reply has {n} (1..{n})" if n > 1
                                else f"no alternative {k}: this reply has no others (regenerate makes one)")
            to = k - 1
        else:
            raise ChatError("usage: /alt next|prev|N")
        if to != at:
            self._switch(index, sibs[to])
            self._autosave()
        return to + 1, n

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
        """Activate `target` in place of messages[index] (a reply), moving the cache to the new path: cut back to
        the mark before that turn, then feed the new path's turns as they ran live."""
        msgs = self.session.messages
        first = 1 if msgs and msgs[0].role == "system" else 0
        turn = (index - 1 - first) // 2          # 0-based turn of the reply
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
        for at in range(index - 1, len(msgs) - 1, 2):
            self._play(msgs[at], msgs[at + 1], at)
