"""The sessions screen: saved chats (title, date, turns) to open, rename, delete and export; a new chat is one
key away; a filter box (/) keeps the chats whose title or any message (on any branch) holds the text. File
operations go through tinychat.session (no torch)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from ... import session as S
from ... import session_export as SE
from ...fsutil import atomic_write_bytes
from .dialogs import ConfirmDialog, TextDialog


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


class SessionsScreen(ModalScreen[tuple | None]):
    """Dismisses with ("open", id), ("new", None) or None."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "close", "Close"),
    ]

    def __init__(self, current: str | None = None, sessions_dir: Path | None = None, export_dir: Path | None = None,
                 on_renamed: Callable[[str, str], None] | None = None):
        super().__init__()
        self.current, self.sessions_dir = current, sessions_dir
        self.export_dir = export_dir
        self.on_renamed = on_renamed
        self.infos: list[S.SessionInfo] = []       # the rows shown (filtered)
        self.every: list[S.SessionInfo] = []       # every readable session, newest first
        self.errors: list = []
        self._texts: dict[tuple, str] = {}         # (path, updated) -> S.search_text: each file read once

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="sessions"):
            yield Static("Sessions", classes="title")
            yield Input(placeholder="/ filter: title or any message", id="sessions-filter")
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="sessions-note", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("title", "updated", "turns", "id")
        self.reload()
        table.focus()

    def reload(self, keep: str | None = None) -> None:
        errors: list = []
        self.every = S.list_sessions(self.sessions_dir, errors=errors)
        self.errors = errors
        self.show(keep)

    def _text(self, info: S.SessionInfo) -> str:
        key = (str(info.path), info.updated)
        if key not in self._texts:
            self._texts[key] = S.search_text(info.path)
        return self._texts[key]

    def show(self, keep: str | None = None) -> None:
        """Fill the table with the sessions the filter keeps (all when it is empty)."""
        needle = self.query_one("#sessions-filter", Input).value.strip().casefold()
        self.infos = [i for i in self.every if not needle or needle in i.title.casefold() or needle in self._text(i)]
        table = self.query_one(DataTable)
        table.clear()
        for info in self.infos:
            mark = "● " if info.id == self.current else "  "
            table.add_row(mark + info.title, when(info.updated), str(info.n_turns), info.id, key=info.id)
        if not self.every:
            note = "no saved sessions yet: press n for a new chat"
        elif needle:
            note = f"{len(self.infos)} of {len(self.every)} match “{needle}”"
        else:
            note = f"{len(self.every)} saved"
        if self.errors:
            note += f" · {len(self.errors)} unreadable file(s) skipped: {self.errors[0]}"
        note += " · ● open now"
        self.query_one("#sessions-note", Static).update(note)
        if keep is not None:
            ids = [i.id for i in self.infos]
            if keep in ids:
                table.move_cursor(row=ids.index(keep))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "sessions-filter":
            self.show()

    def action_filter(self) -> None:
        self.query_one("#sessions-filter", Input).focus()

    def selected(self) -> S.SessionInfo | None:
        table = self.query_one(DataTable)
        if not self.infos or table.cursor_row is None or not 0 <= table.cursor_row < len(self.infos):
            return None
        return self.infos[table.cursor_row]

    def action_open(self) -> None:
        info = self.selected()
        if info is not None:
            self.dismiss(("open", info.id))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_new(self) -> None:
        self.dismiss(("new", None))

    def action_close(self) -> None:
        box = self.query_one("#sessions-filter", Input)
        if box.has_focus:                   # Escape in the filter box: clear it, back to the list
            box.value = ""
            self.query_one(DataTable).focus()
            return
        self.dismiss(None)

    def action_rename(self) -> None:
        info = self.selected()
        if info is None:
            return

        def done(title: str | None) -> None:
            if not title or not title.strip():
                return
            try:
                S.rename(info.id, title, self.sessions_dir)
            except (S.SessionError, OSError) as e:
                self.notify(str(e), severity="error")
                return
            if self.on_renamed is not None:
                self.on_renamed(info.id, " ".join(title.split()))
            self.reload(keep=info.id)
        self.app.push_screen(TextDialog(f"New title for {info.id}:", info.title), done)

    def action_delete(self) -> None:
        info = self.selected()
        if info is None:
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                S.delete(info.id, self.sessions_dir)
            except (S.SessionError, OSError) as e:
                self.notify(str(e), severity="error")
                return
            self.notify(f"deleted {info.title}")
            self.reload()
        extra = " (the open chat: it is saved again at its next turn)" if info.id == self.current else ""
        self.app.push_screen(ConfirmDialog(f"Delete “{info.title}”{extra}?"), done)

    def action_export(self) -> None:
        info = self.selected()
        if info is None:
            return
        try:
            sess = S.load(info.id, self.sessions_dir)
            out = (self.export_dir or Path.cwd()) / f"tinychat-{info.id}.md"
            atomic_write_bytes(out, SE.export_markdown(sess).encode("utf-8"))
        except (S.SessionError, OSError) as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"exported to {out}")
