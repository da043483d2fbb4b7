"""Issue #33 item 7: numbers typed by a user are read one way everywhere (tinychat/numbers.py: ASCII digits only).
"²".isdigit() is true but int("²") raises; int("١٢") is 12. Every slash command that takes a number, in the plain
mode, either runs or answers with one error line, and the lines after it still run."""
import io

import pytest
from support import make_chat

from tinychat import commands as C
from tinychat import numbers as N
from tinychat.plain import PlainREPL
from tinychat.settings import ChatError, ChatSettings

ODD = ["²", "١٢", "٣", "５", "1_0", "+1", "-1", " 2", "0x10", "1e3", "nan", "inf", "-inf", "1.5", "9" * 60,
       "99999999999999999999", "", "½", "Ⅻ", "𝟙", "0", "00", "3"]


def test_only_ascii_digits_read_as_numbers():
    assert "²".isdigit() and not N.is_count("²")
    assert N.is_count("12") and not N.is_count("١٢") and not N.is_count("+1") and not N.is_count("1_0")
    assert N.parse_int(" 42 ") == 42 and N.parse_int("-3") == -3
    assert N.parse_float("0.5") == 0.5 and N.parse_float("1e-2") == 0.01 and N.parse_float(".5") == 0.5
    for bad in ("²", "١٢", "1_000", "0x10", "nan", "inf", "", "five", "9" * 60):
        with pytest.raises(ValueError):
            N.parse_int(bad)
    for bad in ("²", "٠.٥", "nan", "inf", "-inf", "1e999", "1_0.5", ""):
        with pytest.raises(ValueError):
            N.parse_float(bad)
    with pytest.raises(ValueError, match="between 1 and 5"):
        N.parse_int("9", "n", 1, 5)


@pytest.mark.parametrize("text", ["²", "١٢", "５", "1_0"])
def test_alt_and_fork_refuse_non_ascii_digits_as_usage_errors(text):
    with pytest.raises(C.CommandError, match="usage: /alt"):
        C.parse_alt([text])
    with pytest.raises(C.CommandError, match="usage: /fork"):
        C.parse_fork([text, "5"])


@pytest.mark.parametrize("key", ["temperature", "top-p", "penalty", "penalty-window", "max-new", "seed"])
@pytest.mark.parametrize("value", ["²", "١٢", "٠.٥", "1_0", "nan", "inf"])
def test_set_reads_no_number_but_ascii_ones(key, value):
    with pytest.raises(ChatError) as e:
        ChatSettings().with_value(key, value)
    assert "\n" not in str(e.value)


def test_a_chat_switching_or_forking_by_a_non_ascii_number_is_a_chat_error():
    chat = make_chat(max_new=4, seed=1, autosave=False)
    chat.send("hello there")
    chat.regenerate()
    for which in ("²", "١"):
        with pytest.raises(ChatError):
            chat.switch_alternative(which)
    with pytest.raises(ChatError):       # "²" is not an id: it is text, and here not one token
        chat.check_fork(0, "²²²")


def _run(chat, lines):
    out, err = io.StringIO(), io.StringIO()
    repl = PlainREPL(chat, stdin=io.StringIO("".join(f"{x}\n" for x in lines)), stdout=out, stderr=err)
    repl.interactive = False
    rc = repl.run()
    return rc, out.getvalue(), err.getvalue()


def test_numbers_in_every_plain_command_run_or_give_one_error_line_and_the_next_lines_still_run():
    """The fuzz of issue #33 ("numbers in every command"): every command that takes a number, with odd numbers."""
    chat = make_chat(max_new=4, seed=1, autosave=False)
    chat.send("hello there")
    chat.regenerate()
    lines = []
    for v in ODD:
        lines += [f"/alt {v}", f"/fork {v} 5", f"/fork 0 {v}", f"/trace {v}", f"/load {v}"]
        lines += [f"/set {k} {v}" for k in ("temperature", "top-p", "penalty", "penalty-window", "max-new", "seed")]
        lines += [f"/ab {k}={v}" for k in ("temperature", "top-p", "penalty", "max-new")]
    lines.append("/set seed 5")
    rc, out, err = _run(chat, lines)
    assert "Traceback" not in err
    assert "seed = 5" in err.splitlines()[-1]              # the last line ran: nothing stopped the run
    assert all(line.startswith(("error: ", "reply ", "seed", "temperature", "top-p", "penalty", "max-new", "trace",
                                "A/B", "A is", "continuing", "note:", "[", "  ")) for line in err.splitlines()), err
