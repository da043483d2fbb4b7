"""`tinychat replay ID|DIR --check`: replay every branch of a session (or of each session in a folder) and say, per
branch, whether it regenerates token-exact. A folder of saved chats then works as a regression suite for a new
checkpoint or an engine change.

Exit codes: 0 every branch of every session token-exact; 1 some branch differs (its path and first differing token
are reported); 2 a session that cannot be checked (unreadable, another model). One line, or with --json one JSON
object, per session in a folder."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..sessions import session as session_files
from .replay import BranchReplay, replay_tree
from ..settings import ChatError
from ..textsafe import plural, safe_line


def branch_lines(results: list[BranchReplay]) -> list[str]:
    """The report of one session: a line per differing branch, with its divergences and step notes."""
    lines = []
    for b in results:
        for d in b.report.divergences:
            lines.append(safe_line(f"branch {b.label}: divergence: {d.describe()}"))
        for problem in b.report.text_problems:
            lines.append(safe_line(f"branch {b.label}: {problem}"))
        if b.report.step_note():
            lines.append(safe_line(f"branch {b.label}: {b.report.step_note()}"))
    return lines


def summary(session_id: str, results: list[BranchReplay]) -> dict:
    """One session's result as a JSON-able object."""
    first = next(((b, b.report.divergences[0]) for b in results if b.report.divergences), None)
    text = next((f"branch {b.label}: {p}" for b in results for p in b.report.text_problems), None)
    return {"session": session_id, "ok": all(b.report.ok for b in results), "branches": len(results),
            "turns": sum(len(b.report.turns) for b in results),
            "tokens": sum(b.report.n_tokens for b in results),
            "differs": None if first is None else {
                "branch": first[0].label, "turn": first[1].turn, "position": first[1].position,
                "recorded": first[1].recorded, "replayed": first[1].replayed},
            "text": text}


def check_folder(folder: Path, open_chat: Callable[[session_files.Session], object], echo: Callable[[str], None],
                 json_out: bool = False, progress=None) -> int:
    """Check every session file in `folder` (open_chat(session) -> a fresh replay Chat); returns the exit code.
    progress(done, total, what): sessions done of all, what names the session and its turn."""
    code = 0
    files = sorted(p for p in Path(folder).glob("*.json") if not p.name.startswith("."))
    if not files:
        echo(json.dumps({"error": f"{folder}: no session files"}) if json_out else f"{folder}: no session files")
        return 2
    for n, path in enumerate(files):
        def turns(done, total, what, _n=n, _stem=path.stem):
            if progress is not None:
                progress(_n, len(files), f"session {_n + 1}/{len(files)} {_stem}: {what} ({done}/{total} turns)")
        try:
            turns(0, 0, "loading")
            sess = session_files.load(path)
            results = replay_tree(open_chat(sess), sess, progress=turns)
        except (session_files.SessionError, ChatError, ValueError, RuntimeError, OSError) as e:
            msg = " ".join(str(e).split()) or type(e).__name__
            echo(json.dumps({"session": path.stem, "error": msg}) if json_out else safe_line(f"{path.stem}: error: {msg}"))
            code = 2
            continue
        s = summary(sess.id, results)
        if not s["ok"]:
            code = max(code, 1)
        if json_out:
            echo(json.dumps(s))
        elif s["ok"]:
            echo(f"{sess.id}: token-exact ({plural(s['branches'], 'branch', 'branches')}, {plural(s['turns'], 'turn')}, "
                 f"{plural(s['tokens'], 'token')})")
        elif s["differs"] is not None:
            d = s["differs"]
            echo(safe_line(f"{sess.id}: DIFFERS branch {d['branch']}, turn {d['turn']}, token {d['position']}: "
                           f"recorded {d['recorded']}, replayed {d['replayed']}"))
        elif s["text"] is not None:
            echo(safe_line(f"{sess.id}: DIFFERS {s['text']}"))
        else:
            echo(safe_line(f"{sess.id}: DIFFERS (see `tinychat replay {sess.id} --check`)"))
    if progress is not None:
        progress(len(files), len(files), "done")
    return code
