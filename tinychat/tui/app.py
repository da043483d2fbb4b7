"""The tinychat app (Textual): a streaming chat view, the live sampler inspector, status bar, settings, sessions
and replay playback, over the chat runtime (tinychat.chat).

How it runs: the window appears at once; the model loads on a thread worker behind a loading indicator. The
controller (controller.py, no widgets) owns the chat state and runs every chat operation (a turn, regenerate, undo,
new chat, a settings change, opening a session, a replay) as a job (jobs.py: its arguments fixed when it starts) on
one exclusive thread worker, one at a time. A job posts its results as messages (messages.py): batched token updates
(TokensReady, paced by runtime.Pace: 30 ms-1 s apart, by the UI's cost, the decode's stalls and speed), then how it
ended; it never touches a widget nor reads the app's state. Stop is `chat.cancel()` (thread-safe). The UI reads the
chat (its settings, session, status) only between operations. A job's failure arrives as `Worker.StateChanged`
(ERROR) and becomes an error line; a failing model load is shown in the app.

This class composes the window, binds the keys and routes the messages to its parts, each a collaborator with its
own file: `startup` (the model loaded, or not), `turns` (sending, regenerate, undo, how jobs end), `stream` (the
reply being written), `tokens` (token views and the inspector), `forking`, `ab` (/ab), `sessions`, `settings`,
`playback` (replay), and the slash commands (commands.py: one handler per command of the table). Entry points for the CLI: `run_app(...)` and `run_replay(...)`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from ..textsafe import visible
from . import commands
from .ab_flow import ABFlow
from .controller import ChatController
from .forking import Forking
from .history import show_history
from .inspecting import TokenInspection
from .messages import (AbReady, ChatOpened, JobDone, ReplayFinished, ReplayTurnFinished, ReplayTurnStarted,
                       RuntimeReady, TokensReady, TurnFinished)
from .playback import Playback
from .runtime import Backend, FactoryBackend, ReplayBackend
from .sessions_flow import SessionsFlow
from .settings_flow import SettingsFlow
from .startup import Startup
from .state import Busy
from .stream import ReplyStream
from .turns import Turns
from .widgets import AssistantMessage, ChatView, Inspector, PromptArea, PromptInput, StatusBar, \
    TokenView, UserMessage

WIDE = 120                  # columns from which the inspector is shown by default


class TinyChatApp(App[int]):
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
    # what a replay cannot do: left out of its footer and keys
    REPLAY_OFF = frozenset({"regenerate", "undo", "new_chat", "sessions", "settings", "next_alt", "prev_alt"})

    def __init__(self, backend: Backend, *, replay_speed: float | None = None, inspector: bool | None = None,
                 blink: bool = True, export_dir: Path | None = None):
        super().__init__()
        self.backend = backend
        self.controller = ChatController(self, backend, 1.0 if replay_speed is None else replay_speed)
        self.inspector_pref = inspector            # None: shown when the terminal is wide enough
        self.blink = blink
        self.export_dir = export_dir
        self.strings: list[str] = []               # display text of every token id
        self.notices: list[tuple[str, str]] = []    # (severity, message) of every notification, for tests and logs
        self.turns, self.stream, self.tokens = Turns(self), ReplyStream(self), TokenInspection(self)
        self.forking, self.ab, self.playback = Forking(self), ABFlow(self), Playback(self)
        self.sessions, self.settings, self.startup = SessionsFlow(self), SettingsFlow(self), Startup(self)

    # -- what the parts read ----------------------------------------------------------------------------------------
    @property
    def state(self):
        """The controller's ChatState (the open chat, the running operation, what waits for it)."""
        return self.controller.state

    @property
    def chat(self):
        """The open chat (tinychat.chat.runtime.Chat), None until the model is loaded."""
        return self.controller.chat

    @property
    def busy(self) -> Busy | None:
        """The operation running on the chat thread, None when idle: the app's idle signal."""
        return self.controller.busy

    @property
    def pace(self):
        return self.controller.pace

    @property
    def load_error(self) -> str | None:
        return self.controller.load_error

    @property
    def replay_summary(self) -> ReplayFinished | None:
        return self.playback.summary

    def piece(self, token: int) -> str:
        """A token's display text."""
        return self.strings[token] if 0 <= token < len(self.strings) else ""

    def notify(self, message: str, *, title: str = "", severity: str = "information", **kw) -> None:
        message, title = visible(message), visible(title)       # Rich draws ESC raw: a title could set the window's
        self.notices.append((severity, message))
        kw.setdefault("markup", False)          # messages carry user text and file names, never markup
        super().notify(message, title=title, severity=severity, **kw)

    def error_line(self, text: str) -> None:
        """A failure the user must see: kept under the input until their next action (not a toast that goes), and
        recorded with the notifications."""
        self.notices.append(("error", text))
        self.input_box.show_note(f"✗ {text}  (the next action clears this)")

    def busy_changed(self, kind: Busy | None) -> None:
        # The footer's bindings stay the same whatever the state (an action that does not apply says so when
        # pressed): refreshing them would recompose the footer twice per turn, on the UI thread, while decoding.
        # No cursor blink while a reply streams: each blink repaints the input (UI time, taken from the decode
        # thread through the GIL)
        self.prompt.cursor_blink = self.blink and not (kind is not None and kind.decoding)

    async def show_history(self, note: str = "") -> None:
        """The conversation from the chat's session (after a load, opening a session, a new chat)."""
        await show_history(self, note)

    def update_status(self, st: dict, **extra) -> None:
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

    # -- layout -----------------------------------------------------------------------------------------------------
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
        replay = self.controller.replay_sess
        if replay is not None:
            self.prompt.disabled = True
            speed = self.controller.replay_speed
            self.query_one("#hint").update(f"replay of session {replay.id} at {f'×{speed:g}' if speed else 'full speed'}"
                                           f" · Esc stops · Ctrl+T inspects tokens · Ctrl+Q quits")
        self.prompt.focus()
        # the model (torch's import, the weights) loads on a worker once the window is on screen: a worker running
        # during the first layout and paint would share the GIL with them (torch._C's load holds it ~0.4 s at once)
        self.call_after_refresh(self.controller.load)

    # -- how jobs end -----------------------------------------------------------------------------------------------
    async def on_runtime_ready(self, msg: RuntimeReady) -> None:
        await self.startup.ready(msg)

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR:
            return
        err = event.worker.error
        text = (str(err).strip().splitlines() or [type(err).__name__])[0]
        name = event.worker.name
        if name == "load":
            await self.startup.failed(err, text)
            return
        if name == "replay":
            await self.playback.failed(text)
            return
        kind = self.busy
        if kind is Busy.OPEN and self.sessions.offer_model(err):
            return
        self.error_line(f"{kind.value if kind else name} failed: {text}")
        self.status_bar.update_status(activity="")
        with self.controller.idle_after():
            if self.chat is not None and kind is Busy.AB:
                await self.ab.failed()
            elif self.chat is not None and kind is not None:
                await self.turns.failed(kind)
        self.controller.apply_pending()

    async def on_tokens_ready(self, msg: TokensReady) -> None:
        await self.stream.tokens(msg)

    async def on_turn_finished(self, msg: TurnFinished) -> None:
        await self.stream.finished(msg)

    async def on_job_done(self, msg: JobDone) -> None:
        await self.turns.job_done(msg)

    async def on_chat_opened(self, msg: ChatOpened) -> None:
        await self.sessions.opened(msg)

    async def on_ab_ready(self, msg: AbReady) -> None:
        await self.ab.ready(msg)

    async def on_replay_turn_started(self, msg: ReplayTurnStarted) -> None:
        await self.playback.turn_started(msg)

    async def on_replay_turn_finished(self, msg: ReplayTurnFinished) -> None:
        await self.playback.turn_finished(msg)

    async def on_replay_finished(self, msg: ReplayFinished) -> None:
        await self.playback.finished(msg)

    # -- what the widgets say -----------------------------------------------------------------------------------------
    async def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        await self.turns.submitted(event)

    def on_assistant_message_clicked(self, msg: AssistantMessage.Clicked) -> None:
        self.tokens.focus_reply(msg.message)

    def on_assistant_message_alt_clicked(self, msg: AssistantMessage.AltClicked) -> None:
        self.switch_alt("next", msg.message.index)

    def on_user_message_alt_clicked(self, msg: UserMessage.AltClicked) -> None:
        self.switch_alt("next", msg.message.index)

    def on_token_view_selected(self, msg: TokenView.Selected) -> None:
        self.tokens.selected(msg)

    def on_token_view_leave(self, msg: TokenView.Leave) -> None:
        self.tokens.leave(msg)

    def on_token_view_pick(self, msg: TokenView.Pick) -> None:
        self.forking.pick(msg)

    def on_inspector_back(self, msg: Inspector.Back) -> None:
        self.tokens.back(msg)

    async def on_inspector_picked(self, msg: Inspector.Picked) -> None:
        await self.forking.picked(msg)

    def on_resize(self, event) -> None:
        """The inspector follows the terminal's width both ways (shown from WIDE columns) until toggled by hand."""
        if self.inspector_pref is None:
            for ins in self.query("#inspector"):            # none before the first compose
                ins.display = event.size.width >= WIDE

    # -- keys and commands --------------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """A replay's footer and keys leave out what a replay cannot do (regenerate, undo, a new chat, sessions,
        settings, alternatives): fixed for the app's life, so the footer is composed once."""
        if self.controller.replay_sess is not None and action in self.REPLAY_OFF:
            return False
        return True

    async def run_command(self, line: str) -> None:
        await commands.run(self, line)

    def action_stop(self) -> None:
        self.turns.stop()

    async def action_regenerate(self) -> None:
        await self.turns.regenerate()

    def action_undo(self) -> None:
        self.input_box.clear_note()
        self.controller.undo()

    def action_new_chat(self) -> None:
        self.input_box.clear_note()
        self.controller.new_chat()

    def action_next_alt(self) -> None:
        self.switch_alt("next")

    def action_prev_alt(self) -> None:
        self.switch_alt("prev")

    def switch_alt(self, which: str, index: int | None = None) -> None:
        self.input_box.clear_note()
        self.controller.switch_alt(which, index)

    def action_copy_reply(self) -> None:
        replies = [r for r in self.view.replies() if r.finished]
        if not replies:
            self.notify("no reply to copy yet")
            return
        text = replies[-1].text
        self.copy_to_clipboard(text)
        self.notify(f"copied the last reply ({len(text):,} characters)")

    def action_sessions(self) -> None:
        self.sessions.open_screen()

    def open_session(self, sid: str) -> None:
        self.sessions.open(sid)

    def action_settings(self) -> None:
        self.settings.open()

    def action_tokens(self) -> None:
        self.tokens.last_reply()

    def action_toggle_inspector(self) -> None:
        ins = self.inspector
        ins.display = not ins.display
        self.inspector_pref = ins.display

    def action_help(self) -> None:
        from .screens.help import HelpScreen        # imported when first opened (its Markdown too)
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_help_quit(self) -> None:
        """Ctrl+C (Textual's binding when no selected text is there to copy): stops a reply or a replay, as Esc
        does, and says how to quit (in plain words: notifications here show no markup)."""
        if self.busy is not None and self.busy.decoding:
            self.action_stop()
            self.notify("stopped the reply (Esc stops it too) · Ctrl+Q quits tinychat")
        else:
            self.notify("Ctrl+Q quits tinychat (Ctrl+C stops a reply, or copies selected text)")

    async def action_quit(self) -> None:
        self.controller.cancel_all()
        rc = 2 if self.load_error else 0
        self.exit(rc, return_code=rc)

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield from commands.palette(self)

    def on_unmount(self) -> None:
        self.startup.unfreeze()


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
