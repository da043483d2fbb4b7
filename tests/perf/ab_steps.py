"""The Python engine of a git revision against the working tree's, in one process: the revision's `tinychat` package
is loaded beside this checkout's as `tinychat_old` (the package imports itself relatively, so the two do not mix;
each builds its own native kernels), both run the same model from the same checkpoint, and their decode steps and
prefills are called round by round, alternating which goes first, so a loaded host slows both alike. Medians of the
per-step times (decode: old and new steps interleaved one by one, alternating which goes first; prefill: per call),
new / old per variant (the median of the paired ratios), and the aten ops one step runs on each side.

    python tests/perf/ab_steps.py [--rev main] [--model assets] [--rounds 15] [--steps 64] [--threads 1]

Variants: the eager fp32 step (_decode_one), the static step (uncaptured, as on a CPU), the lean bf16 step, the
lean int8 step (native off), the native int8 step, and a 200-token prefill (append) fp32 and int8.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_old(rev: str, tmp: Path):
    dest = tmp / "old"
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev, "tinychat"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    (dest / "tinychat").rename(dest / "tinychat_old")
    sys.path.insert(0, str(dest))
    import tinychat_old
    return tinychat_old


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="main")
    ap.add_argument("--model", default=str(ROOT / "assets"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="variant names to run")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(a.threads)
    import tinychat
    assert tinychat.__file__.startswith(str(ROOT)), tinychat.__file__
    with tempfile.TemporaryDirectory() as t:
        old = load_old(a.rev, Path(t))
        import importlib
        pk = {"old": old, "new": tinychat}
        mods = {s: (importlib.import_module(p.__name__ + ".model"), importlib.import_module(p.__name__ + ".engine"),
                    importlib.import_module(p.__name__ + ".options")) for s, p in pk.items()}
        for side, pkg in pk.items():
            nat = importlib.import_module(pkg.__name__ + ".engine.native")
            print(f"{side}: {pkg.__file__}, kernels {nat.kernel_path()}")
        g = torch.Generator().manual_seed(1)
        V = mods["new"][0].load_config(a.model).vocab_size
        prompt = torch.randint(0, V, (1, 200), generator=g)
        toks = torch.randint(0, V, (a.steps,), generator=g).tolist()

        def setup(side, quant, graph=False, native=True):
            model_mod, engine, options_mod = mods[side]
            m = model_mod.TinyAgentLM.from_pretrained(a.model)
            opts = options_mod.EngineOptions(native=native, tune_threads=False)
            if quant != "none":
                engine.quantize_cpu(m, quant, options=opts)
            cache = engine.KVCache(m, 1, 200 + a.steps + 8, "cpu", dtype=torch.float32)
            dec = engine.Decoder(m, cache, graph=graph, options=opts)
            engine.append(m, cache, prompt, [200])
            mark = cache.mark()

            def reset():
                cache.truncate(mark)

            def one(tok):
                t0 = time.perf_counter()
                dec.step(tok)
                return time.perf_counter() - t0

            def prefill():
                c2 = engine.KVCache(m, 1, 256, "cpu", dtype=torch.float32)
                t0 = time.perf_counter()
                engine.append(m, c2, prompt, [200])
                return time.perf_counter() - t0
            return (reset, one), prefill, dec.mode

        def ops(reset_one):
            reset, one = reset_one
            reset()
            from torch.profiler import profile
            with profile() as prof:
                one(toks[0])
            return sum(e.count for e in prof.key_averages())

        variants = {"eager fp32": ("none", False, True, "decode"), "static fp32": ("none", "static", True, "decode"),
                    "lean bf16": ("bf16", False, True, "decode"), "lean int8": ("int8", False, False, "decode"),
                    "native int8": ("int8", False, True, "decode"), "prefill 200 fp32": ("none", False, True, "prefill"),
                    "prefill 200 int8": ("int8", False, True, "prefill")}
        print(f"{a.rounds} rounds, {a.steps} steps a round, {a.threads} thread(s); ms per step (prefill: per call)")
        for name, (quant, graph, native, what) in variants.items():
            if a.only and name not in a.only:
                continue
            fns, modes = {}, {}
            for side in ("old", "new"):
                d, p, modes[side] = setup(side, quant, graph, native)
                fns[side] = d if what == "decode" else p
            times, ratios = {"old": [], "new": []}, []
            if what == "decode":          # steps interleaved one by one: old, new, new, old, ...
                nops = {side: ops(fns[side]) for side in fns}
                for side in fns:
                    fns[side][0]()
                    fns[side][1](toks[0])                          # warm-up
                for r in range(a.rounds):
                    for side in fns:
                        fns[side][0]()
                    for i, tok in enumerate(toks):
                        order = ("old", "new") if (r + i) % 2 == 0 else ("new", "old")
                        dt = {side: fns[side][1](tok) for side in order}
                        for side in dt:
                            times[side].append(dt[side])
                        ratios.append(dt["new"] / dt["old"])
                extra = f"  ops/step {nops['old']} -> {nops['new']}"
            else:
                for f in fns.values():
                    f()                                          # warm-up
                for r in range(a.rounds):
                    order = ("old", "new") if r % 2 == 0 else ("new", "old")
                    dt = {side: fns[side]() for side in order}
                    for side in dt:
                        times[side].append(dt[side])
                    ratios.append(dt["new"] / dt["old"])
                extra = ""
            mo, mn = statistics.median(times["old"]) * 1e3, statistics.median(times["new"]) * 1e3
            print(f"{name:18s} ({modes['new']:9s}) old {mo:8.3f}  new {mn:8.3f}  new/old {statistics.median(ratios):.3f}"
                  f" (median of {len(ratios)} paired ratios){extra}", flush=True)

if __name__ == "__main__":
    main()
