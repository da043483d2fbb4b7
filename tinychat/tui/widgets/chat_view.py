"""The conversation: user and assistant messages in a scroll view that follows the stream unless the user
scrolled up. Assistant replies stream as markdown (`MarkdownStream`: finished blocks are not re-rendered per
token); a finished reply can switch to its token view, where each token is selectable (keys or mouse) and the
inspector shows how it was chosen."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from rich.style import Style as RichStyle
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Markdown, Static

from .format import visible

# Textual's paragraph block, through Markdown's public BLOCKS table (tests/app/test_chat.py fails if it moves)
MarkdownParagraph = getattr(Markdown, "BLOCKS", {}).get("paragraph_open")

USER_DISPLAY_LIMIT = 4000       # characters of a user message shown (a 100 KB paste is summarised)


class UserMessage(Static):
    """What the user sent (plain text, never markup). An edited message shows its place among its edits
    ("‹ 1/2 ›" on the border); a click on it then shows the next one."""

    @dataclass
    class AltClicked(Message):
        message: "UserMessage"

    def __init__(self, text: str, **kw):
        shown = visible(text)
        if len(shown) > USER_DISPLAY_LIMIT:
            rest = len(shown) - USER_DISPLAY_LIMIT
            shown = shown[:USER_DISPLAY_LIMIT] + f"\n… ({rest:,} more characters)"
        super().__init__(Content(shown), **kw)
        self.text = text
        self.border_title = "you"
        self.index: int | None = None     # its place in the session's active path
        self.alts = (1, 1)

    def set_alternatives(self, place: int, count: int) -> None:
        self.alts = (place, count)
        self.border_subtitle = f"‹ {place}/{count} › click: next" if count > 1 else ""

    def on_click(self, event: events.Click) -> None:
        if self.alts[1] > 1:
            event.stop()
            self.post_message(UserMessage.AltClicked(self))


class NoticeMessage(Static):
    """A line from the app in the conversation (an error, a note about the session)."""

    def __init__(self, text: str, error: bool = False, **kw):
        super().__init__(Content(visible(text)), **kw)
        if error:
            self.add_class("error")


class TokenView(Widget, can_focus=True):
    """A finished reply as its tokens: one is selected (cursor); ←/→ move, Home/End jump, ↑/↓ go to the
    previous/next reply, Enter or Esc returns to the prompt. Clicking a token selects it. Tab (or a digit: that
    candidate row) moves into the inspector's candidates of the selected token, to fork the reply there."""

    BINDINGS = [
        Binding("left", "move(-1)", "Prev token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("ctrl+left", "move(-10)", show=False),
        Binding("ctrl+right", "move(10)", show=False),
        Binding("home", "jump(0)", show=False),
        Binding("end", "jump(-1)", show=False),
        Binding("up", "other(-1)", "Prev reply", show=False),
        Binding("down", "other(1)", "Next reply", show=False),
        Binding("enter,escape", "leave", "Back to prompt", show=False),
        Binding("tab", "pick", "Candidates", show=False),
        *(Binding(str(n), f"pick({n - 1})", show=False) for n in range(1, 10)),
    ]

    cursor = reactive(0)

    @dataclass
    class Selected(Message):
        view: "TokenView"
        index: int

    @dataclass
    class Pick(Message):
        """Choose among the selected token's candidates (the inspector's rows; row None: start at the chosen one)."""
        view: "TokenView"
        index: int
        row: int | None = None

    @dataclass
    class Leave(Message):
        view: "TokenView"
        direction: int = 0          # -1/1: go to the previous/next reply; 0: back to the prompt

    def on_mount(self) -> None:
        self.auto_links = False     # no @click links here; the link pass would unpickle every segment's style meta

    def __init__(self, **kw):
        super().__init__(**kw)
        self.pieces: list[str] = []
        self.marks: dict[int, str] = {}     # index -> style name: "banned", "lifted", "low", "diverged", "forked"

    def set_tokens(self, pieces: list[str], marks: dict[int, str]) -> None:
        self.pieces, self.marks = pieces, marks
        self.cursor = min(self.cursor, max(0, len(pieces) - 1))
        self.refresh(layout=True)

    STYLES = {"banned": "underline", "lifted": "bold magenta", "low": "yellow", "diverged": "bold red",
              "forked": "bold cyan"}

    def render(self) -> Text:
        t = Text()
        for i, p in enumerate(self.pieces):
            style = self.STYLES.get(self.marks.get(i, ""), "")
            if i == self.cursor:
                style += " reverse" if self.has_focus else " underline"
            t.append(visible(p).replace("\n", "↵\n"), RichStyle.parse(style.strip() or "none") +
                     RichStyle(meta={"token": i}))
        return t or Text("(no tokens)")

    def on_click(self, event: events.Click) -> None:
        i = event.style.meta.get("token")
        event.stop()
        if isinstance(i, int):
            self.action_select(i)
        else:
            self.focus()

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh()
        self.post_message(self.Selected(self, new))

    def on_focus(self) -> None:
        self.refresh()
        self.post_message(self.Selected(self, self.cursor))

    def on_blur(self) -> None:
        self.refresh()

    def action_select(self, index: int) -> None:
        self.focus()
        if 0 <= index < len(self.pieces):
            if self.cursor == index:
                self.post_message(self.Selected(self, index))
            self.cursor = index

    def action_move(self, delta: int) -> None:
        if self.pieces:
            self.cursor = max(0, min(len(self.pieces) - 1, self.cursor + delta))

    def action_jump(self, where: int) -> None:
        if self.pieces:
            self.cursor = where % len(self.pieces)

    def action_other(self, direction: int) -> None:
        self.post_message(self.Leave(self, direction))

    def action_leave(self) -> None:
        self.post_message(self.Leave(self, 0))

    def action_pick(self, row: int | None = None) -> None:
        if self.pieces:
            self.post_message(self.Pick(self, self.cursor, row))

    def scroll_to_cursor(self) -> None:
        self.scroll_visible()


class StreamParagraph(MarkdownParagraph or Static):
    """A markdown paragraph that asks for a layout pass only when its height changes. A streaming reply grows its
    last paragraph many times a second; a layout pass reflows the whole screen (tens of ms on a busy machine), so
    most updates (text added on the same line) just repaint the paragraph."""

    _lines = -1

    def update(self, content="", *, layout: bool = True) -> None:
        width = self.content_region.width
        if isinstance(content, Content) and width > 0:
            lines = len(content.wrap(width))
            layout = layout and lines != self._lines
            self._lines = lines
        super().update(content, layout=layout)

    def on_resize(self) -> None:
        self._lines = -1


_PARSER: MarkdownIt | None = None


def reply_parser() -> MarkdownIt:
    """The one markdown parser of every reply: gfm-like without linkify (bare URLs stay text; [text](url) links
    work). A streaming reply's last block is re-parsed on every update, and Textual builds a parser per append: with
    linkify a 2.4 KB paragraph took 1.27 ms to parse, without it 0.08 ms, and building the parser 0.44 ms more."""
    global _PARSER
    if _PARSER is None:
        _PARSER = MarkdownIt("gfm-like").disable("linkify")
    return _PARSER


class StreamMarkdown(Markdown):
    """Markdown whose paragraphs re-lay out the screen only when they change height, parsed by reply_parser."""
    if MarkdownParagraph is not None:
        BLOCKS = {**Markdown.BLOCKS, "paragraph_open": StreamParagraph}

    def __init__(self, markdown: str | None = None, **kw):
        kw.setdefault("parser_factory", reply_parser)
        super().__init__(markdown, **kw)


class AltSwitch(Static):
    """A reply's place among its alternatives ("‹ 2/3 ›"); a click shows the next one."""

    def on_click(self, event: events.Click) -> None:
        event.stop()
        reply = next((a for a in self.ancestors if isinstance(a, AssistantMessage)), None)
        if reply is not None:
            self.post_message(AssistantMessage.AltClicked(reply))


class AssistantMessage(Vertical):
    """One reply: streamed markdown while it is generated; afterwards its token view on demand."""

    @dataclass
    class Clicked(Message):
        message: "AssistantMessage"

    @dataclass
    class AltClicked(Message):
        """The alternatives indicator was clicked: show the reply's next alternative."""
        message: "AssistantMessage"

    def __init__(self, text: str = "", *, streaming: bool = False, title: str = "assistant", meta: str = "", **kw):
        super().__init__(**kw)
        self.meta = meta
        self.initial = visible(text)
        self.streaming = streaming
        self.text = text                 # the reply's text (as the model produced it)
        self.tokens: list[int] = []
        self.traces: dict[int, Any] = {}  # index -> TokenTrace
        self.pieces: list[str] = []       # display text of each token
        self.marks: dict[int, str] = {}
        self.finished = not streaming
        self.stats: Any = None
        self.divergence: Any = None
        self.recorded: list[int] | None = None    # replay: the recorded reply's ids (for live divergence)
        self.first_divergence: int | None = None
        self._stream = None
        self.border_title = title
        self.index: int | None = None     # its message's place on the session's active path (None: not known)
        self.alts = (1, 1)                # (place, count) among its alternatives

    def compose(self) -> ComposeResult:
        yield StreamMarkdown(self.initial, classes="body")
        yield TokenView(classes="tokens")
        yield AltSwitch(classes="alts")
        yield Static(Content(self.meta), classes="meta")

    def on_mount(self) -> None:
        self.query_one(TokenView).display = False
        self.set_alternatives(*self.alts)
        if self.streaming:
            self.add_class("streaming")
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    def set_alternatives(self, place: int, count: int) -> None:
        """Show "‹ place/count ›" above the reply when it has siblings (nothing otherwise)."""
        self.alts = (place, count)
        try:
            alt = self.query_one(AltSwitch)
        except NoMatches:                 # not composed yet: on_mount shows it
            return
        alt.display = count > 1
        alt.update(f"‹ {place}/{count} ›" if count > 1 else "")

    @property
    def token_view(self) -> TokenView:
        return self.query_one(TokenView)

    async def add_text(self, text: str) -> None:
        if text and self._stream is not None:
            await self._stream.write(visible(text))

    def add_token(self, index: int, token: int, text: str, trace: Any, piece: str) -> None:
        if token < 0:
            self.text += text
            return
        self.text += text
        self.tokens.append(token)
        self.pieces.append(piece)
        if trace is not None:
            self.traces[index] = trace
            mark = _mark(trace)
            if mark:
                self.marks[index] = mark
        if self.recorded is not None and self.first_divergence is None:
            rec = self.recorded[index] if index < len(self.recorded) else None
            if rec != token:
                self.first_divergence = index
                self.add_class("diverged")

    async def finish(self, meta: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.streaming = False
        self.finished = True
        self.remove_class("streaming")
        if self.first_divergence is not None:
            for i in range(self.first_divergence, len(self.tokens)):
                self.marks[i] = "diverged"
        self.set_meta(meta)

    def set_meta(self, meta: str) -> None:
        self.meta = meta
        self.query_one(".meta", Static).update(Content(meta))

    def set_history(self, tokens: list[int], pieces: list[str], traces: dict[int, Any] | None = None,
                    stats: Any = None) -> None:
        """A reply shown from the session: its tokens, and the traces of its draws where the app still has them
        (decoded in this app; a reply restored from a file has none)."""
        self.tokens, self.pieces = list(tokens), list(pieces)
        self.traces, self.stats = dict(traces or {}), stats
        for i, tr in self.traces.items():
            mark = _mark(tr)
            if mark:
                self.marks[i] = mark

    def show_tokens(self, on: bool = True, index: int | None = None) -> None:
        if on and not self.tokens:
            return
        tv = self.token_view
        body = self.query_one(Markdown)
        if on:
            tv.set_tokens(self.pieces, self.marks)
            if index is not None:
                tv.cursor = max(0, min(len(self.pieces) - 1, index))
        body.display = not on
        tv.display = on
        self.set_class(on, "token-mode")
        if on:
            tv.focus()

    def on_click(self, event: events.Click) -> None:
        if self.finished and self.tokens and not self.token_view.display:
            event.stop()
            self.post_message(self.Clicked(self))


def _mark(trace: Any) -> str:
    if getattr(trace, "lifted", False):
        return "lifted"
    if getattr(trace, "banned", None):
        return "banned"
    if getattr(trace, "rank", 0) > 0:
        return "low"
    return ""


class ChatView(VerticalScroll):
    """The conversation; stays at the bottom while a reply streams unless the user scrolled up."""

    def on_mount(self) -> None:
        self.anchor()

    def replies(self) -> list[AssistantMessage]:
        return list(self.query(AssistantMessage))

    async def clear(self) -> None:
        await self.remove_children()
