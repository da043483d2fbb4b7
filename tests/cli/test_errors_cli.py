"""One base for the expected failures (tinychat/errors.py): the CLI prints a TinychatError in one line and exits 2,
and anything else as an internal error (exit 70), so a bug never looks like a user mistake."""
import importlib
import inspect
import pkgutil

import pytest

import tinychat
from tinychat import cli
from tinychat.errors import EXIT_INTERNAL, EXIT_USER, TinychatError
from tinychat.settings import ChatError

# exceptions that steer control flow inside tinychat and never reach the user as an error
CONTROL_FLOW = {"Cancelled", "StopPlayback", "Interrupted"}
NEEDS_EXTRAS = ("tinychat.training", "tinychat.serve")   # modules whose optional dependencies may be missing


def _tinychat_exceptions():
    found = {}
    for mod in pkgutil.walk_packages(tinychat.__path__, "tinychat."):
        if mod.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(mod.name)
        except ImportError:
            if mod.name.startswith(NEEDS_EXTRAS):
                continue
            raise
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_error_class_of_the_package_has_the_one_base():
    found = _tinychat_exceptions()
    assert len(found) >= 17        # the issue counted 17 error classes
    stray = [name for name, cls in found.items()
             if name.rsplit(".", 1)[1] not in CONTROL_FLOW and not issubclass(cls, TinychatError)]
    assert stray == []


def test_the_errors_keep_their_older_bases():
    from tinychat.sessions.lock import LockHeld
    from tinychat.sessions.session import SessionError
    assert issubclass(ChatError, ValueError) and issubclass(SessionError, ValueError)
    assert issubclass(LockHeld, OSError)


def _run_main(monkeypatch, capsys, error: BaseException, *args: str):
    def boom(**kw):
        raise error
    monkeypatch.setattr(cli, "app", boom)
    monkeypatch.setattr("sys.argv", ["tinychat", *args])
    monkeypatch.setenv("TINYCHAT_DEBUG", "")
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    return exit_.value.code, capsys.readouterr().err


def test_a_user_error_is_one_line_and_exit_2(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, ChatError("temperature must be >= 0\nsecond line"))
    assert code == EXIT_USER == 2
    assert err == "tinychat: error: temperature must be >= 0\n"


def test_an_os_error_names_its_file_in_one_line(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, PermissionError(13, "Permission denied", "/x/y.json"))
    assert code == 2 and err.count("\n") == 1 and "/x/y.json" in err and "internal" not in err


def test_a_bug_says_internal_error_and_exits_70(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, KeyError("layers.3.attn"))
    assert code == EXIT_INTERNAL == 70
    assert err.startswith("tinychat: internal error: KeyError:") and "--debug" in err and err.count("\n") == 1


def test_a_bad_command_is_the_users_mistake(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["tinychat", "no-such-command"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2 and "internal" not in capsys.readouterr().err


def test_debug_shows_the_traceback_of_a_bug(monkeypatch, capsys):
    def boom(**kw):
        raise ZeroDivisionError("here")
    monkeypatch.setattr(cli, "app", boom)
    monkeypatch.setenv("TINYCHAT_DEBUG", "")       # main() sets it: monkeypatch puts the unset state back
    monkeypatch.setattr("sys.argv", ["tinychat", "--debug"])
    with pytest.raises(ZeroDivisionError, match="here"):
        cli.main()


@pytest.mark.parametrize("args, flag", [(["--max-new", "²", "-p", "hi"], "--max-new"),
                                        (["--temperature", "٠.٥", "-p", "hi"], "--temperature"),
                                        (["bench", "--threads", "５"], "--threads")])
def test_a_flag_given_a_number_not_in_ascii_digits_is_one_line_naming_the_flag(monkeypatch, capsys, args, flag):
    """Issue #33 item 7 for flags: refused (exit 2) in one line that says which flag, not only 'Input should be a
    valid integer'."""
    monkeypatch.setattr("sys.argv", ["tinychat", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("tinychat: error: ") and flag in err, err


def test_every_number_flag_takes_ascii_digits_only():
    """strict_numbers covers every int / float option and argument, the chat's own and each command's: a new flag
    cannot slip back to Python's int() / float(), which take any script's digits."""
    import inspect
    import typing

    from typer.models import ArgumentInfo, OptionInfo

    from tinychat.cli_common import _number_kind

    def callbacks(a):
        if a.registered_callback is not None and a.registered_callback.callback is not None:
            yield a.registered_callback.callback
        yield from (i.callback for i in a.registered_commands)
        for g in a.registered_groups:
            yield from callbacks(g.typer_instance)
    seen = 0
    for fn in callbacks(cli.app):
        hints = typing.get_type_hints(fn)
        for name, p in inspect.signature(fn).parameters.items():
            if isinstance(p.default, (OptionInfo, ArgumentInfo)) and _number_kind(hints.get(name)) is not None:
                seen += 1
                assert p.default.parser is not None and p.default.parser("7") == 7, (fn.__name__, name)
                with pytest.raises(Exception, match="ASCII digits"):
                    p.default.parser("\uff17")                        # a fullwidth 7
    assert seen >= 15
