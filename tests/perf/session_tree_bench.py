"""A 100,000-message session (issue #33 item 4): `tinychat sessions` cold, session.load, and the autosave after one
turn, medians. Not a test: figures for docs/benchmarks.md and commit bodies.

Two shapes, N messages each, built as a chat writes them (tests/perf/tree_sessions.make_session: user messages of
~12 tokens, replies of ~20 sampled tokens with settings, seed and per-token timings):
- "deep": a short active path and a chain of N messages hung off its first reply (what /alt or /edit back to an
  early turn leaves of a long chat);
- "path": N messages on the active path (one long chat).

Each file is written with json (one document, as an older tinychat wrote it), then, per shape:
1. `tinychat sessions` in a fresh process with no listing index (`cold`: the file was never listed nor saved here;
   Python's start-up is in it, and printed alone for reference), and again with the index it left (`indexed`);
2. session.load (median of --repeats);
3. the autosave after one turn: a user message and a reply (as Chat builds them) appended to the active path and
   session.save (the session file only; Chat.save also writes the KV snapshot, a fixed cost of the context size),
   median of --repeats turns; the first save after the load (it converts / encodes the whole file) is printed
   apart;
4. then 1 and 2 again on the file as this tinychat wrote it.

    python tests/perf/session_tree_bench.py [--sizes 100000] [--shapes deep path] [--repeats 5]

Runs against the checkout it lives in (or --root another checkout: the same script measures a revision before a
change). Wall seconds; CPU seconds beside the in-process figures (a loaded host stretches wall time).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_path_session(n: int, tok, sid: str) -> dict:
    """N messages on the active path: system, then user / reply turns."""
    from tree_sessions import _msg, make_session
    d = make_session(0, "deep", tok, sid)
    rng = random.Random(n)
    msgs = d["messages"][:1]
    for i in range(n - n % 2):
        msgs.append(_msg(rng, i + 2, i + 1, "user" if i % 2 == 0 else "assistant", tok))
    d.update(messages=msgs, branches=[], title=f"path {n}")
    return d


def _wall(cmd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def _timed(fn):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100000])
    ap.add_argument("--shapes", nargs="+", default=["deep", "path"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--root", type=Path, default=HERE.parents[1], help="the checkout to measure")
    a = ap.parse_args()
    root = a.root.resolve()
    sys.path[:0] = [str(root), str(HERE), str(HERE.parent)]
    from support import tokenizer

    from tinychat.sessions import session as S
    from tinychat.sessions import index as session_index
    tok = tokenizer()
    home = Path(tempfile.mkdtemp(prefix="session-tree-bench-"))
    os.environ["TINYCHAT_HOME"] = str(home)
    env = {**os.environ, "PYTHONPATH": str(root)}
    folder = home / "sessions"
    folder.mkdir(parents=True)
    cli = [sys.executable, "-m", "tinychat", "sessions"]

    def listing(cold: bool) -> float:
        times = []
        for _ in range(a.repeats if not cold else 3):
            if cold:
                session_index.index_path(folder).unlink(missing_ok=True)
            times.append(_wall(cli, env))
        return statistics.median(times)

    start = statistics.median(_wall(cli, env) for _ in range(3))
    print(f"# {root} ({subprocess.run(['git', '-C', str(root), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()})")
    print(f"`tinychat sessions` of an empty folder (Python start-up): {start:.2f} s")
    print("| shape | messages | file MB (as generated / as saved) | `sessions` cold s (generated / saved) "
          "| `sessions` indexed s | load s, cpu (generated / saved) | first save ms | autosave after a turn ms (cpu) |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in a.shapes:
        for n in a.sizes:
            sid = f"20261202-000000-000-{shape[:1]}{n:05d}"[:26]
            path = folder / f"{sid}.json"
            if shape == "path":
                d = make_path_session(n, tok, sid)
            else:
                from tree_sessions import make_session
                d = make_session(n, shape, tok, sid)
            path.write_text(json.dumps(d, indent=1))
            del d
            mb = path.stat().st_size / 2 ** 20
            cold = listing(True)
            loads = [_timed(lambda: S.load(path)) for _ in range(a.repeats)]
            load_s = statistics.median(x[1] for x in loads)
            load_cpu = statistics.median(x[2] for x in loads)
            sess = loads[-1][0]
            del loads
            _, first, _ = _timed(lambda: S.save(sess, folder))
            times, cpu = [], []
            rng = random.Random(1)
            for i in range(a.repeats):
                text = f"one more line {i}"
                ids = [rng.randrange(3, 390) for _ in range(20)]
                sess.messages.append(S.Message("user", text, tok.message_ids("user", text)))
                sess.messages.append(S.Message("assistant", tok.decode(ids, skip_special=True),
                                               tok.generation_prompt_ids() + ids + tok.end_ids(),
                                               settings=dict(sess.settings, seed=i), seed=i, finish="stop",
                                               timing_ms=[1.0] * len(ids)))
                _, t, c = _timed(lambda: S.save(sess, folder))
                times.append(t * 1000)
                cpu.append(c * 1000)
            sess = None
            mb2 = path.stat().st_size / 2 ** 20
            indexed = listing(False)
            cold2 = listing(True)
            loads = [_timed(lambda: S.load(path))[1:] for _ in range(a.repeats)]
            load2_s = statistics.median(x[0] for x in loads)
            load2_cpu = statistics.median(x[1] for x in loads)
            print(f"| {shape} | {n:,} | {mb:.1f} / {mb2:.1f} | {cold:.2f} / {cold2:.2f} | {indexed:.2f} "
                  f"| {load_s:.2f}, {load_cpu:.2f} / {load2_s:.2f}, {load2_cpu:.2f} | {first * 1000:.0f} "
                  f"| {statistics.median(times):.1f} ({statistics.median(cpu):.1f}) |", flush=True)
            path.unlink()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
