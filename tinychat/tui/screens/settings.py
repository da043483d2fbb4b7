"""The settings screen: the sampler and turn settings (as `/set`), applied from the next turn and recorded with it
in the session; below them the app's preferences (tinychat/prefs.py: reopen the last chat on start, save one-shots),
which apply to every chat and are saved at once. Works on plain values: the app validates the settings against the
chat's `ChatSettings` and writes the preferences."""
from __future__ import annotations

from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, Switch

from ...sampler_defaults import TINYCHAT

# key, label, help
FIELDS: list[tuple[str, str, str]] = [
    ("temperature", "Temperature", "0 = greedy"),
    ("top_p", "Top-p", "nucleus mass, 0.01–1"),
    ("penalty", "Repetition penalty", "1 = off"),
    ("penalty_window", "Penalty window", "recent content tokens"),
    ("ban", "Phrase ban", "no 3-gram already said"),
    ("no_parrot", "No-parrot", "nor the user's 3-grams"),
    ("ban_reply", "Reply ban", "no loop within a reply"),
    ("max_new", "Max new tokens", "per reply"),
    ("seed", "Seed", "a number repeats a reply"),
    ("system_prompt", "System prompt", "opens a new chat"),
]


PLACEHOLDERS = {"seed": "random per turn"}     # an empty field's text where it is not the help's

# the app's preferences (tinychat.prefs.Prefs fields): key, label, help
PREFS: list[tuple[str, str, str]] = [
    ("reopen_last", "Reopen last chat", "on start, as -c"),
    ("save_one_shots", "Save one-shots", "-p / -f chats"),
]
PREF = "app:"               # the prefix of a preference's key in what the screen dismisses with


def sources_line(sources: dict[str, str]) -> str:
    """Where the values come from, grouped: "Temperature, Top-p: SmolLM2's model card (tinychat's table) · Max new
    tokens: a command-line flag · the rest: tinychat's defaults" (sampler_defaults.resolve's sources)."""
    words = {"flag": "a command-line flag", "/set": "changed here or with /set", TINYCHAT: "tinychat's defaults"}
    groups: dict[str, list[str]] = {}
    for key, label, _ in FIELDS:
        src = sources.get(key, TINYCHAT)
        if src != TINYCHAT:
            groups.setdefault(words.get(src, src), []).append(label)
    parts = [f"{', '.join(labels)}: {src}" for src, labels in groups.items()]
    rest = "the rest: " if parts else "all: "
    return "Where the values come from: " + " · ".join(parts + [rest + words[TINYCHAT]])


class SettingsScreen(ModalScreen[dict | None]):
    """Dismisses with the changes as {key: text} (Save, Ctrl+S) or None (Esc): the settings' keys as /set takes
    them, the preferences' as "app:NAME" ("on" / "off")."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, values: dict, check: Callable[[dict], str | None] | None = None, note: str = "",
                 prefs: dict | None = None, sources: dict[str, str] | None = None):
        """sources: where each value came from (sampler_defaults.resolve; the app adds "/set"), shown under them."""
        super().__init__()
        self.values, self.check, self.note = dict(values), check, note
        self.prefs = dict(prefs or {})
        self.sources = dict(sources or {})

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="settings"):
            yield Static("Settings", classes="title")
            yield Static("Changes apply from the next turn and are recorded with it in the session.",
                         classes="dim")
            if self.sources:
                yield Static(sources_line(self.sources), classes="dim", id="settings-sources")
            with VerticalScroll(id="settings-fields"):     # scrolls on a short terminal; the buttons stay in view
                with Grid(id="settings-grid"):
                    for key, label, help_ in FIELDS:
                        v = self.values.get(key)
                        yield Label(label)
                        if isinstance(v, bool):
                            yield Switch(v, id=f"set-{key}")
                        else:
                            yield Input("" if v is None else str(v), id=f"set-{key}",
                                        placeholder=PLACEHOLDERS.get(key, help_), compact=True)
                        yield Label(help_, classes="dim")
                if self.note:
                    yield Static(self.note, classes="dim")
                if self.prefs:
                    yield Static("For every chat (saved at once, in prefs.json):", classes="dim settings-group")
                    with Grid(id="prefs-grid", classes="settings-grid"):
                        for key, label, help_ in PREFS:
                            yield Label(label)
                            yield Switch(bool(self.prefs.get(key)), id=f"pref-{key}")
                            yield Label(help_, classes="dim")
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save (Ctrl+S)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        for w in self.query(Input):
            w.cursor_blink = getattr(self.app, "blink", True)
        self.query_one("#set-temperature").focus()

    def changes(self) -> dict[str, str]:
        out = {}
        for key, _, _ in FIELDS:
            w = self.query_one(f"#set-{key}")
            old = self.values.get(key)
            if isinstance(w, Switch):
                if w.value != old:
                    out[key] = "on" if w.value else "off"
            else:
                text = w.value.strip() if key != "system_prompt" else w.value
                if text != ("" if old is None else str(old)):
                    out[key] = text
        for key, _, _ in PREFS if self.prefs else ():
            on = self.query_one(f"#pref-{key}", Switch).value
            if on != bool(self.prefs.get(key)):
                out[PREF + key] = "on" if on else "off"
        return out

    def action_save(self) -> None:
        ch = self.changes()
        settings = {k: v for k, v in ch.items() if not k.startswith(PREF)}
        err = self.check(settings) if self.check is not None and settings else None
        if err:
            self.query_one("#settings-error", Static).update(err)
            self.query_one("#settings-error").add_class("error")
            return
        self.dismiss(ch)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()
