"""`--save-sessions DIR`: each request saved as a tinychat session of its own (a new id; the conversation it ran on,
its reply, the settings and seed of every turn), so `tinychat replay DIR --check` regenerates what the server sent,
token for token. Written atomically by the session layer; the live chat's own session is never written."""
from __future__ import annotations

import dataclasses
from pathlib import Path


def save_copy(session, folder: Path) -> str:
    """Save a copy of `session` (the active path only) under a new id in `folder`; returns the id."""
    from tinychat.sessions import session as session_files
    copy = dataclasses.replace(session, id=session_files.new_id(), title="", branches=[], revision=0, kv_sha256="",
                               messages=[dataclasses.replace(m, id=0, parent=None) for m in session.messages])
    session_files.save(copy, folder)
    return copy.id
