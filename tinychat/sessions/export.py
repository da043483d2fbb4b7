"""Sessions as text: the file's exact JSON, and markdown for reading (`tinychat sessions show / export`)."""
from __future__ import annotations

from datetime import datetime

from tinychat.sessions.session import UNTITLED, Session, _serialize
from tinychat.sessions import tree as session_tree


def export_json(session: Session) -> str:
    """The session as one JSON document, as a version-2 session file holds it (loadable again with `load(path)`; a
    big session's own file is a log of JSON lines: sessions/log.py)."""
    return b"".join(_serialize(session, f"<session {session.id}>")).decode("utf-8")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def export_markdown(session: Session) -> str:
    """A readable transcript: title, model line, then one section per message."""
    model = session.model.get("name") or "unknown model"
    if session.model.get("hash"):
        model += f" ({str(session.model['hash'])[:12]})"
    lines = [
        f"# {session.title or UNTITLED}",
        "",
        f"*{model} · {session.quant} · {session.device} · started {_when(session.created)}*",
    ]
    kids = session_tree.children(session) if session.branches else {}
    for m in session.messages:
        sibs = kids.get(m.parent, [m]) if kids else [m]
        alt = ""
        if len(sibs) > 1:
            at = next(i for i, s in enumerate(sibs) if s is m) + 1
            alt = f" ({'reply' if m.role == 'assistant' else 'message'} {at}/{len(sibs)})"
        lines += ["", f"## {m.role.capitalize()}{alt}", "", m.content.rstrip("\n")]
        if m.finish in ("length", "cancelled"):
            lines += ["", f"*(reply cut off: {m.finish})*"]
        elif m.finish == "edited":
            lines += ["", "*(reply edited by hand)*"]
        if m.fork:
            lines += ["", f"*(forked: reply token {m.fork['position'] + 1} chosen by hand, id {m.fork['token']})*"]
    return "\n".join(lines) + "\n"
