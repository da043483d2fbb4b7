"""The one slash-command table (tinychat/commands.py): parsing, aliases, and README's lists of it."""
import re
from pathlib import Path

import pytest

from tinychat import commands as C

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_exactly_the_plain_modes_commands_and_aliases():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"Slash commands: `([^`]*)`\n\s*\(([^)]*)\)", text)
    assert m, "README's slash command line is missing"
    assert m.group(1).split(" /") == " ".join(c.usage for c in C.commands_for("plain")).split(" /")
    aliases = {}
    for part in m.group(2).split(";"):
        names, target = part.rsplit(":", 1)
        for n in re.findall(r"`(/[a-z]+)`", names):
            aliases[n] = target.strip(" `")
    assert aliases == C.ALIASES


def test_readme_lists_exactly_the_apps_extra_commands():
    text = " ".join(README.read_text(encoding="utf-8").split())
    m = re.search(r"Slash commands are the plain mode's \(.*?\) plus ((?:`/[a-z]+`(?:, )?)+)", text)
    assert m, "README's app command sentence is missing"
    listed = re.findall(r"`(/[a-z]+)`", m.group(1))
    assert listed == [c.name for c in C.COMMANDS if c.app and not c.plain]


def test_parse_resolves_aliases_and_quoting():
    assert C.parse("/RESET") == ("/new", [])
    assert C.parse('/set system "be brief"') == ("/set", ["system", "be brief"])
    assert C.parse('/save "unbalanced') == ("/save", ['"unbalanced'])
    assert C.parse("   ") == ("", [])
    assert all(C.lookup(target, "plain") and C.lookup(target, "app") for target in C.ALIASES.values())


def test_set_and_trace_arguments():
    assert C.parse_set([]) is None
    assert C.parse_set(["system", "be", "brief"]) == ("system", "be brief")
    with pytest.raises(C.CommandError, match="usage: /set KEY VALUE"):
        C.parse_set(["top-p"])
    assert C.parse_trace(["on"]) is True and C.parse_trace(["off"]) is False
    with pytest.raises(C.CommandError, match="usage: /trace"):
        C.parse_trace(["maybe"])


def test_fork_arguments_are_a_position_and_a_token():
    assert C.parse_fork(["3", "42"]) == (3, "42")
    assert C.parse("/fork 0 ' cat'")[1] == ["0", " cat"] and C.parse_fork(["0", " cat"]) == (0, " cat")
    for bad in ([], ["3"], ["-1", "5"], ["x", "5"], ["3", ""], ["1", "2", "3"]):
        with pytest.raises(C.CommandError, match="usage: /fork POSITION TOKEN"):
            C.parse_fork(bad)


def test_app_only_commands_are_unknown_in_the_plain_mode():
    assert C.lookup("/copy", "app").name == "/copy"
    with pytest.raises(C.CommandError, match="unknown command /copy"):
        C.lookup("/copy", "plain")
    help_ = C.plain_help()
    assert all(c.usage in help_ for c in C.commands_for("plain")) and "/copy" not in help_


def test_the_command_table_imports_neither_torch_nor_textual():
    import subprocess
    import sys
    code = "import sys, tinychat.commands; print('torch' in sys.modules, 'textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_command_has_a_handler_in_each_mode_it_runs_in():
    from tinychat.plain import PLAIN_HANDLERS
    from tinychat.tui.commands import APP_HANDLERS
    assert PLAIN_HANDLERS.names() == {c.name for c in C.commands_for("plain")}
    assert APP_HANDLERS.names() == {c.name for c in C.commands_for("app")}
    assert all(c.name in PLAIN_HANDLERS.names() or c.name in APP_HANDLERS.names() for c in C.COMMANDS)


def test_a_handler_registers_only_for_a_command_of_its_mode():
    handlers = C.Handlers("plain")
    with pytest.raises(ValueError, match="/copy is not a command of the plain mode"):
        handlers("/copy")
    with pytest.raises(ValueError, match="/nope"):
        handlers("/nope")

    @handlers("/info")
    def info(args):
        return args
    assert handlers.find("/info") is info and handlers.names() == {"/info"}
    with pytest.raises(C.CommandError, match="unknown command /copy"):
        handlers.find("/copy")
