"""The sampler A/B screen (`/ab KEY=VALUE ...`): the last turn decoded with the current settings (A) and the changed
ones (B), one seed, in two columns; the text up to the first difference plain, the differing token highlighted on
both sides, the cause beneath. Keys: a (or Escape) keeps A, b keeps B, s keeps B and adopts its settings.

The decodes run on the app's chat worker; this screen shows a loading line until the app hands it the result
(`show_result`, on the UI thread). It reads the result's plain fields only: no torch, no chat runtime."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, LoadingIndicator, Static

from ...textsafe import safe_line, safe_text

if TYPE_CHECKING:
    from ...chat.ab import ABResult, Side


def side_text(side: Side) -> Text:
    """A side's reply: plain up to the first differing token, that token highlighted, the rest dimmed."""
    t = Text(safe_text(side.before))
    if side.token_text:
        t.append(safe_text(side.token_text) or "·", style="bold reverse")
    if side.after:
        t.append(safe_text(side.after), style="dim")
    return t


class ABScreen(ModalScreen[str | None]):
    """Dismisses with "A", "B", "B+settings" (what to keep), or None (closed while the decodes ran)."""

    BINDINGS = [Binding("escape", "close", "Close"), Binding("a", "keep('A')", "Keep A"),
                Binding("b", "keep('B')", "Keep B"), Binding("s", "keep('B+settings')", "Keep B + settings")]

    def __init__(self, label: str):
        super().__init__()
        self.label = label
        self.result: ABResult | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="ab"):
            yield Static(f"Sampler A/B · B: {safe_line(self.label)}", classes="title", id="ab-title")
            yield Static("Decoding your last message twice with one seed…", classes="dim", id="ab-status")
            yield LoadingIndicator(id="ab-loading")
            with Horizontal(id="ab-columns"):
                with VerticalScroll(classes="ab-side", id="ab-a"):
                    yield Static("A · current settings", classes="ab-head")
                    yield Static("", id="ab-a-text")
                with VerticalScroll(classes="ab-side", id="ab-b"):
                    yield Static(f"B · {safe_line(self.label)}", classes="ab-head")
                    yield Static("", id="ab-b-text")
            yield Static("", id="ab-cause")
            with Horizontal(classes="buttons"):
                yield Button("Keep A (a)", id="keep-a", variant="primary", disabled=True)
                yield Button("Keep B (b)", id="keep-b", disabled=True)
                yield Button("Keep B + its settings (s)", id="keep-b-settings", disabled=True)

    def show_result(self, r: ABResult) -> None:
        """Fill the columns with the A/B's result (called by the app on the UI thread)."""
        self.result = r
        self.query_one("#ab-loading").display = False
        self.query_one("#ab-title", Static).update(f"Sampler A/B · seed {r.seed} · B: {safe_line(r.label)}")
        where = "The replies are the same." if r.diff is None else f"First difference at token {r.diff}."
        self.query_one("#ab-status", Static).update(f"{where} A is the active reply; both are kept as alternatives.")
        self.query_one("#ab-a-text", Static).update(side_text(r.a))
        self.query_one("#ab-b-text", Static).update(side_text(r.b))
        self.query_one("#ab-cause", Static).update(Text(safe_line(r.cause), style="bold"))
        for b in self.query(Button):
            b.disabled = False
        self.query_one("#keep-a", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        choice = {"keep-a": "A", "keep-b": "B", "keep-b-settings": "B+settings"}.get(event.button.id or "")
        if choice:
            self.action_keep(choice)

    def action_keep(self, choice: str) -> None:
        if self.result is not None:
            self.dismiss(choice)

    def action_close(self) -> None:
        self.dismiss("A" if self.result is not None else None)
