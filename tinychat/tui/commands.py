"""Slash commands of the app: the plain mode's set (tinychat/plain.py), plus the app's screens and actions."""
from __future__ import annotations

import shlex

# name, arguments, what it does (shown in the hint line and the help screen)
COMMANDS: list[tuple[str, str, str]] = [
    ("/help", "", "keys and commands"),
    ("/new", "", "start a new chat (the current one stays saved); /reset too"),
    ("/save", "TITLE", "save the chat under a title"),
    ("/load", "ID", "continue a saved session"),
    ("/sessions", "", "open the sessions screen"),
    ("/set", "KEY VALUE", "change a setting from the next turn; /set alone opens the settings screen"),
    ("/settings", "", "open the settings screen"),
    ("/regen", "", "sample the last reply again"),
    ("/undo", "", "take back the last turn (its text returns to the input)"),
    ("/copy", "", "copy the last reply to the clipboard"),
    ("/trace", "on|off", "show or hide the sampler inspector"),
    ("/inspector", "", "toggle the sampler inspector"),
    ("/info", "", "model, mode, cache fill, session"),
    ("/quit", "", "leave (Ctrl+Q too)"),
]

ALIASES = {"/exit": "/quit", "/q": "/quit", "/reset": "/new", "/clear": "/new", "/regenerate": "/regen"}

NAMES = [c[0] for c in COMMANDS]


def parse(line: str) -> tuple[str, list[str]]:
    """'/set top-p 0.8' -> ('/set', ['top-p', '0.8']) (shell-like quoting; unbalanced quotes split on spaces)."""
    try:
        parts = shlex.split(line)
    except ValueError:
        parts = line.split()
    if not parts:
        return "", []
    cmd = parts[0].lower()
    return ALIASES.get(cmd, cmd), parts[1:]


def matching(prefix: str) -> list[tuple[str, str, str]]:
    """Commands whose name starts with the typed word (all of them for '/')."""
    word = prefix.split(" ", 1)[0].lower()
    if " " in prefix:
        return [c for c in COMMANDS if c[0] == ALIASES.get(word, word)] or \
               [c for c in COMMANDS if c[0] == word]
    return [c for c in COMMANDS if c[0].startswith(word)]


def complete(prefix: str) -> str | None:
    """Tab completion of the command word: the longest common prefix of the matches (with a space when unique)."""
    if not prefix.startswith("/") or " " in prefix or "\n" in prefix:
        return None
    names = [c[0] for c in matching(prefix)]
    if not names:
        return None
    if len(names) == 1:
        return names[0] + " "
    common = names[0]
    for n in names[1:]:
        while not n.startswith(common):
            common = common[:-1]
    return common if len(common) > len(prefix) else None


def hint(text: str) -> str:
    """The hint line under the input."""
    if text.startswith("/") and "\n" not in text:
        found = matching(text)
        if not found:
            return f"unknown command {text.split(' ', 1)[0]} · /help lists them"
        if len(found) == 1:
            name, args, what = found[0]
            return f"{name} {args}".rstrip() + f" — {what}"
        return "  ".join(f"{n} {a}".rstrip() for n, a, _ in found) + "   (Tab completes)"
    return "Enter send · Ctrl+J newline · ↑↓ history · / commands · F1 help"
