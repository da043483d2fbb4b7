"""llama.cpp (Q8_0 SmolLM2-135M, tests/perf/llama_cpp_peer.py) and `tinychat bench` (random-weight configs) measured
side by side in one run: every round runs each engine once, in fresh processes, one after the other, so machine noise
hits them alike; the table gives medians over rounds and tinychat / llama.cpp ratios.

    python tests/perf/llama_cpp_peer.py setup            # once (~8-15 min build)
    python tests/perf/side_by_side.py [--threads 1 2] [--rounds 3] [--long-ctx 1500] [--before] [--extra]

--smollm2 MODEL_DIR adds tinychat on SmolLM2-135M's own weights (`tinychat import` of the GGUF the peer quantizes).
--long-ctx N (default 1500; 0: off) adds decode after an N-token prompt (same gen-len), a separate run per engine.

--before adds tinychat as it was before the speed work (TINYCHAT_NATIVE=0, fp32 prefill GEMMs): same process
setup, same rounds. --extra adds full bf16 / fp32 and demo int8 rows. Results also go to runs/perf/side_by_side.json.
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
PEER = ROOT / "tests" / "perf" / "llama_cpp_peer.py"
OUT = ROOT / "runs" / "perf"

TC = """
import json, sys
from tinychat.bench import run_bench
from tinychat.options import EngineOptions
opts = EngineOptions(prefill_bf16=False) if {before} else None
r = run_bench(model_path={model_path!r}, config={config!r}, quant={quant!r}, prompt_len={prompt_len}, gen_len={gen_len}, repeats=1, warmup=1,
              threads={threads}, prefill_lens={prefill!r}, options=opts)
print(json.dumps(r))
"""


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[:3]))}... failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def llama(a, threads):
    r = run_json([sys.executable, str(PEER), "measure", "--threads", str(threads), "--prompt-len", str(a.prompt_len),
                  "--gen-len", str(a.gen_len), "--repeats", "1", "--prefill", *map(str, a.prefill)])
    out = {"decode": r["decode_tok_s"], **{f"prefill {n}": r[f"prefill_{n}_tok_s"] for n in a.prefill},
           "_info": {k: r.get(k) for k in ("llama_cpp_python", "model", "n_params", "extra_bufts")}}
    if a.long_ctx:
        r = run_json([sys.executable, str(PEER), "measure", "--threads", str(threads), "--prompt-len",
                      str(a.long_ctx), "--gen-len", str(a.gen_len), "--repeats", "1", "--prefill"])
        out[f"decode @{a.long_ctx}"] = r["decode_tok_s"]
    return out


def tinychat(a, threads, config, quant, before, model_path=None):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if before:
        env["TINYCHAT_NATIVE"] = "0"
    code = TC.format(before=before, config=config, quant=quant, prompt_len=a.prompt_len, gen_len=a.gen_len,
                     threads=threads, prefill=tuple(a.prefill), model_path=model_path)
    r = run_json([sys.executable, "-c", code], env=env)
    out = {"decode": r["decode_tok_s"], **{f"prefill {n}": r["prefill_by_len"][str(n)] for n in a.prefill},
           "_info": {k: r.get(k) for k in ("mode", "native", "int8_kernels", "linear_params", "peak_rss_mb",
                                            "quant")}}
    if a.long_ctx:
        code = TC.format(before=before, config=config, quant=quant, prompt_len=a.long_ctx, gen_len=a.gen_len,
                         threads=threads, prefill=(), model_path=model_path)
        out[f"decode @{a.long_ctx}"] = run_json([sys.executable, "-c", code], env=env)["decode_tok_s"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--prefill", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--before", action="store_true")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--long-ctx", type=int, default=1500)
    ap.add_argument("--smollm2", type=Path, default=None, metavar="MODEL_DIR",
                    help="add a row of tinychat on SmolLM2-135M's own weights (a `tinychat import` of the same GGUF)")
    a = ap.parse_args()
    rows = [("llama.cpp Q8_0 SmolLM2-135M", lambda t: llama(a, t))]
    if a.smollm2:
        rows.append(("tinychat int8 SmolLM2-135M (same weights)",
                     lambda t: tinychat(a, t, None, "int8", False, str(a.smollm2))))
    rows.append(("tinychat full int8", lambda t: tinychat(a, t, "full", "int8", False)))
    if a.before:
        rows.append(("tinychat full int8 (before)", lambda t: tinychat(a, t, "full", "int8", True)))
    if a.extra:
        rows += [("tinychat full bf16", lambda t: tinychat(a, t, "full", "bf16", False)),
                 ("tinychat full fp32", lambda t: tinychat(a, t, "full", "none", False)),
                 ("tinychat demo int8", lambda t: tinychat(a, t, "demo", "int8", False))]
        if a.before:
            rows += [("tinychat full bf16 (before)", lambda t: tinychat(a, t, "full", "bf16", True)),
                     ("tinychat demo int8 (before)", lambda t: tinychat(a, t, "demo", "int8", True))]
    metrics = ["decode", *([f"decode @{a.long_ctx}"] if a.long_ctx else []), *[f"prefill {n}" for n in a.prefill]]
    results = {}
    t0 = time.time()
    for t in a.threads:
        for r in range(a.rounds):
            for name, fn in rows:
                res = fn(t)
                d = results.setdefault((t, name), {m: [] for m in metrics})
                d["_info"] = res["_info"]
                for m in metrics:
                    d[m].append(res[m])
                print(f"[{time.time() - t0:5.0f}s] threads {t} round {r + 1}: {name}: "
                      + ", ".join(f"{m} {res[m]:.1f}" for m in metrics), file=sys.stderr, flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    print(f"\n{cpu}, {os.cpu_count()} CPUs; python {' '.join(sys.argv)}")
    print(f"side by side, medians of {a.rounds} rounds (tok/s; decode after a {a.prompt_len}-token prompt, "
          f"{a.gen_len} tokens; ratio = tinychat / llama.cpp)\n")
    head = f"| threads | engine | {' | '.join(metrics)} |"
    print(head)
    print("|" + "---|" * (2 + len(metrics)))
    table = []
    for t in a.threads:
        base = {m: statistics.median(results[(t, rows[0][0])][m]) for m in metrics}
        for name, _ in rows:
            med = {m: statistics.median(results[(t, name)][m]) for m in metrics}
            cells = [f"{med[m]:,.1f}" + ("" if name == rows[0][0] else f" ({med[m] / base[m]:.2f}x)")
                     for m in metrics]
            print(f"| {t} | {name} | {' | '.join(cells)} |")
            table.append({"threads": t, "engine": name, **med, "info": results[(t, name)]["_info"],
                          "all": {m: results[(t, name)][m] for m in metrics}})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "side_by_side.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "rows": table},
                                                      indent=1))


if __name__ == "__main__":
    main()
