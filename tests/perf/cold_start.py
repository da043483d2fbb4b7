"""Cold start: how long `tinychat` takes to answer, and where the time goes.

    python tests/perf/cold_start.py times [--trees A B] [--rounds 5] [--only NAME ...] [--model NAME]
    python tests/perf/cold_start.py timeline [--tree A] -- ARGS...        e.g. -- -p hi --max-new 8 --quant int8
    python tests/perf/cold_start.py app [--trees A B] [--rounds 5]

- times: each command (`--help`, `sessions`, `models`, one-shots `-p hi --max-new 8` on the shipped model at
  --quant auto / int8 / int4, and on --model NAME at int4 when given) in a fresh process, the trees (checkouts: the
  PYTHONPATH each runs with; default: this one) alternated round by round, a warm-up round first (page cache, kernel
  and identity caches); medians of wall, user and system CPU seconds (os.wait4: the child's own), one JSON line per
  command and tree, then a table.
- timeline: one run of `tinychat ARGS` in this process with a post-import hook that times the imports of torch,
  textual, tokenizers, safetensors and the phases of a one-shot (model load, identity, kernel load, plan/quantize,
  tokenizer, prefill and the first token, the reply) as offsets from the process's start (/proc/self/stat).
- app: the app in a headless Textual run (App.run_test) in a fresh process, after importing tinychat.cli as
  `tinychat` does: seconds from the process's start until the input has focus (and the process's CPU seconds by
  then), until two keys posted as the terminal driver posts them are in it, until the model is loaded, and until a
  message sent (Enter) before the load finished is answered; medians per tree. --no-load: the window alone (the
  load not started), its CPU seconds to the first paint.
For the importtime tree: `python -X importtime -m tinychat -p hi 2> imp.txt` then `sort -t'|' -k2 -n imp.txt | tail`.
Timings on a shared machine are noisy: compare trees side by side in one run, never figures from separate runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = {
    "help": ["--help"],
    "sessions": ["sessions"],
    "models": ["models"],
    "p-auto": ["-p", "hi", "--max-new", "8", "--no-save"],
    "p-int8": ["-p", "hi", "--max-new", "8", "--no-save", "--quant", "int8"],
    "p-int4": ["-p", "hi", "--max-new", "8", "--no-save", "--quant", "int4"],
}


def run_once(tree: str, args: list[str]) -> tuple[float, float, float, int]:
    """(wall, user, sys, rc) of `python -m tinychat ARGS` with PYTHONPATH=tree."""
    env = {**os.environ, "PYTHONPATH": tree}
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tinychat", *args], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        print(f"{tree} {' '.join(args)}: exit {rc}: {err.strip()[-300:]}", file=sys.stderr)
    return wall, ru.ru_utime, ru.ru_stime, rc


def times(a) -> None:
    cmds = {k: v for k, v in COMMANDS.items() if not a.only or k in a.only}
    if a.model:
        cmds[f"p-int4-{a.model}"] = ["-m", a.model, *COMMANDS["p-int4"]]
        cmds[f"p-int8-{a.model}"] = ["-m", a.model, *COMMANDS["p-int8"]]
        cmds = {k: v for k, v in cmds.items() if not a.only or k in a.only or k.startswith(tuple(a.only))}
    res = {(k, t): [] for k in cmds for t in a.trees}
    for r in range(a.rounds + 1):               # round 0: the warm-up
        for k, args in cmds.items():
            order = a.trees if r % 2 == 0 else a.trees[::-1]
            for t in order:
                m = run_once(t, args)
                if r > 0:
                    res[(k, t)].append(m)
    rows = []
    for (k, t), ms in res.items():
        med = [statistics.median(x[i] for x in ms) for i in range(3)]
        row = {"cmd": k, "tree": t, "wall": round(med[0], 3), "user": round(med[1], 3), "sys": round(med[2], 3),
               "walls": [round(x[0], 3) for x in ms], "rc": sorted({x[3] for x in ms})}
        rows.append(row)
        print(json.dumps(row))
    print(f"\n| command | {' | '.join(Path(t).name for t in a.trees)} |\n|---|" + "---|" * len(a.trees))
    for k in cmds:
        cells = [next(r for r in rows if r["cmd"] == k and r["tree"] == t) for t in a.trees]
        print(f"| `{' '.join(cmds[k])}` | " + " | ".join(f"{c['wall']:.2f} s ({c['user']:.2f} u + {c['sys']:.2f} s)"
                                                          for c in cells) + " |")


TIMELINE = r'''
import importlib.abc, importlib.machinery, os, sys, time
CLK = os.sysconf("SC_CLK_TCK")
with open("/proc/self/stat") as f:
    start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    up = float(f.read().split()[0])
T0 = time.perf_counter() - (up - start_ticks / CLK)     # perf_counter at the process's start (10 ms ticks)
events = []
def mark(what, t0, t1=None):
    events.append((t0 - T0, (t1 or time.perf_counter()) - T0, what))
WATCH = {"torch", "textual", "tokenizers", "safetensors", "numpy", "typer", "rich", "tinychat.cli", "tinychat.tui.app",
         "huggingface_hub", "platformdirs", "click"}
PATCH = {
    "tinychat.loading": ["load_runtime", "resolve_quant", "hold_model"],
    "tinychat.model": ["TinyAgentLM.from_pretrained"],
    "tinychat.tokenizer": ["Tokenizer.from_file"],
    "tinychat.identity": ["cached_identity", "model_identity"],
    "tinychat.engine.native": ["load"],
    "tinychat.plan": ["decide"],
    "tinychat.engine": ["quantize_cpu"],
    "tinychat.chat.runtime": ["Chat.__init__", "Chat.send"],
    "tinychat.engine.append": ["append", "append_chunked"],
    "tinychat.engine.decoder": ["Decoder.generate"],
}
def wrap(mod, dotted):
    owner, _, name = dotted.rpartition(".")
    obj = getattr(mod, owner) if owner else mod
    f = obj.__dict__[name] if owner else getattr(mod, name)
    if isinstance(f, classmethod):
        g = f.__func__
        def w(*a, **k):
            t = time.perf_counter()
            try:
                return g(*a, **k)
            finally:
                mark(dotted, t)
        setattr(obj, name, classmethod(w))
        return
    def w(*a, **k):
        if dotted == "Chat.send" and k.get("on_token") is not None:
            tok, first = k["on_token"], []
            def on_token(*x, **y):
                if not first:
                    first.append(1); mark("first token", t, time.perf_counter())
                return tok(*x, **y)
            k["on_token"] = on_token
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            mark(dotted, t)
    setattr(obj, name, w)
class Hook(importlib.abc.MetaPathFinder):
    busy = set()
    def find_spec(self, name, path=None, target=None):
        if name not in WATCH and name not in PATCH or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        real = spec.loader.exec_module
        def exec_module(module, real=real, name=name):
            t = time.perf_counter()
            real(module)
            if name in WATCH:
                mark("import " + name, t)
            for d in PATCH.get(name, ()):
                wrap(module, d)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
t_main = time.perf_counter()
sys.argv = ["tinychat", *ARGS]
import io
try:
    from tinychat.cli import main
    main()
except SystemExit:
    pass
mark("main (all)", t_main)
for a, b, what in sorted(events):
    print(f"{a:8.3f} {b:8.3f} {b - a:8.3f}  {what}", file=sys.__stderr__)
'''


def timeline(a) -> None:
    env = {**os.environ, "PYTHONPATH": a.tree}
    code = "ARGS = " + repr(a.args) + "\n" + TIMELINE
    print("   start      end     secs  what  (seconds from the process's start)")
    subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)


APP = r'''
import os, sys, time
CLK = os.sysconf("SC_CLK_TCK")
with open("/proc/self/stat") as f:
    start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    up = float(f.read().split()[0])
T0 = time.perf_counter() - (up - start_ticks / CLK)
import asyncio
import tinychat.cli                                  # what `tinychat` imports before it hands over to the app
from tinychat.tui.app import TinyChatApp
from tinychat.tui.runtime import Backend
out = {}
mount = TinyChatApp.on_mount
def on_mount(self):                 # the first paint after mount (the input focused in on_mount): registered before
    def painted():                  # the app's own after-refresh work (the load), so it is timed before it
        out["usable"] = time.perf_counter() - T0
        out["usable_cpu"] = time.process_time()     # the process's CPU seconds so far (all threads)
    self.call_after_refresh(painted)
    mount(self)
TinyChatApp.on_mount = on_mount
async def main():
    app = TinyChatApp(Backend(MODEL, QUANT, "auto", None, {}, None, None, autosave=False))
    if NO_LOAD:                                     # the window's own cost: no model load competing for the GIL
        app.controller.load = lambda: None
    async with app.run_test(headless=True, size=(120, 40)) as pilot:
        while "usable" not in out:
            await asyncio.sleep(0.002)
        from textual import events
        for ch in "hi":                # as the terminal's driver posts them (Pilot.press waits for a process idle
            app.post_message(events.Key(ch, ch))        # of CPU, up to 1 s a key, while the model loads)
        while "hi" not in app.prompt.text:
            await asyncio.sleep(0.002)
        painted = asyncio.Event()
        app.call_after_refresh(painted.set)
        await painted.wait()
        out["typed"] = time.perf_counter() - T0         # the keys are in the input, on screen
        if NO_LOAD:
            return
        app.post_message(events.Key("enter", "\r"))   # before the model is loaded: queued, sent once it is
        await asyncio.sleep(0.05)
        out["queued_before_load"] = app.chat is None
        while app.chat is None:
            await asyncio.sleep(0.01)
        out["loaded"] = time.perf_counter() - T0
        while app.busy is not None or not any(m.role == "assistant" for m in app.chat.session.messages):
            await asyncio.sleep(0.01)
        out["replied"] = time.perf_counter() - T0
asyncio.run(main())
print(repr(out))
'''


def app_times(a) -> None:
    res: dict = {t: [] for t in a.trees}
    for r in range(a.rounds + 1):
        for t in (a.trees if r % 2 == 0 else a.trees[::-1]):
            code = f"MODEL = {a.model!r}\nQUANT = {a.quant!r}\nNO_LOAD = {a.no_load!r}\n" + APP
            p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": t},
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                print(t, p.stderr[-800:], file=sys.stderr)
                continue
            if r > 0:
                res[t].append(eval(p.stdout.strip().splitlines()[-1]))   # noqa: S307  our own repr
    for t, ms in res.items():
        keys = ("usable", "usable_cpu", "typed") + (() if a.no_load else ("loaded", "replied"))
        med = {k: round(statistics.median(m[k] for m in ms), 3) for k in keys} if ms else {}
        print(json.dumps({"tree": t, **med, "usable_all": [round(m["usable"], 3) for m in ms],
                          "typed_all": [round(m["typed"], 3) for m in ms],
                          "queued": [m.get("queued_before_load") for m in ms]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("times")
    t.add_argument("--trees", nargs="+", default=[str(ROOT)])
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--only", nargs="*")
    t.add_argument("--model")
    tl = sub.add_parser("timeline")
    tl.add_argument("--tree", default=str(ROOT))
    tl.add_argument("args", nargs=argparse.REMAINDER)
    ap_ = sub.add_parser("app")
    ap_.add_argument("--trees", nargs="+", default=[str(ROOT)])
    ap_.add_argument("--rounds", type=int, default=5)
    ap_.add_argument("--model")
    ap_.add_argument("--quant", default="auto")
    ap_.add_argument("--no-load", action="store_true", help="the window alone: the model's load is not started")
    a = ap.parse_args()
    if a.what == "timeline":
        a.args = [x for x in a.args if x != "--"]
        timeline(a)
    elif a.what == "app":
        app_times(a)
    else:
        times(a)


if __name__ == "__main__":
    main()
