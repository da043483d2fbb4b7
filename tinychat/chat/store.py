"""Where a chat's session is kept: the session file and its KV snapshot (sessions/session.py, sessions/snapshot.py),
the session's lock while the chat writes it (sessions/lock.py), and the result of the last autosave.

A save writes the session (atomic) and then its KV snapshot, whose checksum the session records; an autosave never
raises: a failure is one line in `save_warning` and the turn stays in the chat, saved with the next one."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..sessions import session as session_files
from ..sessions import snapshot
from ..sessions.session import Session


class SessionStore:
    """One chat's saving: the sessions folder (None: the default), whether it autosaves, the lock it holds."""

    def __init__(self, sessions_dir: Path | None = None, autosave: bool = True):
        self.sessions_dir, self.autosave = sessions_dir, autosave
        self.save_warning: str | None = None  # the last autosave's failure, one line (None: saved)
        self._lock = None                     # the session's lock while this chat writes it (sessions/lock.py)

    def write(self, session: Session, tensors: dict, meta: Callable[[], dict[str, str]]) -> Path:
        """Write `session` (atomic), then its KV snapshot `tensors` with meta(); the session records the snapshot's
        checksum. Holds the session's lock first. Raises what the save raises (OSError, SessionError: SessionLocked,
        SessionConflict, SnapshotError when only the snapshot failed)."""
        self.hold_lock(session.id)
        session.kv_sha256 = snapshot.tensors_sha256(tensors)
        path = session_files.save(session, self.sessions_dir)
        snapshot.save_snapshot(session.id, tensors, meta(), self.sessions_dir)
        return path

    def hold_lock(self, session_id: str) -> None:
        """Hold the session's lock from now until close() (SessionLocked when another process has it open)."""
        if self._lock is None or self._lock.session_id != session_id:
            self.close()
            self._lock = session_files.lock(session_id, self.sessions_dir)

    def close(self) -> None:
        """Let go of the session's lock (another process may then open it). The chat may save again later."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def save_quietly(self, save: Callable[[], object]) -> str | None:
        """Run save() when autosaving; never raises. Returns (and keeps in `save_warning`) one line when it failed:
        the turn stays in the chat and the next save writes it."""
        self.save_warning = None
        if not self.autosave:
            return None
        try:
            save()
        except session_files.SnapshotError as e:
            self.save_warning = f"saved the chat, but not its KV snapshot ({e}); it is rebuilt from the tokens " \
                                f"when continued"
        except (OSError, session_files.SessionError, RuntimeError) as e:
            what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.save_warning = f"not saved: {what} (the turn is kept here and saved with the next one)"
        return self.save_warning

    def open_for_writing(self, session: Session) -> None:
        """A continued session: hold its lock and check that the copy on disk is the one loaded (one writer per
        session; never save over a newer copy). SessionError (the lock let go) when not; a folder that cannot hold
        a lock file cannot hold a save either: the chat goes on, and each save warns."""
        try:
            self.hold_lock(session.id)
            session_files.check_current(session, self.sessions_dir)
        except session_files.SessionError:
            self.close()
            raise
        except OSError:
            self.close()

    def read_snapshot(self, session: Session) -> tuple[tuple | None, str | None]:
        """((tensors, meta), None) for the KV snapshot the session recorded (its checksum), or (None, why) where
        there is none to use (why: a line for the user, None when there is nothing worth saying)."""
        if not session.kv_sha256:            # none recorded (a file from before checksums): not verifiable
            return None, None
        try:
            snap = snapshot.load_snapshot(session.id, self.sessions_dir)
        except session_files.SessionError:   # a damaged snapshot only costs the fast path
            return None, "the KV snapshot could not be read: rebuilt the cache from the token ids"
        if snap is None:
            return None, None
        if snapshot.tensors_sha256(snap[0]) != session.kv_sha256:
            return None, "the KV snapshot does not match the checksum the session recorded: rebuilt the cache " \
                         "from the token ids"
        return snap, None
