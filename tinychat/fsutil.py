"""Atomic file writes: a temp file beside the target, fsynced, renamed over it, then the folder fsynced. A crash
at any point leaves either the old file or the new one, never a torn one."""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable
from .errors import TinychatError


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    """Have `write(tmp)` fill a temp file beside `target`, fsync it, then rename it over `target`.

    Same folder, so the rename is atomic (one file system). On any failure the temp file is removed and
    `target` is untouched. The folder is fsynced after the rename so the new name itself survives a crash."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(data))


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders; its rename is durable enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class OutPathError(TinychatError, ValueError):
    """A path the user named for output that tinychat will not write (a folder, a block device, ...); one line."""


def write_out(target: str | Path, data: bytes) -> Path:
    """Write `data` to a path the user named (`sessions export --out PATH`, the app's export), leaving what is there
    what it is. Returns the path written.

    - Nothing there, or a regular file: an atomic write (a temp file beside it, renamed over it). A file that was
      there keeps its permission bits (the temp file gets them before the rename; a new file is private, 0600).
      Being a new file, it loses other hard links to the old one, and its owner is whoever writes it.
    - A symbolic link: never replaced; its target is written by these same rules (a link to nothing creates its
      target, as a shell's `>` does).
    - A FIFO or a character device (/dev/stdout, /dev/null, a terminal): written through, opened as it is (never
      replaced by a regular file: as root, replacing /dev/null would break the system).
    - A folder, a block device, a socket: refused (OutPathError)."""
    import stat

    target = Path(target)
    real = Path(os.path.realpath(target)) if target.is_symlink() else target
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutPathError(f"{target}: cannot write there ({e.strerror or e})") from None
    if st is None or stat.S_ISREG(st.st_mode):
        if not real.parent.is_dir():
            raise OutPathError(f"{target}: no folder {real.parent}")
        keep = None if st is None else st.st_mode & 0o777

        def fill(tmp: Path) -> None:
            tmp.write_bytes(data)
            if keep is not None:
                os.chmod(tmp, keep)
        atomic_write(real, fill)
        return real
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        fd = os.open(real, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return real
    kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode) else \
        "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file"
    raise OutPathError(f"{target}: {kind}; give the path of a file to write")
