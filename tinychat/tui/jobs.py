"""The app's jobs: what runs on the chat thread, one operation each (a turn, undo, a switch of alternatives, opening a
session, a replay, ...). A job is a frozen dataclass: its fields are everything the thread may use (the chat, the
backend, the text, the index), fixed when the UI thread starts it, so the thread never reads the app's state, which
goes on changing meanwhile. `run(post)` does the work and posts what came of it as a message (messages.py); it never
touches a widget. The controller (controller.py) starts every job the same way, one at a time.

A failed autosave travels in the result message (`warning`), read here right after the operation that saved."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from textual.message import Message

from ..textsafe import plural
from .messages import (AbReady, ChatOpened, JobDone, ReplayFinished, ReplayTurnFinished, ReplayTurnStarted,
                       RuntimeReady, TokensReady, TurnFinished)
from .runtime import Backend, Pace, TokenBatcher, cache_figures
from .state import Busy

if TYPE_CHECKING:
    from ..chat.runtime import Chat
    from ..sessions.session import Session

Post = Callable[[Message], None]        # the app's post_message: thread-safe


@dataclass(frozen=True)
class Job:
    """One operation on the chat thread. `group`: jobs of one group run one at a time; `name`: the worker's name."""
    group: ClassVar[str] = "chat"
    name: ClassVar[str] = "chat"

    def run(self, post: Post) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Load(Job):
    """Load the model and open the first chat (the session asked for, or a new one)."""
    backend: Backend
    group: ClassVar[str] = "load"
    name: ClassVar[str] = "load"

    def run(self, post: Post) -> None:
        chat = self.backend.load()
        strings = self.backend.token_strings()
        note = ""
        if chat.session.n_turns:
            note = f"continuing session {chat.session.id}: {chat.session.title or 'untitled'} " \
                   f"({plural(chat.session.n_turns, 'turn')})"
        if chat.notice:
            note = f"{note} · {chat.notice}" if note else chat.notice
        post(RuntimeReady(chat, strings, note, chat.status()))


@dataclass(frozen=True)
class Turn(Job):
    """A turn: send `text`, send it in place of user message `edit_at`, fork (`fork_at`), or regenerate the last
    reply; tokens posted in batches (paced by `pace`), then TurnFinished."""
    chat: Chat
    kind: Busy                                  # SEND, EDIT, FORK or REGEN
    turn_id: int
    pace: Pace
    text: str = ""
    trace: bool = False                         # record each token's candidates (while the inspector is shown)
    edit_at: int | None = None                  # EDIT: the index of the user message replaced
    fork_at: tuple[int, int, int] | None = None     # FORK: (reply index, token position, the token forced there)

    def run(self, post: Post) -> None:
        chat, turn_id = self.chat, self.turn_id
        batcher = TokenBatcher(lambda items: post(TokensReady(turn_id, items, cache_figures(chat))), self.pace)
        if self.kind is Busy.SEND:
            r = chat.send(self.text, on_token=batcher, trace=self.trace)
        elif self.kind is Busy.EDIT:
            r = chat.edit(self.edit_at, self.text, on_token=batcher, trace=self.trace)
        elif self.kind is Busy.FORK:
            index, position, token = self.fork_at
            r = chat.fork(position, token, index, on_token=batcher, trace=self.trace)
        else:
            r = chat.regenerate(on_token=batcher, trace=self.trace)
        batcher.flush()
        post(TurnFinished(turn_id, r, chat.status(), warning=r.save_warning, notice=r.notice))


def _saved(chat: Chat) -> str | None:
    """The failure of the autosave the operation just ran (None: saved, or nothing to save)."""
    return chat.save_warning


@dataclass(frozen=True)
class Undo(Job):
    chat: Chat

    def run(self, post: Post) -> None:
        user = self.chat.undo()
        post(JobDone(Busy.UNDO, user.content, self.chat.status(), _saved(self.chat)))


@dataclass(frozen=True)
class EditReply(Job):
    """Keep reply `index` as written by hand (a new branch)."""
    chat: Chat
    index: int
    text: str

    def run(self, post: Post) -> None:
        place = self.chat.edit_reply(self.index, self.text)
        post(JobDone(Busy.ALT, place, self.chat.status(), _saved(self.chat)))


@dataclass(frozen=True)
class SwitchAlt(Job):
    """Show alternative `which` ("next", "prev", or a 1-based number) of message `index` (None: the last reply)."""
    chat: Chat
    which: str
    index: int | None = None

    def run(self, post: Post) -> None:
        place = self.chat.switch_alternative(self.which, self.index)
        post(JobDone(Busy.ALT, place, self.chat.status(), _saved(self.chat)))


@dataclass(frozen=True)
class NewChat(Job):
    chat: Chat

    def run(self, post: Post) -> None:
        self.chat.new_session()
        post(JobDone(Busy.NEW, None, self.chat.status()))


