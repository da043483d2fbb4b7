"""A Hugging Face Hub on 127.0.0.1 for the tests: the routes huggingface_hub calls, answered from repos held in memory,
so `tinychat pull` runs end to end through the real client (HF_ENDPOINT pointed here) and never the network.

    with FakeHub() as hub:
        commit = hub.add("org/tiny", {"config.json": b"...", "model.safetensors": b"..."})
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf")}

Routes: model info (GET /api/models/REPO[/revision/REV], ?blobs=true gives sizes and LFS sha256), the file tree
(GET /api/models/REPO/tree/REV[/PATH]) and paths-info (POST /api/models/REPO/paths-info/REV), and files
(HEAD / GET /REPO/resolve/REV/PATH: ETag, X-Repo-Commit, X-Linked-Size / X-Linked-Etag for LFS files, Range
requests answered 206). Errors as the Hub sends them: 401 + X-Error-Code RepoNotFound for an unknown repo, 404
RevisionNotFound / EntryNotFound, 401 GatedRepo for a gated repo without its token. Every request is logged
(`hub.log`); `hub.stall(repo, path, after)` makes GETs of a file stop after `after` bytes until released, for
interrupting a download mid-file. The server thread handles at most `max_requests` requests, and stops on exit."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]
    token: str | None = None                            # gated: the token that opens it
    sizes: dict[str, int] = field(default_factory=dict)  # sizes to claim instead of the real ones (disk-space tests)

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_id(data)

    def size(self, path: str) -> int:
        return self.sizes.get(path, len(self.files[path]))

    def entry(self, path: str) -> dict:
        e = {"type": "file", "path": path, "size": self.size(path), "oid": git_blob_id(self.files[path])}
        if self.is_lfs(path):
            e["lfs"] = {"oid": self.etag(path), "size": self.size(path), "pointerSize": 134}
        return e


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):      # a client that hung up mid-answer: not news
        pass


@dataclass
class Logged:
    method: str
    path: str                   # the URL path, unquoted
    range: str | None
    status: int
    sent: int = 0               # body bytes written
    auth: str | None = None


class FakeHub:
    def __init__(self, max_requests: int = 2000):
        self.repos: dict[str, Repo] = {}
        self.log: list[Logged] = []
        self.max_requests = max_requests
        self._stalls: dict[tuple[str, str], tuple[int, threading.Event, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.timeout = 0.1
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    # -- the test's side ------------------------------------------------------------------------------------------
    def add(self, repo: str, files: dict[str, bytes], token: str | None = None, sizes: dict | None = None) -> str:
        """Publish repo at a new commit (its hash: of the files); returns the commit."""
        h = hashlib.sha1(repo.encode())
        for p in sorted(files):
            h.update(p.encode() + b"\0" + hashlib.sha256(files[p]).digest())
        commit = h.hexdigest()
        self.repos[repo] = Repo(commit, dict(files), token, dict(sizes or {}))
        return commit

    def stall(self, repo: str, path: str, after: int) -> threading.Event:
        """GETs of repo/path send `after` bytes, then wait until the returned event is set (or 60 s)."""
        ev = threading.Event()
        self._stalls[(repo, path)] = (after, ev, 0)
        return ev

    def drop_once(self, repo: str, path: str, after: int, skip: int = 0) -> None:
        """The next GET of repo/path after `skip` more sends `after` bytes and hangs up (a network drop mid-file)."""
        ev = threading.Event()
        ev.set()
        self._stalls[(repo, path)] = (after, ev, skip + 1)

    def unstall(self) -> None:
        for _, ev, _ in self._stalls.values():
            ev.set()
        self._stalls.clear()

    def requests(self, method: str | None = None, path_part: str = "") -> list[Logged]:
        with self._lock:
            return [r for r in self.log if (method is None or r.method == method) and path_part in r.path]

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.unstall()
        self._stop.set()
        self._thread.join(5)
        self.server.server_close()

    def _serve(self) -> None:
        n = 0
        while not self._stop.is_set() and n < self.max_requests:
            self.server.handle_request()        # returns after one request or the 0.1 s timeout
            n = len(self.log)

    # -- the server's side ----------------------------------------------------------------------------------------
    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):        # quiet
                pass

            def do_GET(self):
                hub._route(self, "GET")

            def do_HEAD(self):
                hub._route(self, "HEAD")

            def do_POST(self):
                hub._route(self, "POST")

        return Handler

    def _send(self, h, status: int, body: bytes = b"", headers: dict | None = None, rec: Logged | None = None,
              stall: tuple | None = None) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if rec is not None:
            rec.status = status
        if h.command == "HEAD" or not body:
            return
        try:
            if stall is not None:
                after, ev = stall
                h.wfile.write(body[:after])
                h.wfile.flush()
                if rec is not None:
                    rec.sent = min(after, len(body))
                ev.wait(60)
                h.close_connection = True       # the connection drops here: a download cut mid-file
                return
            for i in range(0, len(body), 1 << 16):
                h.wfile.write(body[i:i + (1 << 16)])
                if rec is not None:
                    rec.sent = min(i + (1 << 16), len(body))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _error(self, h, status: int, code: str | None, message: str, rec: Logged) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        headers["X-Error-Message"] = message
        self._send(h, status, json.dumps({"error": message}).encode(), headers, rec)

    def _route(self, h, method: str) -> None:
        url = urlparse(h.path)
        path = unquote(url.path)
        rec = Logged(method, path, h.headers.get("Range"), 0, auth=h.headers.get("Authorization"))
        with self._lock:
            self.log.append(rec)
        if method == "POST":
            n = int(h.headers.get("Content-Length") or 0)
            body = h.rfile.read(n).decode() if n else ""
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree|paths-info)/([^/]+)(?:/(.*))?)?$", path)
        if m:
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._error(h, 401, "RepoNotFound", "Repository not found", rec)
            rev = m.group(3) or "main"
            if rev not in ("main", repo.commit):
                return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", rec)
            kind = m.group(2)
            if kind == "tree":
                under = (m.group(4) or "").strip("/")
                items = [repo.entry(p) for p in sorted(repo.files) if not under or p.startswith(under + "/")]
                return self._send(h, 200, json.dumps(items).encode(), {"Content-Type": "application/json"}, rec)
            if kind == "paths-info":
                form = parse_qs(body) if not body.startswith("{") else json.loads(body)
                wanted = form.get("paths", [])
                items = [repo.entry(p) for p in wanted if p in repo.files]
                return self._send(h, 200, json.dumps(items).encode(), {"Content-Type": "application/json"}, rec)
            blobs = "blobs" in parse_qs(url.query)
            sib = [{"rfilename": p, **({"size": repo.size(p), "blobId": git_blob_id(repo.files[p])} if blobs else {}),
                    **({"lfs": {"size": repo.size(p), "sha256": repo.etag(p), "pointerSize": 134}}
                       if blobs and repo.is_lfs(p) else {})} for p in sorted(repo.files)]
            info = {"id": m.group(1), "modelId": m.group(1), "sha": repo.commit, "private": False,
                    "gated": "auto" if repo.token else False, "siblings": sib, "tags": []}
            return self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, rec)
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._error(h, 401, "RepoNotFound", "Repository not found", rec)
            if repo.token and h.headers.get("Authorization") != f"Bearer {repo.token}":
                return self._error(h, 401, "GatedRepo", f"Access to model {m.group(1)} is restricted. You must "
                                   "have access to it and be authenticated to access it. Please log in.", rec)
            rev, p = m.group(2), m.group(3)
            if rev not in ("main", repo.commit):
                return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", rec)
            if p not in repo.files:
                return self._error(h, 404, "EntryNotFound", f"{p} does not exist", rec)
            data = repo.files[p]
            etag = repo.etag(p)
            headers = {"ETag": f'"{etag}"', "X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if repo.is_lfs(p):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(repo.size(p))})
            rng = h.headers.get("Range")
            stall = self._stalls.get((m.group(1), p)) if method == "GET" else None
            if stall is not None and stall[2]:          # a one-off drop: counts down the GETs it lets by
                if stall[2] > 1:
                    self._stalls[(m.group(1), p)] = (*stall[:2], stall[2] - 1)
                    stall = None
                else:
                    self._stalls.pop((m.group(1), p), None)
            stall = stall[:2] if stall else None
            if rng:
                r = re.match(r"bytes=(\d+)-(\d*)$", rng)
                start = int(r.group(1))
                end = int(r.group(2)) if r.group(2) else len(data) - 1
                if start >= len(data):
                    return self._send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"}, rec)
                end = min(end, len(data) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                part = data[start:end + 1]
                headers["Content-Length"] = str(len(part))
                return self._send(h, 206, part, headers, rec, stall)
            headers["Content-Length"] = str(len(data))
            return self._send(h, 200, data, headers, rec, stall)
        return self._error(h, 404, None, f"no route {path}", rec)
