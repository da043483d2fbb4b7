"""The slash commands, one table for the plain mode (plain.py) and the app (tui/commands.py): names, arguments,
help, aliases, and the parsing of a command line and of /set. No torch, no Textual.

Each command says where it runs: `plain` (the line mode) and `app`; the app has a few more (screens, clipboard).
Where a command does something mode-specific, `plain_help` is the plain mode's help text. Each mode keeps its
handlers in a `Handlers` registry keyed by the table's names (plain.PLAIN_HANDLERS, tui.commands.APP_HANDLERS): a
command runs by lookup, a handler registers only for a command of the table in its mode, and a test checks that
every command has one in each mode it runs in."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from .numbers import is_count
from .errors import TinychatError


@dataclass(frozen=True)
class Command:
    name: str                       # "/set"
    args: str                       # "KEY VALUE" (shown in help and hints)
    help: str                       # what it does (the app's help screen and hint line)
    plain: bool = True              # available in the plain mode
    app: bool = True                # available in the app
    plain_help: str | None = None   # the plain mode's help text, where it differs

    @property
    def usage(self) -> str:
        return f"{self.name} {self.args}".rstrip()


COMMANDS: tuple[Command, ...] = (
    Command("/help", "", "keys and commands", plain_help="this help"),
    Command("/new", "", "start a new chat (the current one stays saved); /reset too"),
    Command("/save", "TITLE", "save the chat under a title"),
    Command("/load", "ID", "continue a saved session"),
    Command("/sessions", "", "open the sessions screen", plain=False),
    Command("/set", "KEY VALUE", "change a setting from the next turn; /set alone opens the settings screen",
            plain_help="change a setting from the next turn (temperature, top-p, penalty, penalty-window, ban, "
                       "no-parrot, ban-reply, max-new, seed, system); /set alone lists them"),
    Command("/settings", "", "open the settings screen", plain=False),
    Command("/regen", "", "sample the last reply again (the old one stays an alternative: /alt)"),
    Command("/alt", "next|prev|N", "show another alternative of the last reply (regenerate keeps them)"),
    Command("/ab", "KEY=VALUE ...", "decode the last turn twice with one seed, the current settings against KEY=VALUE, "
                                    "side by side, with the first token where they differ and why; either can be kept",
            plain_help="decode the last turn twice with one seed, the current settings (A) against KEY=VALUE (B): "
                       "both replies, the first token where they differ and why; A stays active, /alt keeps B"),
    Command("/fork", "POSITION TOKEN", "fork the last reply at its token POSITION (0-based, as the trace numbers "
                                       "them): TOKEN (a token id, or the text of one token, quoted: \" cat\") is "
                                       "forced there and the rest sampled again (the old reply stays an alternative)"),
    Command("/edit", "[N|rN]", "edit your Nth message (default: the last; rN: the Nth reply, r: the last): it opens "
                               "in the input, and sending it starts a new branch from there (an edited reply is kept "
                               "as written and you type on; /edit off: send normally again)", plain=False),
    Command("/undo", "", "take back the last turn (its text returns to the input)",
            plain_help="take back the last turn"),
    Command("/copy", "", "copy the last reply to the clipboard", plain=False),
    Command("/trace", "on|off", "show or hide the sampler inspector",
            plain_help="print how each token was chosen (to stderr)"),
    Command("/inspector", "", "toggle the sampler inspector", plain=False),
    Command("/info", "", "model, mode, cache fill, session"),
    Command("/quit", "", "leave (Ctrl+Q too)", plain_help="leave (Ctrl-D too); Ctrl-C stops a reply mid-turn"),
)

ALIASES = {"/exit": "/quit", "/q": "/quit", "/reset": "/new", "/clear": "/new", "/regenerate": "/regen"}


class CommandError(TinychatError, ValueError):
    """A command line that cannot run: unknown command, wrong arguments. One line, fit for the user."""


def commands_for(mode: str) -> tuple[Command, ...]:
    """The commands of "plain" or "app", in table order."""
    return tuple(c for c in COMMANDS if getattr(c, mode))


def parse(line: str) -> tuple[str, list[str]]:
    """'/set top-p 0.8' -> ('/set', ['top-p', '0.8']): the command's canonical name (aliases resolved, lower case)
    and its arguments (shell-like quoting; unbalanced quotes split on spaces). ('', []) for an empty line."""
    try:
        parts = shlex.split(line)
    except ValueError:
        parts = line.split()
    if not parts:
        return "", []
    cmd = parts[0].lower()
    return ALIASES.get(cmd, cmd), parts[1:]


def lookup(name: str, mode: str) -> Command:
    """The command `name` (canonical) of `mode`; CommandError when there is none."""
    for c in commands_for(mode):
        if c.name == name:
            return c
    raise CommandError(f"unknown command {name} (/help lists them)")


class Handlers:
    """One mode's command handlers by the table's names. `@handlers("/new")` registers a function for /new (a
    command of the table in this mode, else ValueError at import); `handlers.find(name)` is the handler of the
    command `name` (canonical), CommandError "unknown command" when the mode has none."""

    def __init__(self, mode: str):
        self.mode = mode
        self._by_name: dict[str, Callable] = {}

    def __call__(self, name: str) -> Callable[[Callable], Callable]:
        if name not in {c.name for c in commands_for(self.mode)}:
            raise ValueError(f"{name} is not a command of the {self.mode} mode in tinychat/commands.py")

        def register(fn: Callable) -> Callable:
            self._by_name[name] = fn
            return fn
        return register

    def find(self, name: str) -> Callable:
        lookup(name, self.mode)
        return self._by_name[name]

    def names(self) -> set[str]:
        return set(self._by_name)


def parse_set(args: list[str]) -> tuple[str, str] | None:
    """/set's arguments -> (key, value), the value being the rest of the line; None for a bare /set (list / open
    the settings). CommandError for a key without a value."""
    if not args:
        return None
    if len(args) < 2:
        raise CommandError("usage: /set KEY VALUE")
    return args[0], " ".join(args[1:])


def parse_trace(args: list[str]) -> bool:
    """/trace's argument: on -> True, off -> False; else CommandError."""
    if args not in (["on"], ["off"]):
        raise CommandError("usage: /trace on|off")
    return args[0] == "on"


