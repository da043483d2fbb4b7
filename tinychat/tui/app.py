"""The tinychat app (Textual): a streaming chat view, the live sampler inspector, status bar, settings, sessions
and replay playback, over the chat runtime (tinychat.chat).

How it runs: the window appears at once; the model loads on a thread worker behind a loading indicator. Every chat
operation (a turn, regenerate, undo, new chat, a settings change, opening a session, a replay) runs on one
exclusive thread worker (`group="chat"`), one at a time; the decode thread posts batched token updates
(messages.TokensReady, paced by runtime.Pace: 30 ms-1 s apart, by the UI's cost, the decode's stalls and speed)
and never touches a widget. Stop is `chat.cancel()` (thread-safe). The UI reads the chat (its settings, session,
status) only between operations. A worker's failure arrives as `Worker.StateChanged` (ERROR) and becomes a
notification; a failing model load is shown in the app.

Turns live in turns.py, forking at a token in forking.py, slash commands in commands.py, replay playback in
playback.py (mixins of the app); the
state they share (the open chat, the running operation, the reply being written) is one ChatState (state.py),
owned by the app as `app.state`.
Entry points for the CLI: `run_app(...)` and `run_replay(...)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
from pathlib import Path
from typing import Any, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.worker import Worker, WorkerState
from textual.widgets import Footer

from ..textsafe import plural, visible
from .ab_flow import ABMixin
from .commands import CommandsMixin
from .forking import ForkMixin
from .messages import ChatOpened, ReplayFinished, RuntimeReady
from .playback import PlaybackMixin
from .runtime import Backend, FactoryBackend, Pace, ReplayBackend
from .screens import ConfirmDialog, HelpScreen, SessionsScreen, SettingsScreen
from .state import Busy, ChatState
from .turns import TurnsMixin
from .widgets import (AssistantMessage, ChatView, Inspector, NoticeMessage, PromptArea, PromptInput, StatusBar,
                      TokenView, UserMessage)
from .widgets.format import token_label
from .widgets.inspector import Counters

WIDE = 120                  # columns from which the inspector is shown by default


class TinyChatApp(TurnsMixin, ForkMixin, CommandsMixin, PlaybackMixin, ABMixin, App[int]):
    CSS_PATH = Path(__file__).with_name("app.tcss")     # absolute: subclasses elsewhere find it too
    TITLE = "tinychat"
    # classes on every screen by the terminal's size: dialogs fit an 80x24 terminal (app.tcss)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-roomy")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+b", "undo", "Undo"),
        Binding("ctrl+o", "copy_reply", "Copy"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+s", "sessions", "Sessions"),
        Binding("ctrl+t", "tokens", "Tokens"),
        Binding("alt+right,f4", "next_alt", "Next alternative", show=False),
        Binding("alt+left,shift+f4", "prev_alt", "Previous alternative", show=False),
        Binding("f2", "settings", "Settings"),
        Binding("f3", "toggle_inspector", "Inspector"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, backend: Backend, *, replay_speed: float | None = None, inspector: bool | None = None,
                 blink: bool = True, export_dir: Path | None = None):
        super().__init__()
        self._frozen = False                        # gc.freeze() done (see _freeze_startup_objects)
        self.backend = backend
        self.replay_sess = backend.sess
        self.replay_speed = 1.0 if replay_speed is None else replay_speed
        self.inspector_pref = inspector            # None: shown when the terminal is wide enough
        self.blink = blink
        self.export_dir = export_dir
        self.state = ChatState()                    # the chat, the running operation, the reply being written
        self.strings: list[str] = []
        self.load_error: str | None = None
        self.pace = Pace()                          # how often the decode thread posts token batches
        self._ui_cpu: float | None = None           # UI thread CPU time at the last batch
        self._status_at = 0.0                       # when the status bar last showed live figures
        self._inspector_at = 0.0                    # when the inspector last showed a live token
        self._stop_replay = threading.Event()
        self.replay_summary: ReplayFinished | None = None
        self.notices: list[tuple[str, str]] = []    # (severity, message) of every notification, for tests and logs

    @property
    def chat(self):
        """The open chat (tinychat.chat.runtime.Chat), None until the model is loaded."""
        return self.state.chat

    @property
    def busy(self) -> Busy | None:
        """The operation running on the chat thread, None when idle."""
        return self.state.busy

    def notify(self, message: str, *, title: str = "", severity: str = "information", **kw) -> None:
        message, title = visible(message), visible(title)       # Rich draws ESC raw: a title could set the window's
        self.notices.append((severity, message))
        kw.setdefault("markup", False)          # messages carry user text and file names, never markup
        super().notify(message, title=title, severity=severity, **kw)

    # -- layout ---------------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                yield PromptInput(id="input")
            yield Inspector(id="inspector")
        yield StatusBar(id="status")
        yield Footer()

    @property
    def view(self) -> ChatView:
        return self.query_one("#chat", ChatView)

    @property
    def prompt(self) -> PromptArea:
        return self.query_one("#prompt", PromptArea)

    @property
    def input_box(self) -> PromptInput:
        return self.query_one("#input", PromptInput)

    def error_line(self, text: str) -> None:
        """A failure the user must see: kept under the input until their next action (not a toast that goes), and
        recorded with the notifications."""
        self.notices.append(("error", text))
        self.input_box.show_note(f"✗ {text}  (the next action clears this)")

    @property
    def inspector(self) -> Inspector:
        return self.query_one("#inspector", Inspector)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one("#status", StatusBar)

    def on_mount(self) -> None:
        show = self.inspector_pref if self.inspector_pref is not None else self.size.width >= WIDE
        self.inspector.display = show
        self.prompt.cursor_blink = self.blink
        self.view.loading = True
        self.status_bar.update_status(activity="loading model…")
        if self.replay_sess is not None:
            self.prompt.disabled = True
            speed = f"×{self.replay_speed:g}" if self.replay_speed else "full speed"
            self.query_one("#hint").update(f"replay of session {self.replay_sess.id} at {speed} · Esc stops · "
                                           f"Ctrl+T inspects tokens · Ctrl+Q quits")
        self.prompt.focus()
        self._load()

    # -- loading --------------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False, name="load")
    def _load(self) -> None:
        chat = self.backend.load()
        strings = self.backend.token_strings()
        note = ""
        if chat.session.n_turns:
            note = f"continuing session {chat.session.id}: {chat.session.title or 'untitled'} " \
                   f"({plural(chat.session.n_turns, 'turn')})"
        if getattr(chat, "notice", None):
            note += f" · {chat.notice}"
        self.post_message(RuntimeReady(chat, strings, note, chat.status()))

    async def on_runtime_ready(self, msg: RuntimeReady) -> None:
        self.state.chat, self.strings = msg.chat, msg.token_strings
        if self.replay_sess is not None:
            self.chat.autosave = False                  # a replay never writes sessions
        self.view.loading = False
        with self._idle_after():
            await self._show_history(msg.note)
        self._update_status(msg.status, activity="")
        self._freeze_startup_objects()
        if self.state.queued is not None and self.replay_sess is None:    # Enter while the model loaded
            text, self.state.queued = self.state.queued, None
            self.input_box.clear_note()
            await self.send(text)
        if self.replay_sess is not None:
            self._set_busy(Busy.REPLAY)
            self.status_bar.update_status(activity=f"replay ×{self.replay_speed:g}" if self.replay_speed
                                          else "replay (full speed)")
            self._replay(self.chat, self.replay_sess, self.replay_speed)

    async def _show_history(self, note: str = "") -> None:
        """The conversation from the chat's session (after a load, opening a session, a new chat)."""
        view = self.view
        await view.clear()
        self.state.current = None
        self.end_edit()                          # the view (and the messages' places) changed under it
        sess = self.chat.session
        tok = self.chat.tok
        widgets = []
        history = []
        for i, m in enumerate(sess.messages):
            if m.role == "user":
                u = UserMessage(m.content, classes="message user")
                if self.replay_sess is None:
                    u.index = i
                    u.set_alternatives(*self.chat.alternatives(i))
                widgets.append(u)
                history.append(m.content)
            elif m.role == "assistant" and self.replay_sess is None:
                ids = tok.content_ids(m.role, m.token_ids)
                known = self.state.recall(sess.id, m.id, ids)
                meta = known[2] if known else history_meta(m, len(ids))
                w = AssistantMessage(m.content, meta=meta, classes="message assistant")
                w.set_history(ids, [self._piece(t) for t in ids], *(known[:2] if known else ()))
                if m.fork:
                    w.marks[m.fork["position"]] = "forked"
                w.index = i
                w.alts = self.chat.alternatives(i)
                widgets.append(w)
        if not note and not sess.n_turns and self.replay_sess is None:
            saved = "every chat is saved" if self.chat.autosave else "--no-save: this chat is not saved; /save saves it"
            note = (f"New chat with {self.chat.model_name or 'the model'}. Enter sends, Ctrl+J adds a line, "
                    f"F1 lists keys and commands, Ctrl+S the saved chats ({saved}).")
            if self.chat.model_name == "default":
                from ..hub import DEMO_NOTE
                note += " " + DEMO_NOTE
        if note:
            widgets.append(NoticeMessage(note, classes="notice"))
        if widgets:
            await view.mount_all(widgets)
        self.prompt.set_history(history)
        view.scroll_end(animate=False)
        self.inspector.show_text("Send a message: each token's candidates appear here as it is sampled."
                                 if self.replay_sess is None else "Replaying: each token's candidates appear here.")

    def _piece(self, token: int) -> str:
        return self.strings[token] if 0 <= token < len(self.strings) else ""

    # -- state ----------------------------------------------------------------------------------------------------
    def _set_busy(self, kind: Busy | None) -> None:
        # The footer's bindings stay the same whatever the state (an action that does not apply says so when
        # pressed): refreshing them would recompose the footer twice per turn, on the UI thread, while decoding.
        self.state.busy = kind
        # no cursor blink while a reply streams: each blink repaints the input (UI time, taken from the decode
        # thread through the GIL)
        self.prompt.cursor_blink = self.blink and not (kind is not None and kind.decoding)

    @contextlib.contextmanager
    def _idle_after(self):
        """Busy until the view shows how the operation ended: `busy is None` is the app's idle signal (keys and
        tests wait on it), so it clears after the handler's awaits (a rebuilt view, a trimmed one), and clears
        even when one of them fails."""
        try:
            yield
        finally:
            self._set_busy(None)

    def _can_run(self, what: str = "that") -> bool:
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

    def _update_status(self, st: dict, **extra) -> None:
        if not st:
            self.status_bar.update_status(**extra)
            return
        autosave = "autosave off"
        if self.chat is not None and self.chat.autosave:
            autosave = "autosaved" if st.get("turns") else "autosave on"
        self.status_bar.update_status(model=st.get("model") or "model", mode=st.get("mode", ""), auto=st.get("auto"),
                                      quant=st.get("quant"), device=st.get("device", ""), cache_tokens=st.get("cache_tokens", 0),
                                      max_len=st.get("max_len", 0), cache_bytes=st.get("cache_bytes", 0),
                                      autosave=autosave, **extra)

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR:
            return
        err = event.worker.error
        text = (str(err).strip().splitlines() or [type(err).__name__])[0]
        name = event.worker.name
        if name == "load":
            from ..sessions.session import SessionError
            what = "open the session" if isinstance(err, SessionError) else "load the model"
            self.load_error = f"could not {what}: {text}"
            self.view.loading = False
            await self.view.mount(NoticeMessage(f"✗ {self.load_error}\n\nCheck --model (a folder with config.json, "
                                                f"model.safetensors and tokenizer.json). Ctrl+Q quits.",
                                                error=True, classes="notice", id="load-error"))
            self.status_bar.update_status(model="no model", activity="load failed")
            self.notify(self.load_error, severity="error", timeout=10)
            self.state.busy = None
            if self.state.queued is not None:              # a message queued for the model: back to the input
                self.prompt.restore(self.state.queued)
                self.state.queued = None
                self.input_box.clear_note()
            return
        kind = self.busy
        if kind is Busy.OPEN and self._offer_model(err):
            return
        if name == "replay":
            self.notify(f"replay failed: {text}", severity="error", timeout=8)
        else:
            self.error_line(f"{kind.value if kind else name} failed: {text}")
        if name == "replay":
            with self._idle_after():
                self.status_bar.update_status(activity="replay failed")
                if self.state.current is not None:
                    await self.state.current.finish(f"✗ {text}")
                    self.state.current = None
            return
        self.status_bar.update_status(activity="")
        with self._idle_after():
            if kind in (Busy.SEND, Busy.REGEN) and self.chat is not None:
                # the chat is idle: drop what its session does not hold, give a failed message back to the input
                if self.state.current is not None:
                    await self.state.current.remove()
                    self.state.current = None
                await self._trim_to_session()
                if kind is Busy.SEND and not self.prompt.text:
                    self.prompt.restore(self.state.job_text)
            elif kind is Busy.AB and self.chat is not None:
                await self.ab_failed()
            elif kind in (Busy.EDIT, Busy.FORK) and self.chat is not None:
                # the chat put the old branch back: show it (and the edited text back in the input)
                self.state.current = None
                await self._show_history()
                if kind is Busy.EDIT and not self.prompt.text:
                    self.prompt.restore(self.state.job_text)
        await self._apply_pending()

    # -- actions --------------------------------------------------------------------------------------------------
    def action_copy_reply(self) -> None:
        replies = [r for r in self.view.replies() if r.finished]
        if not replies:
            self.notify("no reply to copy yet")
            return
        text = replies[-1].text
        self.copy_to_clipboard(text)
        self.notify(f"copied the last reply ({len(text):,} characters)")

    def action_new_chat(self) -> None:
        self.input_box.clear_note()
        if not self._can_run("start a new chat"):
            return
        self._set_busy(Busy.NEW)
        self._job_new(self.chat)

    def action_toggle_inspector(self) -> None:
        ins = self.inspector
        ins.display = not ins.display
        self.inspector_pref = ins.display

    def on_resize(self, event) -> None:
        """The inspector follows the terminal's width both ways (shown from WIDE columns) until toggled by hand."""
        if self.inspector_pref is None:
            for ins in self.query("#inspector"):            # none before the first compose
                ins.display = event.size.width >= WIDE

    REPLAY_OFF = frozenset({"regenerate", "undo", "new_chat", "sessions", "settings", "next_alt", "prev_alt"})

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """A replay's footer and keys leave out what a replay cannot do (regenerate, undo, a new chat, sessions,
        settings, alternatives): fixed for the app's life, so the footer is composed once."""
        if self.replay_sess is not None and action in self.REPLAY_OFF:
            return False
        return True

    def action_help_quit(self) -> None:
        """Ctrl+C (Textual's binding when no selected text is there to copy): stops a reply or a replay, as Esc
        does, and says how to quit (in plain words: notifications here show no markup)."""
        if self.busy is not None and self.busy.decoding:
            self.action_stop()
            self.notify("stopped the reply (Esc stops it too) · Ctrl+Q quits tinychat")
        else:
            self.notify("Ctrl+Q quits tinychat (Ctrl+C stops a reply, or copies selected text)")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_tokens(self) -> None:
        replies = [r for r in self.view.replies() if r.finished and r.tokens]
        if not replies:
            self.notify("no finished reply to inspect yet")
            return
        self._focus_reply(replies[-1], index=len(replies[-1].tokens) - 1)

    def _focus_reply(self, reply: AssistantMessage, index: int | None = None) -> None:
        for r in self.view.replies():
            if r is not reply and r.token_view.display:
                r.show_tokens(False)
        if not self.inspector.display and self.size.width >= 80:
            self.inspector.display = True
        reply.show_tokens(True, index=index)
        reply.scroll_visible()

    def on_assistant_message_clicked(self, msg: AssistantMessage.Clicked) -> None:
        self._focus_reply(msg.message)

    def on_assistant_message_alt_clicked(self, msg: AssistantMessage.AltClicked) -> None:
        self.switch_alt("next", msg.message.index)

    def on_user_message_alt_clicked(self, msg: UserMessage.AltClicked) -> None:
        self.switch_alt("next", msg.message.index)

    def on_token_view_selected(self, msg: TokenView.Selected) -> None:
        if not msg.view.display:        # a hidden view's first cursor (every reply mounted from a session posts one)
            return
        reply = next((r for r in self.view.replies() if r.token_view is msg.view), None)
        if reply is None or not reply.tokens:
            return
        i = msg.index
        trace = reply.traces.get(i)
        counters = reply.stats or (Counters.from_traces(reply.traces.values()) if reply.traces else None)
        n = self.view.replies().index(reply) + 1
        heading = f"reply {n} · token #{i} «{token_label(reply.pieces[i], 16)}»"
        if reply.first_divergence is not None and i >= reply.first_divergence:
            heading += " · after the divergence"
        if reply.marks.get(i) == "forked":
            heading += " · forced here (a fork)"
        self.state.inspected = (reply, i)
        self.inspector.show_trace(trace, self.strings, counters, heading,
                                  pickable=self.replay_sess is None and reply.index is not None)

    def on_token_view_leave(self, msg: TokenView.Leave) -> None:
        replies = [r for r in self.view.replies() if r.tokens]
        reply = next((r for r in replies if r.token_view is msg.view), None)
        if reply is None:
            return
        if msg.direction:
            j = replies.index(reply) + msg.direction
            if 0 <= j < len(replies):
                self._focus_reply(replies[j], index=0 if msg.direction > 0 else len(replies[j].tokens) - 1)
            return
        reply.show_tokens(False)
        self.prompt.focus()

    # -- settings -------------------------------------------------------------------------------------------------
    def action_settings(self) -> None:
        if self.chat is None:
            self.notify(self.load_error or "the model is still loading", severity="warning")
            return
        st = self.chat.settings
        for k, v in self.state.pending_settings.items():
            st = st.with_value(k, v)
        values = dataclasses.asdict(st)
        note = "A new system prompt applies at once while the chat has no turns, else from the next new chat."
        from ..prefs import load_prefs
        prefs = dataclasses.asdict(load_prefs()[0])
        sources = {**getattr(self.chat, "sources", {}), **{k: "/set" for k in self.state.pending_settings}}
        self.push_screen(SettingsScreen(values, self._check_settings, note, prefs=prefs, sources=sources),
                         self._settings_done)

    def _check_settings(self, changes: dict) -> str | None:
        st = self.chat.settings
        try:
            for k, v in {**self.state.pending_settings, **changes}.items():
                st = st.with_value(k, v)
        except ValueError as e:
            return str(e)
        return None

    async def _settings_done(self, changes: dict | None) -> None:
        from .screens.settings import PREF
        prefs = {k[len(PREF):]: v == "on" for k, v in (changes or {}).items() if k.startswith(PREF)}
        if prefs:
            self.save_prefs(prefs)
        changes = {k: v for k, v in (changes or {}).items() if not k.startswith(PREF)}
        if changes:
            await self.apply_settings(changes)

    def save_prefs(self, changes: dict[str, bool]) -> None:
        """Write the app's preferences (prefs.json) at once; a failure is one line, the chat goes on."""
        from ..prefs import load_prefs, save_prefs
        try:
            path = save_prefs(dataclasses.replace(load_prefs()[0], **changes))
        except OSError as e:
            self.notify(f"preferences not saved: {e}", severity="error")
            return
        names = ", ".join(f"{k.replace('_', '-')} = {'on' if v else 'off'}" for k, v in changes.items())
        self.notify(f"{names} (saved in {path})")

    async def apply_settings(self, changes: dict[str, str]) -> None:
        """Change settings from the next turn: at once when idle, else when the running operation ends."""
        err = self._check_settings(changes)
        if err:
            self.notify(err, severity="error")
            return
        self.state.pending_settings.update(changes)
        if self.busy is None:
            await self._apply_pending()
        else:
            self.notify("settings apply from the next turn")

    async def _apply_pending(self) -> None:
        if self.state.pending_settings and self.busy is None and self.chat is not None:
            changes, self.state.pending_settings = self.state.pending_settings, {}
            self._set_busy(Busy.SET)
            self._job_set(self.chat, changes)

    # -- sessions -------------------------------------------------------------------------------------------------
    def action_sessions(self) -> None:
        self.input_box.clear_note()
        if not self._can_run("open the sessions"):
            return
        cur = self.chat.session.id if self.chat.session.n_turns else None
        self.push_screen(SessionsScreen(current=cur, sessions_dir=self.chat.sessions_dir,
                                        export_dir=self.export_dir, on_renamed=self._renamed), self._sessions_done)

    def _renamed(self, sid: str, title: str) -> None:
        if self.chat is not None and self.chat.session.id == sid:
            self.chat.session.title = title      # the next autosave keeps the new title
            from ..sessions import session as S          # ... over the renamed file: take its revision
            S.adopt_revision(self.chat.session, getattr(self.chat, "sessions_dir", None))

    def _sessions_done(self, result: tuple | None) -> None:
        if not result:
            return
        what, sid = result
        if what == "new":
            self.action_new_chat()
        elif what == "open":
            self.open_session(sid)

    def open_session(self, sid: str) -> None:
        self.input_box.clear_note()
        if not self._can_run("open a session"):
            return
        if self.chat.session.id == sid:
            self.notify("that session is open")
            return
        self._set_busy(Busy.OPEN)
        self.status_bar.update_status(activity="opening session…")
        self._job_open(sid)

    async def on_chat_opened(self, msg: ChatOpened) -> None:
        self.state.chat = msg.chat
        if msg.token_strings is not None:
            self.strings = msg.token_strings
        with self._idle_after():
            await self._show_history(msg.note)
        self._update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        self.prompt.focus()

    def _offer_model(self, err: BaseException) -> bool:
        """A session recorded with another model failed to open: offer to switch to that model when it is here (the
        shipped one, or imported), and open the session on it. False when there is nothing to offer (the caller
        reports the error)."""
        from ..settings import OtherModel
        if not isinstance(err, OtherModel) or err.same_name or not err.model_name:
            return False
        where = self.backend.find_model(err.model_name)
        if where is None:
            return False
        self._set_busy(None)
        self.status_bar.update_status(activity="")
        sid, name = err.session_id, err.model_name

        def called(n: str | None) -> str:
            return "the shipped model" if n == "default" else f"the model {n!r}" if n else "the current model"
        current = called(self.chat.model_name if self.chat is not None else None)
        kept = " (this chat stays saved)" if self.chat is not None and self.chat.session.n_turns else ""

        def answer(yes: bool | None) -> None:
            if not yes:
                self.notify(f"session {sid} stays closed: it needs the model {name!r}")
                return
            if not self._can_run("switch models"):
                return
            self._set_busy(Busy.OPEN)
            self.status_bar.update_status(activity=f"loading {name}…")
            self._job_switch(where, sid)
        self.push_screen(ConfirmDialog(f"Session {sid} was recorded with {called(name)}, not with {current}. "
                                       f"Switch to it and open the session?{kept}"), answer)
        return True

    def _freeze_startup_objects(self) -> None:
        """What exists once the model is loaded (torch, the model, Textual: ~300k objects) lives as long as the app:
        out of the cyclic GC's sight (gc.freeze), a full collection scans only what the turns add instead of holding
        the UI (and a key typed meanwhile) for a scan of all of them every few turns. on_unmount gives them back."""
        if not self._frozen:
            gc.collect()
            gc.freeze()
            self._frozen = True

    def on_unmount(self) -> None:
        if self._frozen:
            gc.unfreeze()
            self._frozen = False

    async def action_quit(self) -> None:
        if self.chat is not None and self.busy in (Busy.SEND, Busy.REGEN, Busy.EDIT, Busy.AB, Busy.FORK):
            self.chat.cancel()
        self._stop_replay.set()
        rc = 2 if self.load_error else 0
        self.exit(rc, return_code=rc)


