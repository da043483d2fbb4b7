"""The app in a real terminal (tmux): keypress-to-screen latency while a reply is decoding, and the app's decode
speed next to the headless chat runtime's for the same model and settings.

    python tests/perf/app_perf.py [--size tiny|demo] [--quant none|int8] [--max-new 200] [--turns 3] [--keys 15]
                                [--latency-new 400]

- The model: random weights of the named size with the test tokenizer (tests/support.py), saved to a temp folder.
- Speed: each round runs one headless turn (loading.load_runtime + loading.open_chat, the app's own construction, a fresh
  session, greedy, the same prompt) with trace off and with trace on (the app traces while its inspector is shown:
  compare with `headless_trace_tok_s`; with --no-inspector, with `headless_tok_s`), then one turn in the app
  (Ctrl+N first: the same fresh context). Rounds interleave, so drift in machine load hits
  both sides alike. Rates come from each turn's recorded per-token times (session files), the same formula for
  both: (tokens - 1) / (time from the first to the last token). `spread` (decode time / (median step x tokens))
  separates stalls (a UI update holding the GIL) from the shared machine's run-to-run speed noise.
- Latency: during a long reply, type a character every ~0.2 s with `tmux send-keys` and poll `capture-pane` until
  the input line shows it (the poll itself costs a few ms, included). The same while idle, for reference.
Torch runs one thread on both sides (OMP_NUM_THREADS=1 / torch.set_num_threads(1)).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))       # this checkout's tinychat on both sides (a worktree measures itself)
PROMPT = "Hello! Tell me a long story about the river and the moon."


def sh(*args, check=True) -> str:
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout


SOCKET = "tinychat-perf"       # a private tmux server: never touches the user's own sessions


def tmux(*args, check=True) -> str:
    return sh("tmux", "-L", SOCKET, *args, check=check)


class Pane:
    def __init__(self, name: str, cmd: str, env: dict, width=160, height=45):
        self.name = name
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), f"env {envs} {cmd}")

    def text(self) -> str:
        return tmux("capture-pane", "-t", self.name, "-p")

    def keys(self, *keys: str, literal=False) -> None:
        tmux("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def wait(self, cond, timeout=120.0, poll=0.02, what="screen") -> str:
        t = time.monotonic()
        while True:
            s = self.text()
            if cond(s):
                return s
            if time.monotonic() - t > timeout:
                raise TimeoutError(f"waiting for {what}; screen:\n{s}")
            time.sleep(poll)

    def close(self) -> None:
        tmux("kill-session", "-t", self.name, check=False)


def input_line(screen: str) -> str:
    lines = screen.splitlines()
    hint = max(i for i, ln in enumerate(lines) if "Enter send" in ln or "— " in ln or "Tab completes" in ln)
    return lines[hint - 2]


def make_model(size: str, out: Path) -> None:
    import torch

    from support import make_chat_model, tokenizer
    from tinychat.model import TinyAgentLM, config_for
    tok = tokenizer()
    if size == "tiny":
        m = make_chat_model()
    else:
        torch.manual_seed(0)
        m = TinyAgentLM(config_for(size, vocab_size=tok.vocab_size)).eval()
        m.set_token_strings(tok.token_strings())
    m.save_pretrained(out)
    tok.save(out / "tokenizer.json")


def rate(timing_ms: list[float]) -> float:
    """Decode tok/s from a turn's per-token times (the first one is the time to the first token)."""
    return (len(timing_ms) - 1) / (sum(timing_ms[1:]) / 1000) if len(timing_ms) > 1 else 0.0


def spread(timing_ms: list[float]) -> float:
    """Total decode time over (median token time x tokens): 1.0 is a perfectly even decode; stalls (a UI update
    holding the GIL, the machine's other load) push it up. Robust to the run-to-run speed noise of a shared box."""
    t = timing_ms[1:]
    return sum(t) / (statistics.median(t) * len(t)) if len(t) > 1 else 1.0