def parse_alt(args: list[str]) -> str:
    """/alt's argument: next, prev or a 1-based number; else CommandError."""
    if len(args) != 1 or not (args[0] in ("next", "prev") or is_count(args[0])):
        raise CommandError("usage: /alt next|prev|N")
    return args[0]


def parse_ab(args: list[str]) -> dict[str, str]:
    """/ab's arguments -> {key: value} in the order given ('top-p=0.5' -> {'top-p': '0.5'}); CommandError when there
    are none or one is not KEY=VALUE."""
    out: dict[str, str] = {}
    for a in args:
        key, eq, value = a.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CommandError(f"usage: /ab KEY=VALUE [...] (not KEY=VALUE: {a!r})")
        out[key.strip()] = value.strip()
    if not out:
        raise CommandError("usage: /ab KEY=VALUE [...] (e.g. /ab top-p=0.5 penalty=1.5)")
    return out


def parse_fork(args: list[str]) -> tuple[int, str]:
    """/fork's arguments: a 0-based token position and a token (digits: an id; else the text of one token, which the
    chat resolves); else CommandError."""
    if len(args) != 2 or not is_count(args[0]) or not args[1]:
        raise CommandError('usage: /fork POSITION TOKEN (TOKEN: an id, or the text of one token: " cat")')
    return int(args[0]), args[1]


def plain_help() -> str:
    """The plain mode's /help text."""
    rows = [(c.usage, c.plain_help or c.help) for c in commands_for("plain")]
    width = max(len(u) for u, _ in rows) + 2
    return "commands:\n" + "\n".join(f"  {u:<{width}}{h}" for u, h in rows)
