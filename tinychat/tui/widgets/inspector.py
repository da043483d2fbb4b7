"""The sampler inspector: how one token was chosen. For the token being generated (live) or a selected token of a
finished reply: the top candidates with probability bars before (raw) and after the repetition penalty and the
phrase ban (final), banned candidates struck through with the earlier 3-gram that banned them, penalised ones
marked, the chosen token and its rank; and the turn's counters (tokens banned, mass removed, dead-end lifts).

Reads a `TokenTrace` (tinychat.sampler) by its attributes only; no torch here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widget import Widget

from ...textsafe import plural
from .format import token_label

BAR = 9
BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(p: float, width: int = BAR) -> str:
    """A horizontal bar of `width` cells for a probability in [0, 1] (eighth-cell resolution)."""
    eighths = int(round(max(0.0, min(1.0, p)) * width * 8))
    full, part = divmod(eighths, 8)
    s = "█" * full + (BLOCKS[part] if part and full < width else "")
    return s.ljust(width)


@dataclass
class Counters:
    """A turn's sampler counters (live from the traces so far, or the finished turn's stats)."""
    tokens: int = 0
    banned_tokens: int = 0
    banned_steps: int = 0
    banned_mass: float = 0.0
    lifts: int = 0
    penalised: int | None = None      # ids under the repetition penalty (known when the turn ends)

    @classmethod
    def from_traces(cls, traces: Iterable[Any]) -> "Counters":
        c = cls()
        for tr in traces:
            c.tokens += 1
            if tr.lifted:
                c.lifts += 1
            if tr.banned and not getattr(tr, "ended", False):     # a lift keeps the reply's own 3-grams banned
                c.banned_steps += 1
                c.banned_tokens += len(tr.banned)
                c.banned_mass += tr.banned_mass
        return c

    @classmethod
    def from_stats(cls, stats: Any, tokens: int) -> "Counters":
        return cls(tokens, stats.banned_tokens, stats.banned_steps, stats.banned_mass, stats.lifts, stats.penalised)

    def line(self) -> Text:
        t = Text()
        t.append("this turn ", style="bold")
        t.append(f"{plural(self.tokens, 'token')} · ")
        t.append(f"{self.banned_tokens:,} banned", style="red" if self.banned_tokens else "")
        t.append(f" in {plural(self.banned_steps, 'step')} · mass removed {self.banned_mass:.2f} · ")
        t.append(plural(self.lifts, "lift"), style="magenta" if self.lifts else "")
        if self.penalised is not None:
            t.append(f" · {plural(self.penalised, 'id')} penalised")
        return t


class InspectorBody(Widget):
    """What the inspector shows. Updated several times a second while decoding, so it repaints only itself; its
    height only grows (to the tallest trace shown so far), so a layout pass of the whole screen, tens of ms on a
    busy machine, happens a few times per session instead of on every update (a `Static.update` would relayout)."""

    DEFAULT_CSS = "InspectorBody { height: auto; }"

    def on_mount(self) -> None:
        self.auto_links = False     # no @click links here; the link pass would unpickle every segment's style meta

    def __init__(self, text: Text, **kw):
        super().__init__(**kw)
        self.text = text
        self.lines = 1              # the height it keeps (rendered text is padded to it)

    def render(self) -> Text:
        return self.text

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(self.lines, self._wrapped(width))

    def _wrapped(self, width: int) -> int:
        width = max(1, width)
        return sum(max(1, -(-len(line) // width)) for line in self.text.plain.split("\n"))

    def set(self, text: Text) -> None:
        self.text = text
        need = self._wrapped(self.content_region.width or 40)
        grow = need > self.lines
        self.lines = max(self.lines, need)
        self.refresh(layout=grow)

    def on_resize(self) -> None:
        self.lines = self._wrapped(self.content_region.width or 40)


class Inspector(VerticalScroll):
    """Side panel; `show_trace` / `show_text` replace what it shows."""

    BINDINGS = [
        Binding("up", "pick_move(-1)", "Prev candidate", show=False),
        Binding("down", "pick_move(1)", "Next candidate", show=False),
        Binding("enter", "pick_confirm", "Fork here", show=False),
        Binding("escape,tab", "back", "Back to the tokens", show=False),
        *(Binding(str(n), f"pick_row({n - 1})", show=False) for n in range(1, 10)),
    ]

    @dataclass
    class Picked(Message):
        """A candidate was chosen (Enter, or a second click on its row): fork the reply there with it."""
        token: int

    @dataclass
    class Back(Message):
        """Leave the candidates (Esc, Tab): back to the token view."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "sampler"
        self.trace: Any = None
        self.rendered: Text = Text()
        self.pickable = False           # the trace is a finished reply's: its candidates can be picked
        self.pick: int | None = None    # the candidate row picked (shown while the panel has focus)
        self._shown: tuple = ()         # what show_trace was given (to render again with the pick)

    def compose(self) -> ComposeResult:
        yield InspectorBody(Text("Send a message: each token's candidates appear here as it is sampled.",
                                 style="dim"), id="inspector-body")

    def _set(self, text: Text) -> None:
        self.rendered = text
        self.query_one(InspectorBody).set(text)

    def show_text(self, text: str) -> None:
        self.trace = None
        self.pickable, self.pick = False, None
        self._set(Text(text, style="dim"))

    def show_trace(self, trace: Any, strings: Sequence[str], counters: Counters | None, heading: str = "",
                   pickable: bool = False) -> None:
        self.trace = trace
        self.pickable, self.pick = pickable and trace is not None and bool(trace.candidates), None
        self._shown = (strings, counters, heading)
        self._set(render_trace(trace, strings, counters, heading))

    # -- picking a candidate (a finished reply's token): the app forks the reply with it ---------------------------
    def start_pick(self, row: int | None = None) -> bool:
        """Focus the candidates with `row` picked (default: the chosen token's); False when there are none."""
        if not self.pickable:
            return False
        cands = self.trace.candidates
        if row is None:
            row = next((i for i, c in enumerate(cands) if c.token == self.trace.token), 0)
        self._repick(max(0, min(len(cands) - 1, row)))
        self.focus()
        return True

    def _repick(self, row: int | None) -> None:
        self.pick = row
        strings, counters, heading = self._shown
        if row is not None:
            heading = (heading + "\n" if heading else "") + "fork: ↑/↓ 1-9 pick · Enter forks here · Esc back"
        self._set(render_trace(self.trace, strings, counters, heading, pick=row))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The picking keys only while candidates are picked: else Esc, Tab, Enter and digits do what they do in
        the app (Esc stops a reply or a replay)."""
        if action in ("back", "pick_confirm", "pick_row"):
            return self.pick is not None
        return True

    def on_blur(self) -> None:
        if self.pick is not None:
            self._repick(None)

    def action_pick_move(self, delta: int) -> None:
        if self.pick is None:
            self.scroll_relative(y=delta, animate=False)
            return
        self._repick(max(0, min(len(self.trace.candidates) - 1, self.pick + delta)))

    def action_pick_row(self, row: int) -> None:
        if self.pickable and row < len(self.trace.candidates):
            self._repick(row)

    def action_pick_confirm(self) -> None:
        if self.pick is not None:
            self.post_message(self.Picked(self.trace.candidates[self.pick].token))

    def action_back(self) -> None:
        self.post_message(self.Back())

    def on_click(self, event: events.Click) -> None:
        row = event.style.meta.get("candidate") if event.style else None
        if not self.pickable or not isinstance(row, int):
            return
        event.stop()
        if self.pick == row and self.has_focus:
            self.action_pick_confirm()
        else:
            self.start_pick(row)


def _label(strings: Sequence[str], tok: int, width: int = 10) -> str:
    return token_label(strings[tok] if 0 <= tok < len(strings) else f"<{tok}>", width)


def render_trace(trace: Any, strings: Sequence[str], counters: Counters | None, heading: str = "",
                 pick: int | None = None) -> Text:
    """The panel's text; each candidate row carries its place ({"candidate": i} in its style's meta, for clicks);
    `pick`: the row picked (reversed)."""
    t = Text(no_wrap=False)
    if heading:
        t.append(heading + "\n", style="bold")
    if trace is None:
        t.append("no trace recorded for this token: the reply was restored from a session, or generated while "
                 "the inspector was hidden (F3 shows it; replies then record their traces)\n", style="dim")
    else:
        t.append("chosen ")
        t.append(f"«{_label(strings, trace.token, 16)}»", style="bold reverse")
        t.append(" ")
        t.append(f" rank {trace.rank}  p {trace.p_final:.3f}\n", style="bold")
        top = max((max(c.p_raw, c.p_final) for c in trace.candidates), default=1.0) or 1.0
        if getattr(trace, "ended", False):
            t.append("■ the reply ended here: nothing was left but its own 3-grams\n", style="magenta")
        elif trace.lifted:
            t.append("⚠ earlier turns' bans lifted: they would have left almost no probability mass"
                     + (" (the reply's own 3-grams stay banned)" if trace.banned else "") + "\n", style="magenta")
        if trace.banned and not getattr(trace, "ended", False):
            t.append(f"✗ {len(trace.banned)} banned · mass {trace.banned_mass:.3f}\n", style="red")
        t.append("\n  token      " + "raw".ljust(BAR + 1) + "final".ljust(BAR + 1) + "  p\n", style="dim")
        for row, c in enumerate(trace.candidates):
            start = len(t)
            chosen = c.token == trace.token
            row_style = "" if c.in_nucleus or c.banned_by else "dim"
            t.append("▸ " if chosen else "  ", style="bold green" if chosen else "")
            lab = _label(strings, c.token).ljust(10)
            if c.banned_by is not None:
                t.append(lab, style="strike red")
            elif c.penalised:
                t.append(lab, style="yellow " + row_style)
            else:
                t.append(lab, style=("bold " if chosen else "") + row_style)
            t.append(" ")
            t.append(bar(c.p_raw / top), style="grey50")
            t.append(" ")
            t.append(bar(c.p_final / top), style="red" if c.banned_by is not None else
                     ("green" if chosen else ("yellow" if c.penalised else "cyan")))
            t.append(f" {c.p_final * 100:5.1f}%", style=row_style)
            marks = ("✗" if c.banned_by is not None else "") + ("↓" if c.penalised else "") + \
                    ("" if c.in_nucleus or c.banned_by is not None else "○")
            t.append(f" {marks}\n", style="red" if c.banned_by is not None else "yellow")
            t.stylize(Style(meta={"candidate": row}), start, len(t) - 1)
            if row == pick:
                t.stylize("reverse", start, len(t) - 1)
            if c.banned_by is not None:
                gram = " ".join(_label(strings, x, 8) for x in (*c.banned_by, c.token))
                t.append(f"    banned: «{gram}» said before\n", style="red dim")
    if counters is not None:
        t.append("\n")
        t.append_text(counters.line())
        t.append("\n")
    t.append("\n✗ banned (3-gram said before)  ↓ penalised  ○ outside top-p  raw: before penalty and ban · bars relative to the top candidate",
             style="dim italic")
    return t