def newest_session(home: Path):
    from tinychat.sessions import session as S
    infos = S.list_sessions(home / "sessions")
    return S.load(infos[0].id, home / "sessions") if infos else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="demo", choices=["tiny", "demo"])
    ap.add_argument("--quant", default="none", choices=["none", "int8", "bf16"])
    ap.add_argument("--max-new", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--keys", type=int, default=15)
    ap.add_argument("--latency-new", type=int, default=400, help="max-new of the reply typed over")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    ap.add_argument("--no-inspector", action="store_true",
                    help="hide the inspector (F3) first: the app then decodes without traces, like headless")
    a = ap.parse_args()
    if not shutil.which("tmux"):
        sys.exit("needs tmux")
    import torch
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="tinychat-perf-"))
    model_dir, home = tmp / "model", tmp / "home"
    make_model(a.size, model_dir)
    os.environ["TINYCHAT_HOME"] = str(tmp / "headless-home")

    from tinychat.chat.runtime import ChatSettings
    from tinychat.loading import load_runtime, open_chat
    rt = load_runtime(model_dir)
    settings = ChatSettings(temperature=0.0, max_new=a.max_new)

    counts: dict[str, list[int]] = {"headless": [], "app": []}
    spreads: dict[str, list[float]] = {"headless": [], "headless_trace": [], "app": []}
    steps: dict[str, list[float]] = {"headless": [], "headless_trace": [], "app": []}      # median step, ms

    def headless(trace: bool) -> float:
        chat = open_chat(rt, a.quant, "cpu", settings, {}, None)
        chat.send(PROMPT, trace=trace)
        counts["headless"].append(len(chat.session.messages[-1].timing_ms))
        timing = chat.session.messages[-1].timing_ms
        spreads["headless_trace" if trace else "headless"].append(spread(timing))
        steps["headless_trace" if trace else "headless"].append(statistics.median(timing[1:]))
        return rate(chat.session.messages[-1].timing_ms)

    cmd = f"{sys.executable} -m tinychat --model {model_dir} --temperature 0 " \
          f"--max-new {a.max_new} --quant {a.quant} --device cpu"
    env = {"OMP_NUM_THREADS": "1", "TINYCHAT_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.update({k: v for k, v in os.environ.items() if k.startswith("TINYCHAT_UI_")})    # UI knobs to compare
    pane = Pane(f"tinychat-perf-{os.getpid()}", cmd, env)
    out: dict = {"size": a.size, "quant": a.quant, "max_new": a.max_new, "threads": 1,
                 "inspector": not a.no_inspector,
                 **{k: v for k, v in env.items() if k.startswith("TINYCHAT_UI_")}}
    try:
        pane.wait(lambda s: "autosave on" in s, what="the app to load")
        if a.no_inspector:
            pane.keys("F3")
        headless(False)                                   # warm-up, both sides
        pane.keys(PROMPT, literal=True)
        pane.keys("Enter")
        pane.wait(lambda s: "tok/s · TTFT" in s, what="the warm-up reply")
        h_plain, h_trace, app = [], [], []
        for _ in range(a.turns):
            h_plain.append(headless(False))
            h_trace.append(headless(True))
            pane.keys("C-n")
            pane.wait(lambda s: "tok/s · TTFT" not in s, what="a new chat")
            time.sleep(0.3)
            pane.keys(PROMPT, literal=True)
            pane.keys("Enter")
            # a slow poll: each capture-pane is a process, and on a 2-vCPU machine 50 a second take CPU from the
            # decode (the rate comes from the session's per-token times, not from this wait)
            pane.wait(lambda s: "tok/s · TTFT" in s, poll=0.5, what="the reply")
            time.sleep(0.3)                               # autosave
            timing = newest_session(home).messages[-1].timing_ms
            counts["app"].append(len(timing))
            spreads["app"].append(spread(timing))
            steps["app"].append(statistics.median(timing[1:]))
            app.append(rate(timing))
        med = statistics.median
        out.update(headless_tok_s=round(med(h_plain), 1), headless_trace_tok_s=round(med(h_trace), 1),
                   app_tok_s=round(med(app), 1), app_runs=[round(x, 1) for x in app],
                   headless_runs=[round(x, 1) for x in h_plain], headless_trace_runs=[round(x, 1) for x in h_trace])
        out["tokens_per_turn"] = {k: sorted(set(v)) for k, v in counts.items()}
        out["spread"] = {k: round(med(v), 3) for k, v in spreads.items()}     # decode time / (median step x n)
        out["median_step_ms"] = {k: round(med(v), 3) for k, v in steps.items()}  # the decode's pace without stalls
        out["ratio_vs_headless"] = round(out["app_tok_s"] / out["headless_tok_s"], 3)
        out["ratio_vs_headless_traced"] = round(out["app_tok_s"] / out["headless_trace_tok_s"], 3)
        # per round (the app's turn over the same round's headless turn, back to back): the machine's speed drifts
        # over seconds on a shared box, and a ratio within one round is the less exposed to it
        ref = h_plain if a.no_inspector else h_trace
        out["ratio_per_round"] = [round(x / y, 3) for x, y in zip(app, ref)]
        out["ratio_per_round_median"] = round(med(out["ratio_per_round"]), 3)

        def latencies(decoding: bool) -> list[float]:
            """Keys typed into the input: while idle, or while replies decode (as many replies as it takes: the
            random-weight model sometimes ends a reply early)."""
            lat: list[float] = []
            for _ in range(8 if decoding else 1):
                pane.keys("C-n")
                pane.wait(lambda s: "tok/s · TTFT" not in s, what="a new chat")
                time.sleep(0.3)                           # keys typed while the new chat mounts can be lost
                if decoding:
                    pane.keys(f"/set max-new {a.latency_new}", literal=True)
                    pane.keys("Enter")
                    time.sleep(0.5)
                    pane.keys(PROMPT, literal=True)
                    pane.keys("Enter")
                    pane.wait(lambda s: "generating" in s, what="decoding to start")
                    time.sleep(0.3)
                while len(lat) < a.keys:
                    before = input_line(pane.text()).count("x")
                    t = time.perf_counter()
                    pane.keys("x", literal=True)
                    pane.wait(lambda s: input_line(s).count("x") > before, timeout=10, poll=0.002, what="the key")
                    ms = (time.perf_counter() - t) * 1000
                    if decoding and re.search(r"\d+ tokens · \d+ tok/s · TTFT", pane.text()):
                        break                             # the reply's footer: it ended; count keys while decoding
                    lat.append(ms)
                    time.sleep(0.2)
                pane.keys("Escape")
                pane.keys("C-u")
                if len(lat) >= a.keys:
                    break
            return lat

        for name, decoding in (("idle", False), ("decoding", True)):
            lat = latencies(decoding)
            out[f"latency_{name}_ms"] = {"n": len(lat), "median": round(med(lat), 1),
                                         "p95": round(sorted(lat)[max(0, int(len(lat) * 0.95) - 1)], 1),
                                         "max": round(max(lat), 1)}
        pane.keys("C-q")
        time.sleep(1)
    finally:
        pane.close()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