@dataclass(frozen=True)
class ApplySettings(Job):
    chat: Chat
    changes: tuple[tuple[str, str], ...]        # (key, value) in the order given

    def run(self, post: Post) -> None:
        for k, v in self.changes:
            self.chat.set(k, v)
        st = self.chat.settings
        applied = {f: getattr(st, f) for f in (st.field_name(k) for k, _ in self.changes)}
        post(JobDone(Busy.SET, applied, self.chat.status()))


@dataclass(frozen=True)
class Save(Job):
    chat: Chat
    title: str | None

    def run(self, post: Post) -> None:
        path = self.chat.save(self.title)
        post(JobDone(Busy.SAVE, str(path) if path else None, self.chat.status()))


@dataclass(frozen=True)
class OpenSession(Job):
    """Open `session_ref` (None: a new chat) on the loaded model; the chat it replaces (`current`) is closed."""
    backend: Backend
    current: Chat | None
    session_ref: str | None

    def run(self, post: Post) -> None:
        new = self.backend.open(self.session_ref)
        if self.current is not None and new is not self.current:
            self.current.close()            # its session's lock: another process may open it now
        if new is not self.current:
            new.settle_threads()            # a new chat's step measures its thread count, as the first one's did
        note = f"session {new.session.id}: {new.session.title or 'untitled'} ({plural(new.session.n_turns, 'turn')})" \
            if self.session_ref else ""
        post(ChatOpened(new, note, new.status()))


@dataclass(frozen=True)
class SwitchModel(Job):
    """Load another model (backend.find_model's `where`) and open session_ref on it."""
    backend: Backend
    current: Chat | None
    where: Any
    session_ref: str

    def run(self, post: Post) -> None:
        if self.current is not None:
            self.current.close()            # its session's lock (a failed switch keeps it open but unlocked)
        new = self.backend.switch(self.where, self.session_ref)
        new.settle_threads()
        note = f"switched to {new.model_name or 'the model'} · session {new.session.id}: " \
               f"{new.session.title or 'untitled'} ({plural(new.session.n_turns, 'turn')})"
        post(ChatOpened(new, note, new.status(), self.backend.token_strings()))


@dataclass(frozen=True)
class RunAB(Job):
    """The sampler A/B (tinychat/chat/ab.py): the last turn decoded twice, the current settings against `changes`."""
    chat: Chat
    changes: tuple[tuple[str, str], ...]

    def run(self, post: Post) -> None:
        from ..chat.ab import run_ab
        r = run_ab(self.chat, dict(self.changes))
        post(AbReady(r, self.chat.status(), _saved(self.chat)))


class StopPlayback(Exception):
    """Raised on the replay thread when the user stops the playback."""


@dataclass(frozen=True)
class Replay(Job):
    """Play the recorded session `sess` back on `chat` (tinychat.chat.replay): each turn regenerated, its tokens
    posted at the recorded pace times `speed` (0: as fast as they come) until `stop` is set."""
    chat: Chat
    sess: Session
    speed: float
    pace: Pace
    stop: threading.Event
    name: ClassVar[str] = "replay"

    def run(self, post: Post) -> None:
        from ..chat.replay import replay
        chat, speed, stop = self.chat, self.speed, self.stop
        msgs = self.sess.messages
        first = 1 if msgs and msgs[0].role == "system" else 0
        pairs = [(msgs[i], msgs[i + 1]) for i in range(first, len(msgs) - 1, 2)]
        tok = chat.tok
        state = {"turn": 0, "t0": 0.0, "rec": [], "batcher": None}

        def start(n: int) -> None:
            user, rec = pairs[n - 1]
            state.update(turn=n, t0=time.perf_counter(), rec=list(rec.timing_ms or []))
            state["batcher"] = TokenBatcher(lambda items: post(TokensReady(-n, items, cache_figures(chat))), self.pace)
            post(ReplayTurnStarted(n, user.content, tok.content_ids(rec.role, rec.token_ids)))

        def on_token(n, idx, token, text, trace, ms):
            if stop.is_set():
                raise StopPlayback
            if n != state["turn"]:
                start(n)
            if speed > 0 and token >= 0 and idx < len(state["rec"]):
                due = state["t0"] + sum(state["rec"][:idx + 1]) / 1000 / speed
                while not stop.is_set():
                    left = due - time.perf_counter()
                    if left <= 0:
                        break
                    if state["batcher"].items:
                        state["batcher"].flush()      # show what is due before waiting
                    time.sleep(min(left, 0.05))
            state["batcher"](idx, token, text, trace, ms)

        def on_turn(tr):
            if tr.turn != state["turn"]:
                start(tr.turn)
            state["batcher"].flush()
            post(ReplayTurnFinished(tr.turn, tr))

        try:
            report = replay(chat, self.sess, on_turn=on_turn, on_token=on_token)
        except StopPlayback:
            if state["batcher"] is not None:
                state["batcher"].items.clear()
            post(ReplayFinished(state["turn"], [], stopped=True))     # the chat is a throwaway now
            return
        post(ReplayFinished(len(report.turns), [d.describe() for d in report.divergences], status=chat.status()))
