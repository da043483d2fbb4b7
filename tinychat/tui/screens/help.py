"""The help screen: every key and slash command."""
from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Markdown, Static

from ..commands import COMMANDS

KEYS = [
    ("Enter", "send the message"),
    ("Ctrl+J (or Shift/Alt+Enter)", "insert a newline"),
    ("↑ / ↓ (first / last line)", "recall earlier messages"),
    ("Tab", "complete a slash command"),
    ("Esc", "stop the reply being generated (or a replay)"),
    ("Ctrl+R", "regenerate the last reply (the old one stays an alternative)"),
    ("Alt+← / Alt+→ (Shift+F4 / F4)", "the last reply's previous / next alternative; or click its ‹ 2/3 ›"),
    ("Ctrl+B", "undo the last turn (its text returns to the input)"),
    ("Ctrl+O", "copy the last reply to the clipboard"),
    ("Ctrl+N", "new chat (the current one stays saved)"),
    ("Ctrl+S", "sessions: open, rename, delete, export, / filter"),
    ("Ctrl+T", "select tokens of the last reply (then ←/→, ↑/↓ between replies, Enter back); "
               "or click a reply, then a token"),
    ("Tab or 1-9 (token view)", "the selected token's candidates in the inspector: ↑/↓ (or 1-9) pick one, Enter "
                                "forks the reply there (cut, that token forced, the rest sampled again; the old reply "
                                "stays an alternative), Esc back; or click a candidate, then click it again"),
    ("F2", "settings"),
    ("F3", "toggle the sampler inspector"),
    ("F1", "this help"),
    ("Ctrl+P", "command palette"),
    ("Ctrl+Q", "quit"),
]

INSPECTOR = """**The sampler inspector**

For the token being generated, or the token selected in a finished reply: the top candidates with two bars,
**raw** (the model's distribution at the set temperature) and **final** (after the repetition penalty and the
phrase ban). A candidate struck through in red was **banned** because the reply would have repeated a 3-gram the
assistant already said (shown beside it); **↓** marks a candidate under the repetition penalty; **○** one outside
the top-p nucleus. The chosen token is marked **▸** with its rank in the final distribution. The bottom line
counts, for the turn, the banned candidates, the probability mass the ban removed and the dead-end lifts (steps
where the ban would have removed almost everything, so the bans of earlier turns were lifted; the 3-grams the reply
itself already said stay banned, so a reply never loops). While the inspector is hidden (F3), replies
decode without recording traces, which is faster; their tokens then show no trace.

In a token view, underlined tokens are steps where the ban fired, yellow ones were not the most likely
candidate (rank > 0), magenta ones had the ban lifted, red ones differ from the recorded session (replay).
"""


def help_table(rows, first: str, second: str) -> Table:
    """Two columns that wrap to the screen's width (a command's `|` is text here, not a cell border)."""
    t = Table(box=box.SIMPLE_HEAD, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column(first, style="bold cyan", ratio=2, min_width=14, overflow="fold")
    t.add_column(second, ratio=5, overflow="fold")
    for a, b in rows:
        t.add_row(Text(a), Text(b))
    return t


def help_text() -> str:
    """Every key and command as plain text (tests, and what the screen shows, less the layout)."""
    keys = "\n".join(f"{k}  {v}" for k, v in KEYS)
    cmds = "\n".join(f"{f'{n} {a}'.rstrip()}  {w}" for n, a, w in COMMANDS)
    return f"Keys\n{keys}\n\nCommands\n{cmds}\n\n{INSPECTOR}"


CLOSE = "Esc (F1, q) closes · ↑↓ PgUp PgDn scroll"


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="help"):
            yield Static(f"Keys and commands  [dim]{CLOSE}[/dim]", classes="title")
            with VerticalScroll(id="help-body"):
                yield Static(Text("Keys", style="bold"))
                yield Static(help_table(KEYS, "key", "action"))
                yield Static(Text("Commands", style="bold"))
                yield Static(help_table([(f"{n} {a}".rstrip(), w) for n, a, w in COMMANDS], "command", "action"))
                yield Markdown(INSPECTOR)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