def history_meta(m, n_tokens: int) -> str:
    """The line under a reply shown from the session without this app's record of it (restored from a file, or
    written by hand with /edit rN)."""
    if m.finish == "edited":
        return f"{plural(n_tokens, 'token')} · written by hand (/edit): not sampled, no trace"
    how = {"length": "cut off at max-new", "cancelled": "stopped"}.get(m.finish or "stop", "")
    return " · ".join([plural(n_tokens, "token"), *([how] if how else []), "restored (no trace)"])


def run_app(model: Path | None = None, quant: str = "auto", device: str = "cpu", settings=None,
            overrides: dict | None = None, session: str | None = None, options=None, autosave: bool = True) -> int:
    """`tinychat` in a terminal: the app. Returns the exit code. options: the engine's EngineOptions. autosave
    False: --no-save (the chats are not written unless /save is used)."""
    app = TinyChatApp(Backend(model, quant, device, settings, overrides, session, options, autosave=autosave))
    app.run()
    return app.return_code or 0


def run_replay(sess, model: Path | None = None, device: str = "cpu", speed: float = 1.0) -> int:
    """`tinychat replay ID --play`: the app playing a session back. Returns the exit code."""
    app = TinyChatApp(ReplayBackend(sess, model, device), replay_speed=speed)
    app.run()
    return app.return_code or 0


def make_app(factory: Callable[[str | None], Any], session: str | None = None, replay=None, others=None,
             **kw) -> TinyChatApp:
    """An app over `factory(session_ref | None) -> Chat` (tests, embedding); others: {model name: factory} the app
    may switch to for a session recorded with that model."""
    return TinyChatApp(FactoryBackend(factory, session=session, replay=replay, others=others), **kw)
