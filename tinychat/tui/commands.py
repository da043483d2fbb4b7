"""Slash commands of the app: the table in tinychat/commands.py (shared with the plain mode), each command's handler
here (APP_HANDLERS, keyed by the table's names: `run` dispatches by lookup) on the app's screens, actions and
controller; the hint line and Tab completion. A handler takes (app, args); CommandError from it is one error line."""
from __future__ import annotations


from ..commands import (ALIASES, CommandError, Handlers, commands_for, parse, parse_alt, parse_fork, parse_set,
                        parse_trace)

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


async def run(app, line: str) -> None:
    """Run one slash command line in the app."""
    cmd, args = parse(line)
    try:
        await APP_HANDLERS.find(cmd)(app, args)
    except CommandError as e:
        app.notify(str(e), severity="error")


APP_HANDLERS = Handlers("app")


@APP_HANDLERS("/quit")
async def _quit(app, args: list[str]) -> None:
    await app.action_quit()


@APP_HANDLERS("/help")
async def _help(app, args: list[str]) -> None:
    app.action_help()


@APP_HANDLERS("/new")
async def _new(app, args: list[str]) -> None:
    app.action_new_chat()


@APP_HANDLERS("/sessions")
async def _sessions(app, args: list[str]) -> None:
    app.action_sessions()


@APP_HANDLERS("/load")
async def _load(app, args: list[str]) -> None:
    if len(args) != 1:
        raise CommandError("usage: /load ID")
    app.open_session(args[0])


@APP_HANDLERS("/save")
async def _save(app, args: list[str]) -> None:
    app.controller.save(" ".join(args) or None)


@APP_HANDLERS("/set")
async def _set(app, args: list[str]) -> None:
    kv = parse_set(args)
    if kv is None:
        app.action_settings()
    elif app.chat is None:
        app.notify("the model is still loading", severity="warning")
    else:
        app.controller.apply_settings(dict([kv]))


@APP_HANDLERS("/settings")
async def _settings(app, args: list[str]) -> None:
    app.action_settings()


@APP_HANDLERS("/regen")
async def _regen(app, args: list[str]) -> None:
    await app.action_regenerate()


@APP_HANDLERS("/alt")
async def _alt(app, args: list[str]) -> None:
    app.switch_alt(parse_alt(args))


@APP_HANDLERS("/ab")
async def _ab(app, args: list[str]) -> None:
    app.ab.start(args)


@APP_HANDLERS("/fork")
async def _fork(app, args: list[str]) -> None:
    position, token = parse_fork(args)
    await app.forking.command(position, token)


@APP_HANDLERS("/edit")
async def _edit(app, args: list[str]) -> None:
    app.turns.start_edit(args)


@APP_HANDLERS("/undo")
async def _undo(app, args: list[str]) -> None:
    app.action_undo()


@APP_HANDLERS("/copy")
async def _copy(app, args: list[str]) -> None:
    app.action_copy_reply()


@APP_HANDLERS("/trace")
async def _trace(app, args: list[str]) -> None:
    app.inspector.display = parse_trace(args)
    app.inspector_pref = app.inspector.display


@APP_HANDLERS("/inspector")
async def _inspector(app, args: list[str]) -> None:
    app.action_toggle_inspector()


@APP_HANDLERS("/info")
async def _info(app, args: list[str]) -> None:
    if app.chat is None:
        app.notify(app.controller.load_error or "the model is still loading")
    elif app.busy:
        app.notify("busy: /info after the reply")
    else:
        st = app.chat.status()
        app.notify("\n".join(f"{k}: {v}" for k, v in st.items()), title="info", timeout=10)


def palette(app):
    """The app's entries in the command palette (Ctrl+P), after Textual's own."""
    from textual.app import SystemCommand
    for name, help_, fn in [("New chat", "start a new chat", app.action_new_chat),
                            ("Sessions", "open, rename, delete, export saved chats", app.action_sessions),
                            ("Settings", "sampler and turn settings", app.action_settings),
                            ("Toggle inspector", "show or hide the sampler inspector", app.action_toggle_inspector),
                            ("Copy last reply", "to the clipboard", app.action_copy_reply),
                            ("Keys and commands", "the help screen", app.action_help)]:
        yield SystemCommand(name, help_, fn)
