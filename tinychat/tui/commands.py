"""Slash commands of the app: the table in tinychat/commands.py (shared with the plain mode), run here on the app's
screens and actions; the hint line and Tab completion."""
from __future__ import annotations

from textual.app import SystemCommand

from ..commands import ALIASES, CommandError, commands_for, parse, parse_alt, parse_fork, parse_set, parse_trace
from .state import Busy

# the app's commands as (name, arguments, what it does): shown in the hint line and the help screen
COMMANDS: list[tuple[str, str, str]] = [(c.name, c.args, c.help) for c in commands_for("app")]


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


class CommandsMixin:
    """The TinyChatApp part that runs slash commands and fills the command palette."""

    async def run_command(self, line: str) -> None:
        cmd, args = parse(line)
        if cmd == "/quit":
            await self.action_quit()
        elif cmd == "/help":
            self.action_help()
        elif cmd == "/new":
            self.action_new_chat()
        elif cmd == "/sessions":
            self.action_sessions()
        elif cmd == "/load":
            if len(args) != 1:
                self.notify("usage: /load ID", severity="error")
            else:
                self.open_session(args[0])
        elif cmd == "/save":
            if self._can_run("save"):
                self._set_busy(Busy.SAVE)
                self._job_save(self.chat, " ".join(args) or None)
        elif cmd in ("/set", "/settings"):
            try:
                kv = parse_set(args) if cmd == "/set" else None
            except CommandError as e:
                self.notify(str(e), severity="error")
                return
            if kv is None:
                self.action_settings()
            elif self.chat is None:
                self.notify("the model is still loading", severity="warning")
            else:
                await self.apply_settings(dict([kv]))
        elif cmd == "/regen":
            await self.action_regenerate()
        elif cmd == "/alt":
            try:
                which = parse_alt(args)
            except CommandError as e:
                self.notify(str(e), severity="error")
                return
            self.switch_alt(which)
        elif cmd == "/ab":
            self.start_ab(args)
        elif cmd == "/fork":
            try:
                position, token = parse_fork(args)
            except CommandError as e:
                self.notify(str(e), severity="error")
                return
            await self.fork_command(position, token)
        elif cmd == "/edit":
            self.start_edit(args)
        elif cmd == "/undo":
            self.action_undo()
        elif cmd == "/copy":
            self.action_copy_reply()
        elif cmd == "/inspector":
            self.action_toggle_inspector()
        elif cmd == "/trace":
            try:
                self.inspector.display = parse_trace(args)
            except CommandError as e:
                self.notify(str(e), severity="error")
                return
            self.inspector_pref = self.inspector.display
        elif cmd == "/info":
            if self.chat is None:
                self.notify(self.load_error or "the model is still loading")
            elif self.busy:
                self.notify("busy: /info after the reply")
            else:
                st = self.chat.status()
                self.notify("\n".join(f"{k}: {v}" for k, v in st.items()), title="info", timeout=10)
        else:
            self.notify(f"unknown command {cmd} (/help lists them)", severity="error")

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for name, help_, fn in [("New chat", "start a new chat", self.action_new_chat),
                                ("Sessions", "open, rename, delete, export saved chats", self.action_sessions),
                                ("Settings", "sampler and turn settings", self.action_settings),
                                ("Toggle inspector", "show or hide the sampler inspector",
                                 self.action_toggle_inspector),
                                ("Copy last reply", "to the clipboard", self.action_copy_reply),
                                ("Keys and commands", "the help screen", self.action_help)]:
            yield SystemCommand(name, help_, fn)
