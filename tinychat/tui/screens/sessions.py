"""The sessions screen: saved chats (title, model, date, turns, id) to open, rename, delete and export (to a path it
asks for); a new chat is one key away; a filter box (/) keeps the chats whose title or any message (on any branch)
holds the text, ↓ goes from it into the list. The columns fit the screen's width (below 100 columns the id moves to
the line under the list). File operations go through tinychat.sessions (no torch)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from ...sessions import session as session_files
from ...sessions import export as session_export
from ...fsutil import OutPathError, write_out
from .dialogs import ConfirmDialog, TextDialog


def when(t: float, short: bool = False) -> str:
    return time.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M", time.localtime(t))


NARROW = 96         # table widths below this show the short date and leave the id to the note line


def columns(width: int) -> list[tuple[str, int]]:
    """(heading, width) of the table's columns for a table `width` cells wide: the title takes what the others
    leave (each column also takes 2 cells of padding)."""
    narrow = width < NARROW
    fixed = [("model", 12 if narrow else 16), ("updated", 11 if narrow else 16), ("turns", 5)]
    if not narrow:
        fixed.append(("id", 26))
    title = max(8, width - sum(w + 2 for _, w in fixed) - 2 - 1)        # -1: the vertical scrollbar
    return [("title", title), *fixed]


def fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


class FilterInput(Input):
    """The filter box: ↓ (or Enter) moves into the list below it."""

    BINDINGS = [Binding("down", "to_list", "To the list", show=False)]

    def action_to_list(self) -> None:
        self.screen.query_one(DataTable).focus()


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
        self.infos: list[session_files.SessionInfo] = []       # the rows shown (filtered)
        self.every: list[session_files.SessionInfo] = []       # every readable session, newest first
        self.errors: list = []
        self._texts: dict[tuple, str] = {}         # (path, updated) -> session_files.search_text: each file read once

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="sessions"):
            yield Static("Sessions", classes="title")
            yield FilterInput(placeholder="/ filter: title or any message (↓: to the list)", id="sessions-filter")
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="sessions-note", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        self._layout: list[tuple[str, int]] = []
        self.reload()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        if self._layout and columns(self.query_one(DataTable).size.width) != self._layout:
            self.show(keep=getattr(self.selected(), "id", None))

    def reload(self, keep: str | None = None) -> None:
        errors: list = []
        self.every = session_files.list_sessions(self.sessions_dir, errors=errors)
        self.errors = errors
        self.show(keep)

    def _text(self, info: session_files.SessionInfo) -> str:
        key = (str(info.path), info.updated)
        if key not in self._texts:
            self._texts[key] = session_files.search_text(info.path)
        return self._texts[key]

    def show(self, keep: str | None = None) -> None:
        """Fill the table with the sessions the filter keeps (all when it is empty)."""
        needle = self.query_one("#sessions-filter", Input).value.strip().casefold()
        self.infos = [i for i in self.every if not needle or needle in i.title.casefold() or needle in self._text(i)]
        table = self.query_one(DataTable)
        layout = columns(table.size.width or self.app.size.width - 6)
        if layout != self._layout:
            table.clear(columns=True)
            for heading, width in layout:
                table.add_column(heading, width=width, key=heading)
            self._layout = layout
        else:
            table.clear()
        w = dict(layout)
        for info in self.infos:
            mark = "● " if info.id == self.current else "  "
            row = [fit(mark + info.title, w["title"]), fit(info.model or "?", w["model"]),
                   when(info.updated, short=w["updated"] < 16), str(info.n_turns)]
            if "id" in w:
                row.append(info.id)
            table.add_row(*row, key=info.id)
        if not self.every:
            note = "no saved sessions yet: press n for a new chat"
        elif needle:
            note = f"{len(self.infos)} of {len(self.every)} match “{needle}”"
        else:
            note = f"{len(self.every)} saved"
        if self.errors:
            note += f" · {len(self.errors)} unreadable file(s) skipped: {self.errors[0]}"
        note += " · ● open now"
        self._note = note
        if keep is not None:
            ids = [i.id for i in self.infos]
            if keep in ids:
                table.move_cursor(row=ids.index(keep))
        self._show_note()

    def _show_note(self) -> None:
        """The note line; where the table has no id column, the selected session's id first."""
        note = getattr(self, "_note", "")
        info = self.selected()
        if info is not None and "id" not in dict(self._layout):
            note = f"id {info.id} · {note}"
        self.query_one("#sessions-note", Static).update(note)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_note()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "sessions-filter":
            self.show()

    def action_filter(self) -> None:
        self.query_one("#sessions-filter", Input).focus()

    def selected(self) -> session_files.SessionInfo | None:
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
                session_files.rename(info.id, title, self.sessions_dir)
            except (session_files.SessionError, OSError) as e:
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
                session_files.delete(info.id, self.sessions_dir)
            except (session_files.SessionError, OSError) as e:
                self.notify(str(e), severity="error")
                return
            self.notify(f"deleted {info.title}")
            self.reload()
        extra = " (the open chat: it is saved again at its next turn)" if info.id == self.current else ""
        self.app.push_screen(ConfirmDialog(f"Delete “{info.title}”{extra}?"), done)

    def action_export(self) -> None:
        """Export the selected session as markdown to a path the user confirms (default: the export folder or the
        working folder, tinychat-ID.md); a folder given takes that file name; an existing file is replaced only
        after a yes."""
        info = self.selected()
        if info is None:
            return
        name = f"tinychat-{info.id}.md"
        default = (self.export_dir or Path.cwd()) / name

        def write(out: Path) -> None:
            try:
                sess = session_files.load(info.id, self.sessions_dir)
                write_out(out, session_export.export_markdown(sess).encode("utf-8"))     # a link: its target written
            except (session_files.SessionError, OutPathError, OSError) as e:
                self.notify(f"not exported: {e}", severity="error")
                return
            self.notify(f"exported to {out}")

        def chosen(text: str | None) -> None:
            if not text or not text.strip():
                return
            out = Path(text.strip()).expanduser()
            if out.is_dir():
                out = out / name
            if out.exists() and not out.is_file():
                self.notify(f"not exported: {out} is not a regular file", severity="error")
                return
            if out.exists():
                self.app.push_screen(ConfirmDialog(f"Replace {out}?"), lambda yes: write(out) if yes else None)
                return
            write(out)
        self.app.push_screen(TextDialog(f"Export “{info.title}” as markdown to:", str(default)), chosen)
