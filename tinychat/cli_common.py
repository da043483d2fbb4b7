"""What the `tinychat` command's modules share: the usage error, the --model option's callback and help, and the
progress line of long commands. Torch-free; the commands import what they run inside their functions."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from .choices import QUANT_CHOICES
from .errors import TinychatError
from .loading import model_path


class UsageError(TinychatError):
    """A bad flag or argument: one line on stderr, exit 2."""


_QUANTS = "|".join(QUANT_CHOICES)
MODEL_HELP = ("Model folder, the name of an imported model, or the Hugging Face repo it was pulled from "
              "(default: the shipped model).")


def _model_arg(value: Optional[Path]) -> Optional[Path]:
    """--model: a folder, or the name of a model imported with `tinychat import` (an existing path wins)."""
    return model_path(value)


def _debug() -> bool:
    return bool(os.environ.get("TINYCHAT_DEBUG"))


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def _progress(title: str):
    """A long command's progress: a transient line on stderr (spinner, what runs now, a bar where the total is known,
    the time so far) while stderr is a terminal; None otherwise (pipes and logs get the results only). Yields
    update(done, total, what) and, as the second item, echo(line) for stdout lines printed meanwhile (above the bar
    when stdout is the same terminal)."""
    if not _stderr_is_terminal():
        yield None, typer.echo
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .textsafe import safe_line
    title = escape(safe_line(title))        # a file name: no escape sequence, no markup reaches the terminal
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, redirect_stdout=False,
                  redirect_stderr=False) as bar:
        task = bar.add_task(title, total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total or None, description=f"{title}: {escape(safe_line(what))}")

        def echo(line: str) -> None:
            if sys.stdout.isatty():
                bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                typer.echo(line)
        yield update, echo


def load_session_noting(ref):
    """sessions.session.load(ref), with its one-line notice (a save that did not finish, dropped) on stderr."""
    from .sessions import session as session_files
    from .textsafe import safe_line
    sess = session_files.load(ref)
    if getattr(sess, "notice", None):
        typer.echo(safe_line(f"note: {sess.notice}"), err=True)
    return sess


def reflow(text: str | None) -> str | None:
    """A docstring as --help shows it: the lines of each paragraph joined (Typer's rich mode keeps a docstring's line
    breaks, and rich then wraps each ~110-column source line at the terminal's width: ragged text), lines that start
    a list item ("- ", "* ", indented) kept on their own."""
    if not text:
        return text
    import inspect
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for ln in para.split("\n"):
            if lines and ln and not ln[0].isspace() and not ln.startswith(("- ", "* ", "\u2022 ")):
                lines[-1] += " " + ln
            else:
                lines.append(ln)
        out.append("\n".join(lines))
    return "\n\n".join(out)


def reflow_help(app) -> None:
    """Every command's help in `app` (and its sub-apps) reflowed (reflow): set once, before the app runs."""
    for info in app.registered_commands:
        info.help = reflow(info.help or (info.callback.__doc__ if info.callback else None))
    for group in app.registered_groups:
        reflow_help(group.typer_instance)


def _ascii_number(kind):
    """A flag's parser for int / float values: ASCII only. Python's int() and float() take any script's digits
    ("٠.٥", "５"), so `--temperature ٠.٥` would run at 0.5; such a value is refused, naming its flag (issue #33)."""
    what = "an integer" if kind is int else "a number"

    def parse(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return kind(value)                          # a default
        text = str(value)
        try:
            if not text.isascii():
                raise ValueError
            return kind(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not {what} (ASCII digits)") from None
    parse.__name__ = kind.__name__
    return parse


def _number_kind(annotation):
    """int or float where a parameter's annotation is one (or Optional of one), else None."""
    import typing
    if annotation in (int, float):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if typing.get_origin(annotation) is typing.Union and len(args) == 1 and args[0] in (int, float) \
        else None


def strict_numbers(app) -> None:
    """Every int / float option and argument of `app`'s commands (and its sub-apps') parsed by _ascii_number, unless
    it names its own parser: set once, before the app runs."""
    import inspect
    import typing

    from typer.models import ArgumentInfo, OptionInfo
    infos = [i.callback for i in app.registered_commands if i.callback is not None]
    if app.registered_callback is not None and app.registered_callback.callback is not None:
        infos.append(app.registered_callback.callback)      # the chat itself: `tinychat [OPTIONS]`
    for fn in infos:
        hints = typing.get_type_hints(fn)
        for name, p in inspect.signature(fn).parameters.items():
            d = p.default
            kind = _number_kind(hints.get(name))
            if kind is not None and isinstance(d, (OptionInfo, ArgumentInfo)) and getattr(d, "parser", None) is None \
                    and getattr(d, "click_type", None) is None:
                d.parser = _ascii_number(kind)
    for group in app.registered_groups:
        strict_numbers(group.typer_instance)

