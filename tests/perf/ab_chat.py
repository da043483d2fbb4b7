"""Chat turns of a git revision against the working tree's, in one process (as ab_steps.py does for the engine's
steps): the revision's `tinychat` package is loaded beside this checkout's as `tinychat_old`, each side opens a Chat
on the shipped model (int8, then fp32) with the same settings and seed, and their turns alternate round by round
(which side goes first alternates too), so a loaded host slows both alike. Prints per quant mode the medians of the
turn's wall time, decode tok/s and the per-token times the sessions record, the paired new/old wall ratio, and
whether every reply was token-identical.

    python tests/perf/ab_chat.py [--rev main] [--rounds 30] [--max-new 48]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["hello there", "what is a cat?", "tell me a short story about a dog", "why is the sky blue?"]


def load_old(rev: str, tmp: Path):
    dest = tmp / "old"
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev, "tinychat"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    (dest / "tinychat").rename(dest / "tinychat_old")
    sys.path.insert(0, str(dest))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="main")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--max-new", type=int, default=48)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    load_old(a.rev, Path(tempfile.mkdtemp()))
    import torch
    torch.set_num_threads(1)
    model_dir = ROOT / "tinychat" / "assets"
    for quant in ("int8", "none"):
        chats = {}
        for side, pkg in (("old", "tinychat_old"), ("new", "tinychat")):
            loading, runtime = import_module(f"{pkg}.loading"), import_module(f"{pkg}.chat.runtime")
            options = import_module(f"{pkg}.options").EngineOptions(tune_threads=False)
            rt = loading.load_runtime(model_dir, quant)
            chats[side] = runtime.Chat(rt.model, rt.tokenizer, runtime.ChatSettings(max_new=a.max_new, seed=7),
                                       quant=quant, autosave=False, options=options)
        wall, rate, per_token = ({"old": [], "new": []} for _ in range(3))
        same = True
        for r in range(a.rounds):
            outs = {}
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                chat = chats[side]
                if chat.session.n_turns >= 3:
                    chat.new_session()
                t = time.perf_counter()
                res = chat.send(PROMPTS[r % len(PROMPTS)])
                wall[side].append(time.perf_counter() - t)
                rate[side].append(res.decode_tok_s)
                per_token[side].extend((chat.session.messages[-1].timing_ms or [])[1:])
                outs[side] = res.token_ids
            same &= outs["old"] == outs["new"]
        med = statistics.median
        print(f"{quant:4}: turn ms old {med(wall['old']) * 1000:.1f} new {med(wall['new']) * 1000:.1f} | decode tok/s "
              f"old {med(rate['old']):.1f} new {med(rate['new']):.1f} | per-token ms old {med(per_token['old']):.3f} "
              f"new {med(per_token['new']):.3f} | new/old wall {med(n / o for n, o in zip(wall['new'], wall['old'])):.3f}"
              f" | token-identical {same}")


if __name__ == "__main__":
    main()
