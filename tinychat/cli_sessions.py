"""`tinychat sessions`: list, show, export, rename, copy and rm saved chats. No torch: listing sessions is instant."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .cli_common import UsageError, load_session_noting
from .loading import check_choice


sessions_app = typer.Typer(help="Saved chats: list (also plain `tinychat sessions`), show, export, rename, copy, rm.",
                           invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})

_JSON_OPT = typer.Option(False, "--json", help="A JSON list.")
_GREP_OPT = typer.Option(None, "--grep", metavar="TEXT",
                         help="Only sessions whose title or any message (every branch) contains TEXT "
                              "(case-insensitive).")


@sessions_app.callback(invoke_without_command=True)
def sessions_default(ctx: typer.Context, json_out: bool = _JSON_OPT, grep: Optional[str] = _GREP_OPT):
    """List saved sessions, newest first."""
    if ctx.invoked_subcommand is None:
        _list_sessions(json_out, grep)


@sessions_app.command("list")
def sessions_list(json_out: bool = _JSON_OPT, grep: Optional[str] = _GREP_OPT):
    """List saved sessions, newest first (what plain `tinychat sessions` prints)."""
    _list_sessions(json_out, grep)


def _list_sessions(json_out: bool, grep: Optional[str]) -> None:
    import json
    import time

    from .sessions import session as session_files
    errors: list = []
    infos = session_files.list_sessions(errors=errors)
    if grep is not None:
        if not grep.strip():
            raise UsageError("--grep needs some text")
        infos = [i for i in infos if session_files.matches(i.path, grep)]
    if json_out:
        typer.echo(json.dumps([{"id": i.id, "path": str(i.path), "title": i.title, "updated": i.updated,
                                "n_turns": i.n_turns, "model": i.model} for i in infos]))
    else:
        for i in infos:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(i.updated))
            typer.echo(f"{i.id}  {when}  {i.n_turns:3d} {'turn ' if i.n_turns == 1 else 'turns'}  {i.title}"
                       f"  ({i.model or '?'})")
        if not infos:
            typer.echo("no saved sessions", err=True)
    for e in errors:
        from .textsafe import safe_line
        typer.echo(safe_line(f"skipped: {e}"), err=True)


@sessions_app.command("show")
def sessions_show(ref: str = typer.Argument(..., metavar="ID|PATH")):
    """Print a session as markdown."""
    from .textsafe import safe_text
    from .sessions import export as session_export
    typer.echo(safe_text(session_export.export_markdown(load_session_noting(ref))))


@sessions_app.command("export")
def sessions_export(ref: str = typer.Argument(..., metavar="ID|PATH"),
                    fmt: str = typer.Option("md", "--format", "-f", metavar="md|json", help="md or json."),
                    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="PATH", help="Write to a file (default: stdout).")):
    """Export a session as markdown or JSON."""
    check_choice("--format", fmt, ("md", "json"))
    sess = load_session_noting(ref)
    from .sessions import export as session_export
    text = session_export.export_markdown(sess) if fmt == "md" else session_export.export_json(sess)
    if out is None:
        from .textsafe import safe_text
        typer.echo(safe_text(text))
    else:
        from .fsutil import write_out
        from .textsafe import safe_line
        write_out(out, text.encode("utf-8"))       # a link is followed, a FIFO or a device written through
        typer.echo(safe_line(f"wrote {out}"), err=True)


@sessions_app.command("rename")
def sessions_rename(ref: str = typer.Argument(..., metavar="ID"), title: str = typer.Argument(...)):
    """Give a session a new title."""
    from .sessions import session as session_files
    session_files.rename(ref, title)


@sessions_app.command("copy")
def sessions_copy(ref: str = typer.Argument(..., metavar="ID"),
                  title: Optional[str] = typer.Option(None, "--title", metavar="TITLE", help="The copy's title (default: TITLE (copy))."),
                  json_out: bool = typer.Option(False, "--json", help="Print the copy's id and path as JSON.")):
    """Save a copy of a session under a new id (also while it is open elsewhere); continue it with -s NEW_ID."""
    import json

    from .sessions import session as session_files
    ref = session_files.resolve_id(ref)                     # the whole id, for the message below
    dup = session_files.copy(ref, title=title)
    path = session_files.session_path(dup.id)
    if json_out:
        typer.echo(json.dumps({"id": dup.id, "path": str(path), "title": dup.title}))
    else:
        typer.echo(dup.id)
        from .textsafe import safe_line
        typer.echo(safe_line(f"copied {ref} to {dup.id} ({dup.title}): continue it with `tinychat -s {dup.id}`"),
                   err=True)


@sessions_app.command("rm")
def sessions_rm(ref: str = typer.Argument(..., metavar="ID")):
    """Delete a session (and its KV snapshot)."""
    from .sessions import session as session_files
    sid = session_files.resolve_id(ref)
    if not session_files.delete(sid):
        raise UsageError(f"no session {ref!r} (`tinychat sessions` lists the saved ones)")
    typer.echo(f"deleted {sid}", err=True)
