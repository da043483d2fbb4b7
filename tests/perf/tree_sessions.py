"""Big session trees (issue #33 item 4): `tinychat sessions` and the autosave after a turn on trees of N messages.

Each session holds a short active path (system, 2 turns) and N branch messages shaped as a chat writes them (user
messages of ~12 tokens, replies of ~20 sampled tokens with their settings, seed and per-token timings), in one of two
shapes: "deep", a chain of N messages hung off the first reply (what /edit or /alt back to an early turn leaves of a
long chat), and "wide", N/2 alternatives of the first reply, each with a one-turn continuation. Files are written
with json directly (not through session.save), so the figures of a revision whose save is slow can be taken too.

For each shape and size: `tinychat sessions` in a fresh process (wall time, so Python's start-up is in it; the bare
start-up, `tinychat sessions` of an empty folder, is printed for reference) and session.load in this process, on
the file as generated (json.dumps, indent 1); then the autosave after a turn: a Chat (the tiny test model)
continues the session, sends one message, and the save that follows is timed (Chat.save: the session file and its KV
snapshot), median of --repeats turns (the first save after a restore encodes the whole tree and is not counted:
its time is printed too); then `tinychat sessions` again, on the file as tinychat wrote it. CPU seconds are printed
beside wall seconds for the in-process figures (a loaded host stretches wall time).

    python tests/perf/tree_sessions.py [--sizes 2000 10000 100000] [--shapes deep wide] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))           # this checkout's tinychat, not an installed one
sys.path.insert(0, str(ROOT / "tests"))

SETTINGS = {"temperature": 0.8, "top_p": 0.9, "penalty": 1.2, "penalty_window": 64, "ban": True, "no_parrot": True,
            "ban_reply": True, "max_new": 64, "seed": None, "step": None}


def _msg(rng, mid, parent, role, tok):
    n = 12 if role == "user" else 20
    ids = [rng.randrange(3, 390) for _ in range(n)]
    if role == "assistant":
        frame = tok.generation_prompt_ids() + ids + tok.end_ids()
        seed = rng.randrange(2 ** 62)
        return {"role": role, "content": tok.decode(ids, skip_special=True), "token_ids": frame,
                "created": 1796000000.0 + mid, "settings": {**SETTINGS, "seed": seed}, "seed": seed,
                "finish": "stop", "timing_ms": [round(rng.uniform(1, 5), 3) for _ in ids], "id": mid,
                "parent": parent, "fork": None}
    text = tok.decode(ids, skip_special=True)
    return {"role": role, "content": text, "token_ids": tok.message_ids(role, text), "created": 1796000000.0 + mid,
            "settings": None, "seed": None, "finish": None, "timing_ms": None, "id": mid, "parent": parent,
            "fork": None}


def make_session(n: int, shape: str, tok, sid: str) -> dict:
    rng = random.Random(n)
    sys_text = "You are a helpful assistant."
    msgs = [{"role": "system", "content": sys_text, "token_ids": tok.message_ids("system", sys_text),
             "created": 1796000000.0, "settings": None, "seed": None, "finish": None, "timing_ms": None, "id": 1,
             "parent": None, "fork": None}]
    nxt = 2
    for role in ("user", "assistant", "user", "assistant"):      # the active path: two turns
        msgs.append(_msg(rng, nxt, nxt - 1, role, tok))
        nxt += 1
    first_reply = 3
    branches = []
    if shape == "deep":          # a chain off the first reply: user, assistant, user, ...
        parent = first_reply
        for i in range(n):
            branches.append(_msg(rng, nxt, parent, "user" if i % 2 == 0 else "assistant", tok))
            parent, nxt = nxt, nxt + 1
        if branches and branches[-1]["role"] == "user":
            branches.pop()
    else:                        # wide: alternatives of the first reply, each continued by one turn
        for _ in range(n // 4):
            a = _msg(rng, nxt, 2, "assistant", tok)
            u = _msg(rng, nxt + 1, nxt, "user", tok)
            r = _msg(rng, nxt + 2, nxt + 1, "assistant", tok)
            alt_user = _msg(rng, nxt + 3, first_reply, "user", tok)    # and an edit of the second message
            alt_user_reply = _msg(rng, nxt + 4, nxt + 3, "assistant", tok)
            branches += [a, u, r, alt_user, alt_user_reply]
            nxt += 5
    return {"schema": "tinychat.session", "version": 2, "id": sid, "title": f"{shape} {n}", "created": 1796000000.0,
            "updated": 1796000000.0, "model": {"name": "tiny-test", "hash": "", "max_len": 512},
            "tokenizer_hash": tok.sha256, "quant": "none", "device": "cpu", "settings": dict(SETTINGS),
            "messages": msgs, "branches": branches, "revision": 1, "kv_sha256": ""}


def _wall(cmd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 100000])
    ap.add_argument("--shapes", nargs="+", default=["deep", "wide"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-autosave", action="store_true", help="skip the autosave measurement")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    from support import make_chat_model, tokenizer

    from tinychat.sessions import session as S
    from tinychat.chat.runtime import Chat
    tok, model = tokenizer(), make_chat_model()
    home = Path(tempfile.mkdtemp(prefix="tree-sessions-"))
    os.environ["TINYCHAT_HOME"] = str(home)          # this process's saves and the listing's cache: the same home
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    folder = home / "sessions"
    folder.mkdir(parents=True)
    cli = [sys.executable, "-m", "tinychat", "sessions"]
    start = statistics.median(_wall(cli, env) for _ in range(3))
    print(f"`tinychat sessions` of an empty folder (Python start-up): {start:.2f} s")
    print("| shape | messages | file MB (generated / written) | `tinychat sessions` s (generated / written) "
          "| load s (cpu) | first save ms | autosave after a turn ms (cpu) |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes:
        for n in a.sizes:
            sid = f"20261202-000000-000-{shape[:1]}{n:05d}"[:26]
            path = folder / f"{sid}.json"
            path.write_text(json.dumps(make_session(n, shape, tok, sid), indent=1))
            mb = path.stat().st_size / 2 ** 20
            listed = _wall(cli, env)
            c0, t0 = time.process_time(), time.perf_counter()
            sess = S.load(path)
            loaded, loaded_cpu = time.perf_counter() - t0, time.process_time() - c0
            first = save_ms = save_cpu = float("nan")
            mb2, listed2 = float("nan"), float("nan")
            if not a.no_autosave:
                chat = Chat.restore(sess, model, tok, max_len=512, sessions_dir=folder)
                chat.settings = chat.settings.with_value("max_new", "4")
                t0 = time.perf_counter()
                chat.save()
                first = (time.perf_counter() - t0) * 1000
                times, cpu = [], []
                for i in range(a.repeats):
                    chat.send(f"one more line {i}")
                    c0, t0 = time.process_time(), time.perf_counter()
                    chat.save()
                    times.append((time.perf_counter() - t0) * 1000)
                    cpu.append((time.process_time() - c0) * 1000)
                save_ms, save_cpu = statistics.median(times), statistics.median(cpu)
                chat.close()
                mb2 = path.stat().st_size / 2 ** 20
                listed2 = _wall(cli, env)
            print(f"| {shape} | {n:,} | {mb:.1f} / {mb2:.1f} | {listed:.2f} / {listed2:.2f} | {loaded:.2f} "
                  f"({loaded_cpu:.2f}) | {first:.0f} | {save_ms:.1f} ({save_cpu:.1f}) |", flush=True)
            path.unlink()
            S.snapshot_path(sid, folder).unlink(missing_ok=True)

if __name__ == "__main__":
    main()
