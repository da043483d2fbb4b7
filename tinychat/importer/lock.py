"""Locks on imported models, across processes (issue #33 item 9; issue #28's `models rm`): a chat holds its model's
lock shared for as long as the model is loaded; `tinychat import` and `tinychat models rm` take it exclusively. So two
imports of one name never run at once (the slower used to delete the faster's model), an import never replaces and
rm never deletes a model a chat has open, and a chat never opens a model while it is being written.

`models/.NAME.lock`, fcntl.flock, never waiting long: a refusal is one line, at once (ModelBusy). The kernel drops a
lock when its process dies (kill -9 included). An exclusive holder writes "PID ACTION" into the file, so the refusal
can say who; shared holders write nothing. The last holder removes the lock file as it lets go, while still holding
it exclusively: an exclusive holder (import, rm, a sweep) always, a shared one (a chat) when it can take it
exclusively at once, i.e. no other chat holds it. An acquirer that opened the file just before checks after flock
that the path still names the inode it locked, else tries again (the pattern sessions/lock.py follows), so a removal
never lets two holders in. Two open descriptions of one file conflict even within a process, so a chat and an import
in one process exclude each other too. (A holder killed with kill -9 leaves its empty file; the next holder of the
name removes it.)

Leftovers: an import writes `models/.NAME.importing` and renames it into place, rm renames the model to
`.NAME.removing` before deleting it; a SIGKILL or SIGTERM meanwhile leaves that folder (an import's can be hundreds of
MB). sweep() removes each whose name's lock nobody holds (so no import or rm is under way), as session temp files are
swept (session_lock.clean_stale_temps). No torch."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from pathlib import Path

try:
    import fcntl
except ImportError:          # pragma: no cover - Windows: no locking (imports still write under a temp name)
    fcntl = None

from .errors import ImportRefused

WAIT_S = 1.0                 # how long an acquirer retries (a sweep holds a lock for milliseconds)
LEFTOVERS = (".importing", ".removing")


class ModelBusy(ImportRefused):
    """The model's lock is held elsewhere; `str(e)` is one line for the user."""


def lock_path(folder: Path, name: str) -> Path:
    return Path(folder) / f".{name}.lock"


class ModelLock:
    """A held lock on one model name; release() (or the context manager, or garbage collection) lets go."""

    def __init__(self, fd: int | None, path: Path, shared: bool):
        self.fd, self.path, self.shared = fd, path, shared

    def release(self) -> None:
        """Let go, removing the lock file when no one else holds it (see the module's docstring)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if not self.shared:
                os.ftruncate(fd, 0)         # no stale "PID ACTION" for a refusal to name, should the file stay
            else:
                # the last chat? Taking it exclusively (at once or not at all) tells; failing drops our shared
                # lock on Linux, which closing was about to do anyway
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _unlink_if_ours(fd, self.path)  # still locked: an acquirer that opened it finds it gone and retries
        except OSError:
            pass                            # another holder (or a folder we cannot write): the file stays
        finally:
            os.close(fd)

    def __enter__(self) -> ModelLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()


def _unlink_if_ours(fd: int, path: Path) -> None:
    """Remove the lock file at `path`, which `fd` holds exclusively, when the path still names that file (never
    another holder's newer one)."""
    st, now = os.fstat(fd), os.stat(path)
    if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
        os.unlink(path)


def _holder(path: Path) -> str:
    """'PID ACTION' of an exclusive holder, as it wrote it ('' when unknown)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return ""
    return " ".join(text[:2]) if len(text) >= 2 and text[0].isascii() and text[0].isdigit() else ""


def _shared_holders(path: Path) -> bool:
    """Is the lock held shared (chats), rather than exclusively? (A shared flock succeeds only then.)"""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _busy(name: str, path: Path, shared: bool) -> ModelBusy:
    if not shared and _shared_holders(path):
        return ModelBusy(f"model {name!r} is open in a chat: close that chat first")
    holder = _holder(path)
    pid, _, action = holder.partition(" ")
    who = f"another tinychat (pid {pid})" if pid else "another tinychat"
    doing = {"import": "being imported", "rm": "being deleted"}.get(action, "in use")
    return ModelBusy(f"model {name!r} is {doing} by {who}: try again when it has finished")


def acquire(folder: Path, name: str, shared: bool, action: str = "", wait: float = WAIT_S) -> ModelLock:
    """The model `name`'s lock, shared (a chat) or exclusive (action: "import", "rm"); ModelBusy when it is held the
    other way (after retrying for `wait` seconds). OSError when the folder cannot hold a lock file."""
    folder = Path(folder)
    path = lock_path(folder, name)
    if fcntl is None:
        return ModelLock(None, path, shared)
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            if time.monotonic() >= deadline:
                raise _busy(name, path, shared) from None
            time.sleep(0.05)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:                         # removed by rm between our open and flock: try again
            os.close(fd)
            continue
        if not shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {action}\n".encode("ascii"))
        return ModelLock(fd, path, shared)


def held_elsewhere(folder: Path, name: str) -> bool:
    """Does anyone hold the model's lock, either way? (Takes and drops it exclusively when free.)"""
    try:
        acquire(folder, name, shared=False, action="sweep", wait=0).release()
    except ModelBusy:
        return True
    except OSError:
        return True                          # cannot tell: leave things as they are
    return False


def sweep(folder: Path) -> list[Path]:
    """Remove the `.NAME.importing` / `.NAME.removing` folders of imports and removals that were killed (their name's
    lock is free: nothing is writing them). Returns what it removed; never raises."""
    removed = []
    try:
        entries = [p for p in Path(folder).iterdir() if p.name.startswith(".") and p.name.endswith(LEFTOVERS)]
    except OSError:
        return removed
    for p in entries:
        name = p.name[1:].rsplit(".", 1)[0]
        if not name:
            continue
        try:
            with acquire(folder, name, shared=False, action="sweep", wait=0):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
                removed.append(p)
        except (ModelBusy, OSError):
            continue
    return removed
