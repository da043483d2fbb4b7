"""`tinychat serve` against llama-cpp-python's OpenAI server on the same weights (not a test: the test run skips
tests/perf).

    python tests/perf/llama_cpp_peer.py setup                  # once: the peer venv and the Q8_0 GGUF (~8 min)
    runs/perf/llama-venv/bin/pip install 'llama-cpp-python[server]==0.3.36'   # its server's own dependencies
    python tests/perf/serve_peer.py [--threads 1] [--rounds 3] [--tokens 128] [--json]

Both servers serve SmolLM2-135M-Instruct from the one Q8_0 GGUF the peer script wrote (tinychat imports it and runs
`--quant int8`), each in its own process with the same thread count, and stay up while the other is measured; the
rounds alternate. The client (this process) asks each the same greedy requests over HTTP:
- streamed decode tok/s at the client: completion tokens after the first content chunk over the time from it to the
  last chunk, a 30-token question, up to --tokens;
- time to first content chunk of a ~600-token message (a new conversation: one prefill each);
- total tok/s of four clients at once.
Medians over rounds; the ratio is tinychat / llama-cpp-python (> 1: tinychat faster)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("TINYCHAT_PERF_DIR", ROOT / "runs" / "perf"))
PEER_PY = WORK / "llama-venv" / "bin" / "python"
GGUF = WORK / "SmolLM2-135M-Instruct.Q8_0.gguf"
QUESTION = "Write a long, detailed story about a lighthouse keeper, the sea and a storm."
LONG = ("The keeper climbed the stairs at dusk, trimmed the wick, and wrote the weather in the log before the ships "
        "came round the point. ") * 22 + "Summarise what the keeper did."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}) before it answered {url}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}: no answer in {timeout:.0f} s")


def stream(base: str, model: str, text: str, max_tokens: int) -> dict:
    """One streamed greedy request: tokens, time to the first content chunk, decode rate after it."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "seed": 1}
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    usage = None
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            for c in d.get("choices") or []:
                if (c.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
    n = usage["completion_tokens"] if usage else chunks
    rate = (n - 1) / (last - first) if first and last and last > first and n > 1 else float("nan")
    return {"tokens": n, "ttft_ms": 1000 * ((first or t0) - t0), "tok_s": rate}


def four(base: str, model: str, max_tokens: int) -> float:
    out: list[dict] = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda: out.append(stream(base, model, QUESTION, max_tokens)))
               for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(r["tokens"] for r in out) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not PEER_PY.exists() or not GGUF.exists():
        raise SystemExit("no peer: run `python tests/perf/llama_cpp_peer.py setup` first")
    home = Path(tempfile.mkdtemp(prefix="tc-serve-peer-"))
    env = {**os.environ, "TINYCHAT_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "tinychat", "import", str(GGUF), "--name", "smollm2-q8"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    tp, lp = free_port(), free_port()
    tc = subprocess.Popen([sys.executable, "-m", "tinychat", "serve", "-m", "smollm2-q8", "--quant", "int8",
                           "--threads", str(args.threads), "--port", str(tp), "--max-queue", "8"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lc = subprocess.Popen([str(PEER_PY), "-m", "llama_cpp.server", "--model", str(GGUF), "--n_threads",
                           str(args.threads), "--n_ctx", "2048", "--port", str(lp), "--host", "127.0.0.1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sides = {"tinychat": (f"http://127.0.0.1:{tp}", "smollm2-q8"),
             "llama-cpp-python": (f"http://127.0.0.1:{lp}", str(GGUF))}
    try:
        for name, (base, _) in sides.items():
            wait_up(f"{base}/v1/models", tc if name == "tinychat" else lc)
        for name, (base, model) in sides.items():          # warm-up: first requests, page cache
            stream(base, model, "Hi!", 8)
        res: dict = {n: {"tok_s": [], "ttft_ms": [], "four_tok_s": [], "tokens": []} for n in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                base, model = sides[name]
                one = stream(base, model, QUESTION, args.tokens)
                long_ = stream(base, model, LONG, 16)
                res[name]["tok_s"].append(one["tok_s"])
                res[name]["tokens"].append(one["tokens"])
                res[name]["ttft_ms"].append(long_["ttft_ms"])
                res[name]["four_tok_s"].append(four(base, model, args.tokens))
    finally:
        for p in (tc, lc):
            p.terminate()
        for p in (tc, lc):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    a, b = med["tinychat"], med["llama-cpp-python"]
    out = {"threads": args.threads, "rounds": args.rounds, "max_tokens": args.tokens, "medians": med,
           "per_round": res,
           "ratio": {"decode": a["tok_s"] / b["tok_s"], "ttft_600": b["ttft_ms"] / a["ttft_ms"],
                     "four_clients": a["four_tok_s"] / b["four_tok_s"]}}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for n, m in med.items():
            print(f"{n:18s} decode {m['tok_s']:7.1f} tok/s  ttft(600 tok) {m['ttft_ms']:6.0f} ms  "
                  f"4 clients {m['four_tok_s']:7.1f} tok/s  ({m['tokens']:.0f} tokens)")
        print("ratios tinychat / llama-cpp-python:", {k: round(v, 2) for k, v in out["ratio"].items()})


if __name__ == "__main__":
    main()
