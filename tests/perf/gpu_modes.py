"""The full config on a CUDA GPU in the Decoder's four modes, one prepared run: eager (graph=False), static
(uncaptured device loop), graph (CUDA graph) and graph + torch.compile. Decode tok/s (batch 1) and TTFT, medians.
For a session that has a GPU machine; prints one Markdown table and one JSON line per mode.

    python tests/perf/gpu_modes.py [--config full] [--quant none|bf16] [--gen-len 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from tinychat.bench import run_bench

MODES = {"eager": dict(graph=False), "static": dict(graph="static"), "graph": dict(graph=True),
         "graph+compile": dict(graph=True, compile=True)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="full")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    name = torch.cuda.get_device_name()
    rows = []
    for m in a.modes:
        t = time.time()
        try:
            r = run_bench(config=a.config, quant=a.quant, device="cuda", prompt_len=a.prompt_len,
                          gen_len=a.gen_len, repeats=a.repeats, **MODES[m])
        except Exception as e:  # noqa: BLE001  one mode failing must not lose the others
            print(json.dumps({"mode": m, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
            continue
        r["bench_mode"], r["wall_s"], r["gpu"] = m, time.time() - t, name
        print(json.dumps(r), flush=True)
        rows.append(r)
    print(f"\n{a.config} {a.quant} on {name}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}\n")
    print("| mode | Decoder.mode | decode tok/s | TTFT ms | prefill tok/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bench_mode']} | {r['mode']} | {r['decode_tok_s']:,.0f} | {r['ttft_ms']:.1f} | "
              f"{r['prefill_tok_s']:,.0f} |")


if __name__ == "__main__":
    main()
