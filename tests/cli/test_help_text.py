"""--help text: a command's docstring is reflowed (cli_common.reflow), so rich wraps whole paragraphs at the terminal's
width instead of each ~110-column source line (ragged text: a full line, then a few words, then a full line)."""
import inspect
import re

import pytest
from typer.testing import CliRunner

from tinychat.cli import app
from tinychat.cli_common import reflow


def test_reflow_joins_a_paragraphs_lines_and_keeps_list_items_and_paragraphs():
    text = """First line.

    A paragraph
    in two lines.
    - an item
    - another
      continued

    Last."""
    assert reflow(text) == "First line.\n\nA paragraph in two lines.\n- an item\n- another\n  continued\n\nLast."
    assert reflow(None) is None and reflow("") == ""


def _commands(typer_app, prefix=()):
    for info in typer_app.registered_commands:
        yield (*prefix, info.name or info.callback.__name__), info
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*prefix, group.name))


def test_no_command_help_keeps_a_source_line_break_inside_a_paragraph():
    found = list(_commands(app))
    assert len(found) >= 10                                  # chat, info, replay, serve, bench, pull, import, ...
    for path, info in found:
        for para in (info.help or inspect.getdoc(info.callback) or "").split("\n\n"):
            assert not re.search(r"\n[^\s\-*\u2022]", para), (path, para)


@pytest.mark.parametrize("args", [["import", "--help"], ["pull", "--help"], ["replay", "--help"]])
def test_help_paragraphs_fill_the_terminal_width(args):
    out = CliRunner().invoke(app, args, env={"COLUMNS": "80", "NO_COLOR": "1"}, terminal_width=80).output
    desc = out.split("Usage:", 1)[1].split("╭", 1)[0]        # the text between the usage line and the first panel
    paras = [[ln.strip() for ln in p.splitlines() if ln.strip()] for p in re.split(r"\n\s*\n", desc)]
    paras = [p for p in paras if p and not p[0].startswith("tinychat ")]
    assert paras
    for p in paras:
        for ln in p[:-1]:                                    # every line but a paragraph's last is nearly full
            assert len(ln) >= 60, (args, p)
