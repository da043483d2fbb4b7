"""The app's controller: it owns the chat state (state.ChatState: the open chat, the running operation, the settings
waiting for it to end) and starts the jobs (jobs.py) on the chat thread, one at a time. Widget-free: it checks what
can be checked on the chat alone (loaded? idle? a turn to undo? a valid setting?), says why not through the host's
`notify`, and leaves the view to the app, which routes the jobs' messages.

Every job starts the same way (`start`): a thread worker of its group, exclusive, its failure reported as a
`Worker.StateChanged` (ERROR) to the app. All of this runs on the UI thread."""
from __future__ import annotations

import contextlib
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..numbers import is_count
from ..settings import ChatError
from . import jobs
from .runtime import Backend, Pace
from .state import Busy, ChatState

if TYPE_CHECKING:
    from ..chat.runtime import Chat

STOPPABLE = (Busy.SEND, Busy.REGEN, Busy.EDIT, Busy.FORK)     # what Esc stops (chat.cancel)


class Host(Protocol):
    """What the controller needs of the app: to say something, to run a worker, to hear of a change of Busy."""
    def notify(self, message: str, *, severity: str = "information", **kw) -> None: ...
    def post_message(self, message) -> bool: ...
    def run_worker(self, work: Callable, **kw) -> Any: ...
    def busy_changed(self, kind: Busy | None) -> None: ...


