"""What `tinychat sessions` lists, remembered (issue #33 item 4): an index under the user cache folder (one file per
sessions folder, named by a hash of its path) holds, per session file, its listing row (id, title, updated, turns,
model) or the error that skips it, keyed by the file's inode, size, mtime and ctime (ns). A listing parses only the
files that changed since: a 100,000-message tree is some 50 MB of JSON, whose parse alone takes seconds, each time
it is listed.

A save records its file's row (it has just checked the session whole); a listing records the rows it parsed. The
index is a cache: rewritten whole by an atomic rename without fsync (a lost or damaged index only means parsing
again), read leniently, and a row is used only while its key is the file's (a save renames a new inode into place;
an edit in place changes the times). Torch-free; no import of session.py (it hands in its parser)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

ROW_FIELDS = {"id": str, "title": str, "n_turns": int, "model": str}


def key(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def index_path(folder: Path) -> Path:
    """The index of a sessions folder: <user cache>/listing/<hash of the folder's real path>.json."""
    from ..nativebuild import cache_dir
    real = os.path.realpath(folder)
    return cache_dir("listing") / (hashlib.sha256(real.encode("utf-8", "surrogatepass")).hexdigest()[:24] + ".json")


def read(folder: Path) -> dict[str, dict]:
    """{file name: row} of the folder's index; {} when there is none or it cannot be read. Rows of the wrong shape
    are left out."""
    try:
        with open(index_path(folder), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {name: row for name, row in data.items() if isinstance(name, str) and _row_ok(row)}


def _row_ok(row: Any) -> bool:
    if not isinstance(row, dict) or not (isinstance(row.get("key"), list) and len(row["key"]) == 4
                                         and all(type(v) is int for v in row["key"])):
        return False
    if "error" in row:
        return isinstance(row["error"], str)
    return all(type(row.get(k)) is t for k, t in ROW_FIELDS.items()) and type(row.get("updated")) in (int, float)


def write(folder: Path, rows: dict[str, dict]) -> None:
    """Replace the folder's index (no fsync: a cache). Never raises."""
    target = index_path(folder)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(rows, f, separators=(",", ":"))
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


def record(path: Path, row: dict) -> None:
    """Remember the listing row of the session file at `path` as it is now (after a save). Never raises."""
    path = Path(path)
    try:
        row = {**row, "key": key(os.stat(path))}
    except OSError:
        return
    rows = read(path.parent)
    rows[path.name] = row
    write(path.parent, rows)


def listing(folder: Path, parse: Callable[[Path], dict]) -> list[tuple[Path, dict]]:
    """[(path, row)] for every session file of the folder: the index's row where its key is the file's, else
    parse(path) -> row (a row with "error" for a file that cannot be listed). The index is rewritten when it
    changed."""
    folder = Path(folder)
    index = read(folder)
    rows, out = {}, []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):          # in-flight or abandoned temp files
            continue
        try:
            k = key(os.stat(path))
        except OSError:
            k = None
        row = index.get(path.name)
        if k is None or row is None or row["key"] != k:
            row = {**parse(path), "key": k or [0, 0, 0, 0]}
        if k is not None:
            rows[path.name] = row
        out.append((path, row))
    if rows != index:
        write(folder, rows)
    return out
