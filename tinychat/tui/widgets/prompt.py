"""The message input: multi-line (Enter sends, Ctrl+J / Shift+Enter / Alt+Enter insert a newline), history
recall with ↑/↓ at the first/last line, Tab completion of slash commands with a hint line, and big pastes
collapsed into a placeholder so a 100 KB paste never lands in the editor (the full text is sent)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.content import Content
from textual.widgets import Static, TextArea

from ...textin import count_lines, lf
from ...textsafe import plural
from .. import commands

PASTE_INLINE_CHARS = 2000       # pastes longer than this (or with more lines) become a placeholder
PASTE_INLINE_LINES = 40
NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter", "ctrl+enter")
_PLACEHOLDER = re.compile(r"\[paste #([0-9]+): [0-9,]+ chars?, [0-9,]+ lines?\]")


def _inline(text: str) -> bool:
    """Whether `text` goes into the editor as it is (else as a paste placeholder)."""
    return len(text) <= PASTE_INLINE_CHARS and count_lines(text) <= PASTE_INLINE_LINES


class PromptArea(TextArea):
    """The editor itself."""

    @dataclass
    class Submitted(Message):
        area: "PromptArea"
        text: str

    def __init__(self, **kw):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kw)
        self.sent: list[str] = []
        self._hist_pos: int | None = None       # index into history while recalling
        self._draft = ""
        self.pastes: dict[int, str] = {}

    # -- sending --------------------------------------------------------------------------------------------
    def expanded(self, text: str | None = None) -> str:
        """The text to send: placeholders replaced by the pasted text they stand for."""
        text = self.text if text is None else text

        def sub(m: re.Match) -> str:
            return self.pastes.get(int(m.group(1)), m.group(0))
        return _PLACEHOLDER.sub(sub, text)

    def submit(self) -> None:
        text = self.expanded()
        if not text.strip():
            return
        raw = self.text
        if not self.sent or self.sent[-1] != raw:
            self.sent.append(raw)
        self._hist_pos = None
        self.post_message(self.Submitted(self, text))     # the app clears the input once it takes the text

    def clear_input(self) -> None:
        self.load_text("")          # the pastes stay: history entries and restores may name them

    def set_input(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def restore(self, text: str) -> None:
        """Put a message the chat gave back (a failed send, an undone turn) into the input: as it was typed when it
        is the last one sent (its paste placeholders kept), else as text, a long one collapsed like a paste."""
        if self.sent and self.expanded(self.sent[-1]) == text:
            self.set_input(self.sent[-1])
        elif _inline(text):
            self.set_input(text)
        else:
            self.set_input(self._stash(text))

    def set_history(self, texts: list[str]) -> None:
        """↑/↓ recall these (a chat's messages, oldest first; the last 200), long ones as paste placeholders."""
        self.sent = [t if _inline(t) else self._stash(t) for t in texts[-200:]]
        self._hist_pos = None

    def _stash(self, text: str) -> str:
        """`text` kept as paste #n (the number it has if kept already); its placeholder."""
        n = next((k for k, v in self.pastes.items() if v == text), max(self.pastes, default=0) + 1)
        self.pastes[n] = text
        return f"[paste #{n}: {plural(len(text), 'char')}, {plural(count_lines(text), 'line')}]"

    # -- keys -----------------------------------------------------------------------------------------------
    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
            return
        if key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self._replace_via_keyboard("\n", *self.selection)
            return
        if key == "tab" and self.text.startswith("/"):
            done = commands.complete(self.text)
            event.stop()
            event.prevent_default()
            if done:
                self.set_input(done)
            return
        if key == "up" and self.cursor_location[0] == 0 and self.sent and self.selection.is_empty:
            event.stop()
            event.prevent_default()
            self._recall(-1)
            return
        if key == "down" and self._hist_pos is not None and self.cursor_location[0] == self.document.line_count - 1:
            event.stop()
            event.prevent_default()
            self._recall(1)
            return
        await super()._on_key(event)

    def _recall(self, step: int) -> None:
        if self._hist_pos is None:
            if step > 0:
                return
            self._draft = self.text
            self._hist_pos = len(self.sent)
        pos = self._hist_pos + step
        if pos < 0:
            return
        if pos >= len(self.sent):
            self._hist_pos = None
            self.set_input(self._draft)
            return
        self._hist_pos = pos
        self.set_input(self.sent[pos])

    # -- pastes ---------------------------------------------------------------------------------------------
    async def _on_paste(self, event: events.Paste) -> None:
        """Every paste is handled here, once: its line breaks as LF (terminals send CR), a big one as a placeholder.
        Textual runs each class's `_on_paste` along the MRO, so the default is prevented rather than called (calling
        it, as TextArea's own handler then ran too, inserted every inline paste twice)."""
        event.stop()
        event.prevent_default()
        if self.read_only:
            return
        text = lf(event.text)
        result = self._replace_via_keyboard(text if _inline(text) else self._stash(text), *self.selection)
        if result:
            self.move_cursor(result.end_location)
        self.focus()


class PromptInput(Vertical):
    """The editor and its hint line. The line shows the command hints as the text changes, except while it holds a
    message that must stay in view until the next action (`show_note`: a failed send's reason, a message queued
    while the model loads); the editor's border title says when Enter sends an edit (`set_mode`)."""

    def compose(self) -> ComposeResult:
        yield PromptArea(id="prompt")
        yield Static(commands.hint(""), id="hint")

    def on_mount(self) -> None:
        self.note: str | None = None

    @property
    def area(self) -> PromptArea:
        return self.query_one(PromptArea)

    def show_note(self, text: str, error: bool = True) -> None:
        """Keep `text` in the hint line (red when an error) until clear_note()."""
        self.note = text
        hint = self.query_one("#hint", Static)
        hint.update(Content(text))
        hint.set_class(error, "error")
        hint.set_class(not error, "queued")

    def clear_note(self) -> None:
        if getattr(self, "note", None) is None:
            return
        self.note = None
        hint = self.query_one("#hint", Static)
        hint.remove_class("error", "queued")
        hint.update(commands.hint(self.area.text))

    def set_mode(self, title: str | None) -> None:
        """The editor's border title (None: none) and its edit-mode look."""
        self.area.border_title = title
        self.area.set_class(title is not None, "editing")

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if getattr(self, "note", None) is None:
            self.query_one("#hint", Static).update(commands.hint(event.text_area.text))
