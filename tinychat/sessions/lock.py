"""Per-session advisory locks: one writer per session at a time, across processes.

A chat that has a session open holds `<sessions dir>/.<id>.lock` with `fcntl.flock(LOCK_EX | LOCK_NB)` for as long
as it is open; every save takes it too (briefly, when no chat holds it). A second process that wants to write the
same session gets `LockHeld` at once (session.py raises it as SessionLocked, a SessionError), with the holder's
pid, instead of a silent last-writer-wins.

Rules:
- Within one process locks are shared and counted (`_held`): the app's sessions screen may rename the chat it has
  open, a test may restore a session its own chat holds. Between processes they exclude.
- The lock file is removed when its last holder in the process lets go. An acquirer that opened the file just
  before it was removed would lock a dead inode, so after flock the path must still name the inode that was locked
  (else it retries): the usual pattern for removable lock files.
- The kernel drops the lock when the process dies (kill -9 included), so a crash never leaves a session locked;
  a leftover lock *file* is harmless and reused.
- On systems without fcntl (Windows) locking is a no-op: saves still check the revision (session.py).
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from ..errors import TinychatError

try:
    import fcntl
except ImportError:          # pragma: no cover - Windows
    fcntl = None

_guard = threading.RLock()    # re-entrant: a SessionLock's __del__ may run inside acquire()
_held: dict[str, list] = {}  # resolved lock path -> [fd, count]
_cleaned: set[str] = set()   # folders whose stale temp files this process has swept


class LockHeld(TinychatError, OSError):
    """Another process holds the session. `str(e)` is one line for the user."""

    def __init__(self, session_id: str, pid: int | None):
        who = f"another tinychat (pid {pid})" if pid else "another tinychat"
        super().__init__(errno.EAGAIN, f"session {session_id} is open in {who}: close it there first, continue a "
                                       f"copy (`tinychat sessions copy {session_id}`), or read it "
                                       f"(`tinychat sessions show {session_id}`)")
        self.session_id, self.pid = session_id, pid

    def __str__(self) -> str:
        return self.strerror


def lock_path(folder: Path, session_id: str) -> Path:
    return Path(folder) / f".{session_id}.lock"


def _holder_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
        return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None
    except OSError:
        return None


class SessionLock:
    """A held lock on one session; `release()` (or the context manager) lets go. Acquire with `acquire()`."""

    def __init__(self, key: str, session_id: str):
        self.key, self.session_id = key, session_id
        self._released = False

    def release(self) -> None:
        with _guard:
            if self._released:
                return
            self._released = True
            entry = _held.get(self.key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _held[self.key]
            fd = entry[0]
            if fd is None:
                return
            with contextlib.suppress(OSError):
                os.unlink(self.key)          # while still locked: a waiting acquirer re-checks the inode
            os.close(fd)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()


def acquire(folder: Path, session_id: str) -> SessionLock:
    """Take the session's lock (without waiting); raise LockHeld when another process holds it, OSError when
    the folder cannot hold a lock file (then a save would fail the same way)."""
    folder = Path(folder)
    path = lock_path(folder, session_id)
    key = str(path.resolve()) if folder.exists() else str(path.absolute())
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
            return SessionLock(key, session_id)
        fd = _lock_file(folder, path, session_id) if fcntl is not None else None
        _held[key] = [fd, 1]
        return SessionLock(key, session_id)


def _lock_file(folder: Path, path: Path, session_id: str) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise LockHeld(session_id, _holder_pid(path)) from None
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
            return fd
        os.close(fd)                         # the holder removed it between our open and flock: try again
    raise OSError(errno.EAGAIN, f"{path}: lock file keeps changing")


def is_locked_elsewhere(folder: Path, session_id: str) -> bool:
    """Does another process hold this session's lock? (Takes and drops it when free.)"""
    try:
        acquire(folder, session_id).release()
    except LockHeld:
        return True
    except OSError:
        return False
    return False


def clean_stale_temps(folder: Path, min_age_s: float = 60.0) -> list[Path]:
    """Remove `.<id>.<suffix>.<random>.tmp` files a killed save left behind: older than `min_age_s` and of a
    session no other process holds. Once per folder per process; returns what it removed. Never raises."""
    folder = Path(folder)
    key = str(folder.absolute())
    if key in _cleaned:
        return []
    _cleaned.add(key)
    removed = []
    now = time.time()
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:
        return []
    for p in candidates:
        sid = p.name[1:].split(".", 1)[0]
        try:
            st = p.lstat()
            if now - st.st_mtime < min_age_s or not sid or is_locked_elsewhere(folder, sid):
                continue
            p.unlink()
            removed.append(p)
        except OSError:
            continue
    return removed