class ChatController:
    def __init__(self, host: Host, backend: Backend, replay_speed: float = 1.0):
        self.host = host
        self.backend = backend
        self.replay_sess = backend.sess             # the recorded session a replay plays back (None: a chat)
        self.replay_speed = replay_speed
        self.state = ChatState()
        self.pace = Pace()                          # how often the decode thread posts token batches
        self.stop_replay = threading.Event()
        self.load_error: str | None = None
        self.alt_what = "reply"                     # what the running switch of alternatives shows: reply, message

    @property
    def chat(self) -> Chat | None:
        return self.state.chat

    @property
    def busy(self) -> Busy | None:
        return self.state.busy

    def notify(self, message: str, severity: str = "information") -> None:
        self.host.notify(message, severity=severity)

    # -- running ------------------------------------------------------------------------------------------------------
    def set_busy(self, kind: Busy | None) -> None:
        self.state.busy = kind
        self.host.busy_changed(kind)

    @contextlib.contextmanager
    def idle_after(self):
        """Busy until the view shows how the operation ended: `busy is None` is the app's idle signal (keys and
        tests wait on it), so it clears after the handler's awaits (a rebuilt view, a trimmed one), and clears
        even when one of them fails."""
        try:
            yield
        finally:
            self.set_busy(None)

    def start(self, job: jobs.Job) -> None:
        """Run `job` on a thread worker of its group (one at a time); what it finds arrives as a message."""
        self.host.run_worker(partial(job.run, self.host.post_message), name=job.name, group=job.group, thread=True,
                             exclusive=True, exit_on_error=False)

    def run(self, kind: Busy, job: jobs.Job) -> None:
        self.set_busy(kind)
        self.start(job)

    def can_run(self, what: str = "that") -> bool:
        """A chat is loaded, this is not a replay, and nothing runs; else says so (a warning) and False."""
        if self.chat is None:
            self.notify(self.load_error or "the model is still loading", severity="warning")
            return False
        if self.replay_sess is not None:
            self.notify("this is a replay: start `tinychat` to chat", severity="warning")
            return False
        if self.busy is not None:
            self.notify(f"busy ({self.busy.value}): {what} after it (Esc stops a reply)", severity="warning")
            return False
        return True

    def streaming(self, then: str) -> bool:
        """A reply is being written: says to wait (an error line) and True."""
        if self.chat is not None and self.busy is not None and self.busy.decoding:
            self.notify(f"wait for the reply to finish (Esc stops it), then {then}", severity="error")
            return True
        return False

    # -- the operations -----------------------------------------------------------------------------------------------
    def load(self) -> None:
        self.start(jobs.Load(self.backend))

    def loaded(self, chat: Chat) -> None:
        self.state.chat = chat
        if self.replay_sess is not None:
            chat.autosave = False                   # a replay never writes sessions

    def turn(self, kind: Busy, text: str = "", trace: bool = False, edit_at: int | None = None,
             fork_at: tuple[int, int, int] | None = None) -> jobs.Turn:
        """A new turn's job (a new turn id; busy with `kind`), for `start` once its reply is on screen."""
        self.state.turn_id += 1
        self.state.job_text = text
        self.set_busy(kind)
        return jobs.Turn(self.chat, kind, self.state.turn_id, self.pace, text, trace, edit_at, fork_at)

    def replay(self) -> None:
        self.run(Busy.REPLAY, jobs.Replay(self.chat, self.replay_sess, self.replay_speed, self.pace, self.stop_replay))

    def undo(self) -> None:
        if not self.can_run("undo"):
            return
        if not self.chat.session.n_turns:
            self.notify("no turn to undo")
            return
        self.run(Busy.UNDO, jobs.Undo(self.chat))

    def new_chat(self) -> None:
        if self.can_run("start a new chat"):
            self.run(Busy.NEW, jobs.NewChat(self.chat))

    def save(self, title: str | None) -> None:
        if self.can_run("save"):
            self.run(Busy.SAVE, jobs.Save(self.chat, title))

    def switch_alt(self, which: str, index: int | None = None) -> None:
        """Show another alternative of message `index` (default: the last reply): "next", "prev" or a 1-based
        number. Checked here first, so a bad number or a switch while a reply streams is one line and changes
        nothing."""
        if self.streaming("switch alternatives") or not self.can_run("switching alternatives"):
            return
        try:
            place, n = self.chat.alternatives(index)
        except ChatError as e:
            self.notify(str(e), severity="error")
            return
        is_reply = index is None or self.chat.session.messages[index].role == "assistant"
        what, how = ("reply", "Ctrl+R") if is_reply else ("message", "/edit")
        if is_count(which) and not 1 <= int(which) <= n:
            self.notify(f"no alternative {which}: this {what} has {n} (1..{n})" if n > 1 else
                        f"no alternative {which}: this {what} has no others ({how} makes one)", severity="error")
            return
        if n < 2:
            self.notify(f"this {what} has no alternatives yet ({how} makes one)")
            return
        self.keep_alt(which, index, what)

    def keep_alt(self, which: str, index: int | None = None, what: str = "reply") -> None:
        """Switch to alternative `which`, unchecked (an A/B's side B, which the chat just made)."""
        self.alt_what = what
        self.run(Busy.ALT, jobs.SwitchAlt(self.chat, which, index))

    def edit_reply(self, index: int, text: str) -> None:
        """Keep reply `index` as written (no decoding: the view is rebuilt when it is done)."""
        self.alt_what = "reply"
        self.run(Busy.ALT, jobs.EditReply(self.chat, index, text))

    def check_settings(self, changes: dict) -> str | None:
        """Why the settings waiting plus `changes` cannot apply (one line), None when they can."""
        st = self.chat.settings
        try:
            for k, v in {**self.state.pending_settings, **changes}.items():
                st = st.with_value(k, v)
        except ValueError as e:
            return str(e)
        return None

    def apply_settings(self, changes: dict[str, str]) -> None:
        """Change settings from the next turn: at once when idle, else when the running operation ends."""
        err = self.check_settings(changes)
        if err:
            self.notify(err, severity="error")
            return
        self.state.pending_settings.update(changes)
        if self.busy is None:
            self.apply_pending()
        else:
            self.notify("settings apply from the next turn")

    def apply_pending(self) -> None:
        """The settings that waited for the operation that ended, now (called whenever one ends)."""
        if self.state.pending_settings and self.busy is None and self.chat is not None:
            changes, self.state.pending_settings = self.state.pending_settings, {}
            self.run(Busy.SET, jobs.ApplySettings(self.chat, tuple(changes.items())))

    def open_session(self, sid: str) -> bool:
        """Open saved session `sid` in place of the chat; False when it cannot start (said why)."""
        if not self.can_run("open a session"):
            return False
        if self.chat.session.id == sid:
            self.notify("that session is open")
            return False
        self.run(Busy.OPEN, jobs.OpenSession(self.backend, self.chat, sid))
        return True

    def switch_model(self, where, sid: str) -> bool:
        """Load the model at `where` and open session `sid` on it; False when it cannot start now."""
        if not self.can_run("switch models"):
            return False
        self.run(Busy.OPEN, jobs.SwitchModel(self.backend, self.chat, where, sid))
        return True

    def opened(self, chat: Chat) -> None:
        self.state.chat = chat

    def ab(self, changes: dict[str, str]) -> bool:
        """Start the sampler A/B of the last turn against `changes`; False when it cannot (said why)."""
        if self.streaming("/ab") or not self.can_run("/ab"):
            return False
        if not self.chat.session.n_turns:
            self.notify("no reply to compare yet: send a message first", severity="error")
            return False
        err = self.check_settings(changes)          # key and value, as /set (the job checks the rest)
        if err:
            self.notify(err, severity="error")
            return False
        self.run(Busy.AB, jobs.RunAB(self.chat, tuple(changes.items())))
        return True

    def take_queued(self) -> str | None:
        """The message queued while the model loads, taken out of the queue (None when there is none)."""
        text, self.state.queued = self.state.queued, None
        return text

    def stop(self) -> str | None:
        """Esc: stop the reply being written or the replay; what the status bar says meanwhile (None: nothing ran)."""
        if self.busy in STOPPABLE and self.chat is not None:
            self.chat.cancel()
            return "stopping…"
        if self.busy is Busy.REPLAY:
            self.stop_replay.set()
            return "stopping replay…"
        return None

    def cancel_all(self) -> None:
        """On quit: stop whatever decodes (a turn, an A/B, a replay)."""
        if self.chat is not None and self.busy in (*STOPPABLE, Busy.AB):
            self.chat.cancel()
        self.stop_replay.set()
