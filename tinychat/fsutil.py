"""Atomic file writes: a temp file beside the target, fsynced, renamed over it, then the folder fsynced. A crash
at any point leaves either the old file or the new one, never a torn one."""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable


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
