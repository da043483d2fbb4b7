"""Downloading a pull's files into the standard cache with huggingface_hub, with a progress figure and what an interrupted
pull left behind put to use.

- Each file is fetched with `hf_hub_download(repo, path, revision=COMMIT)`, one after the other, on a worker thread;
  the calling thread reports progress from the bytes on disk (the finished files, plus the part file the hub writes
  at `blobs/ETAG.*.incomplete`), which reads the same for the hub's HTTP and Xet paths and across its versions.
- A network drop in the middle of a file is retried by the hub itself with a Range request, in the same pull.
- A killed or interrupted pull (Ctrl+C stops the main thread; the worker dies with the process, so its part file is
  kept) leaves `blobs/ETAG.*.incomplete`. huggingface_hub 1.x+ starts every download in a fresh part file, so the
  next pull continues the longest part itself: the hub's `http_get` with `resume_size` (a Range request from where
  it stopped), checked against the file's sha256 (an LFS file's ETag) before it is moved to `blobs/ETAG`; the hub
  then only links it into the snapshot. Parts that cannot be checked (small non-LFS files) are deleted and fetched
  again. Finished files are never fetched again (the hub finds their blobs)."""
from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from .cache import hub_module, repo_folder

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Interrupted(Exception):
    """Ctrl+C during the download: done / total bytes when it stopped (the part file is kept for the next pull)."""

    def __init__(self, done: int, total: int):
        super().__init__(f"interrupted at {done} of {total} bytes")
        self.done, self.total = done, total


@dataclass(frozen=True)
class FileSpec:
    path: str                   # in the repo
    size: int
    etag: str | None            # the blob's name in the cache: an LFS file's sha256, else its git blob id


def quiet(fn) -> dict:
    """{"tqdm_class": a class whose bars never draw} for a hub function that takes one (the pull draws its own bar;
    huggingface_hub before ~1.x had no such parameter and draws its bars itself)."""
    import inspect
    if "tqdm_class" not in inspect.signature(fn).parameters:
        return {}
    from huggingface_hub.utils import tqdm

    class Quiet(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return {"tqdm_class": Quiet}


def parts(storage: Path, etag: str | None) -> list[Path]:
    """The part files downloads of this blob left (`ETAG.incomplete`, `ETAG.<id>.incomplete`), longest first."""
    if not etag:
        return []
    found = []
    for p in (storage / "blobs").glob(f"{etag}*.incomplete"):
        try:
            found.append((p.stat().st_size, p))
        except OSError:
            continue
    return [p for _, p in sorted(found, key=lambda t: (-t[0], str(t[1])))]


def part_bytes(storage: Path, specs: list[FileSpec]) -> int:
    """Bytes already on disk in part files of these files (what a resumed pull need not fetch again)."""
    total = 0
    for s in specs:
        ps = parts(storage, s.etag)
        if ps:
            try:
                total += min(ps[0].stat().st_size, s.size)
            except OSError:
                pass
    return total


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resume_part(repo: str, spec: FileSpec, commit: str, storage: Path, token=None) -> bool:
    """Finish the longest part file an earlier pull left for spec (a Range request through the hub's http_get),
    check it against its sha256 and move it to blobs/ETAG. True when the blob is now there; False when there was
    nothing to resume, another process holds the file's lock, or the part did not check out (then it is deleted and
    the file fetched whole). Parts are only touched under the hub's lock of the blob, which a running download
    holds: a part another process is writing is never deleted."""
    hub = hub_module()
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers
    found = parts(storage, spec.etag)
    blob = storage / "blobs" / (spec.etag or "")
    if not found or blob.exists():
        return False
    lock = storage.parent / ".locks" / storage.name / f"{spec.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with WeakFileLock(lock, timeout=1):
            part, rest = found[0], found[1:]
            for p in rest:
                p.unlink(missing_ok=True)
            have = part.stat().st_size
            if not _SHA256.match(spec.etag or "") or have > spec.size:
                part.unlink(missing_ok=True)            # no sha256 to check it against: fetched whole
                return False
            if have < spec.size:
                url = hub.hf_hub_url(repo, spec.path, revision=commit)
                meta = hub.get_hf_file_metadata(url, token=token)
                if meta.etag != spec.etag or (meta.size is not None and meta.size != spec.size):
                    part.unlink(missing_ok=True)        # the file changed since: fetch it whole
                    return False
                headers = build_hf_headers(token=token)
                location = meta.location or url
                if urlparse(location).netloc != urlparse(url).netloc:
                    headers.pop("authorization", None)  # a signed CDN link: no token there (as the hub does)
                with open(part, "ab") as f:
                    http_get(location, f, resume_size=have, headers=headers, expected_size=spec.size,
                             **quiet(http_get))
            if _sha256(part) != spec.etag:
                part.unlink(missing_ok=True)
                return False
            os.replace(part, blob)
            return True
    except Exception as e:  # noqa: BLE001  filelock's Timeout: another process is fetching this file
        if type(e).__name__ == "Timeout":
            return False
        raise


def download(repo: str, commit: str, specs: list[FileSpec], cache: Path | None = None, token=None,
             progress=None, poll_s: float = 0.25) -> int:
    """Fetch every file of specs into the cache at commit (resuming parts left by an earlier pull); returns the bytes
    that were not in the cache before. progress(done, total) is called from this thread every poll_s while it runs.
    Interrupted on Ctrl+C (the worker thread dies with the process; its part file stays for the next pull). Errors
    of the hub are raised here as the hub raised them."""
    hub = hub_module()
    storage = repo_folder(repo, cache)
    total = sum(s.size for s in specs)
    state = {"done": 0, "current": None, "error": None, "fetched": 0}

    def have(s: FileSpec) -> bool:
        return bool(s.etag) and (storage / "blobs" / s.etag).exists()

    def work():
        try:
            quiet_bars = quiet(hub.hf_hub_download)
            for s in specs:
                state["current"] = s
                if not have(s):
                    state["fetched"] += s.size - part_bytes(storage, [s])
                    resume_part(repo, s, commit, storage, token)
                hub.hf_hub_download(repo, s.path, revision=commit, cache_dir=cache, token=token, **quiet_bars)
                state["done"] += s.size
                state["current"] = None
        except BaseException as e:  # noqa: BLE001  handed to the calling thread, which raises it
            state["error"] = e

    def done_now() -> int:
        cur = state["current"]
        extra = 0
        if cur is not None:
            ps = parts(storage, cur.etag)
            if ps:
                try:
                    extra = min(ps[0].stat().st_size, cur.size)
                except OSError:
                    pass
        return min(state["done"] + extra, total)

    t = threading.Thread(target=work, name="tinychat-pull", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(poll_s)
            if progress is not None:
                progress(done_now(), total)
    except KeyboardInterrupt:
        raise Interrupted(done_now(), total) from None
    if state["error"] is not None:
        raise state["error"]
    if progress is not None:
        progress(total, total)
    return state["fetched"]
