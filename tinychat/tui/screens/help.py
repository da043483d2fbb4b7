"""The help screen: every key and slash command."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

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

INSPECTOR = """## The sampler inspector

For the token being generated, or the token selected in a finished reply: the top candidates with two bars,
**raw** (the model's distribution at the set temperature) and **final** (after the repetition penalty and the
phrase ban). A candidate struck through in red was **banned** because the reply would have repeated a 3-gram the
assistant already said (shown beside it); **↓** marks a candidate under the repetition penalty; **○** one outside
the top-p nucleus. The chosen token is marked **▸** with its rank in the final distribution. The bottom line
counts, for the turn, the banned candidates, the probability mass the ban removed and the dead-end lifts (steps
where the ban would have removed almost everything, so it was lifted). While the inspector is hidden (F3), replies
decode without recording traces, which is faster; their tokens then show no trace.

In a token view, underlined tokens are steps where the ban fired, yellow ones were not the most likely
candidate (rank > 0), magenta ones had the ban lifted, red ones differ from the recorded session (replay).
"""


def help_markdown() -> str:
    keys = "\n".join(f"| {k} | {v} |" for k, v in KEYS)
    cmds = "\n".join(f"| `{n} {a}`".rstrip() + f" | {w} |" for n, a, w in COMMANDS)
    return (f"# tinychat\n\n## Keys\n\n| key | action |\n|---|---|\n{keys}\n\n"
            f"## Commands\n\n| command | action |\n|---|---|\n{cmds}\n\n{INSPECTOR}")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide", id="help"):
            yield Markdown(help_markdown())

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
