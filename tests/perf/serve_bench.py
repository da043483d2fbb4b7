"""`tinychat serve` against the headless runtime, on the shipped model (not a test: the test run skips tests/perf).

    python tests/perf/serve_bench.py [--quant auto] [--rounds 3] [--tokens 200] [--json]

Figures (medians over alternated rounds; the server and each headless run are processes of their own, one
decoding at a time; the client runs in this process):
- decode tok/s of five streamed turns of one conversation through the server (each request extends the last, so the
  cache is kept; measured at the client: tokens after each turn's first chunk over the time from its first to its
  last chunk; and the server's own figure for the same turns) against the same turns headless (`tinychat --plain
  --json`, five input lines, in its own process: same seed, same tokens, checked);
- time to first token (client side, streamed) of a turn whose ~1,000-token conversation the server holds in its
  cache, against the same request after the server served another conversation (the cache rebuilt by the restore
  rule: a prefill per turn and a step per reply token) and against one new 1,000-token message (one prefill);
- total tok/s with one client and with four at once (one decoder: the queue serves them in turn)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Tell me a long story about a lighthouse keeper and the sea."
QUESTIONS = [PROMPT, "What did he see one night?", "Who came to visit him?", "How did the story end?",
             "Tell it again from the sea's side."]
SENTENCE = ("The keeper climbed the stairs at dusk, trimmed the wick, and wrote the weather in the log before the "
            "ships came round the point. ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(base: str, messages: list, max_tokens: int, seed: int = 1, extra: dict | None = None) -> dict:
    """One streamed request: ttft (s, to the first content), client tok/s, the server's own figures."""
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first = last = None
    usage = ext = None
    text = []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            if obj.get("tinychat"):
                ext = obj["tinychat"]
            if obj["choices"] and obj["choices"][0]["delta"].get("content"):
                text.append(obj["choices"][0]["delta"]["content"])
                now = time.perf_counter()
                first = first or now
                last = now
    n = usage["completion_tokens"]
    rate = (n - 1) / (last - first) if first and last and last > first else 0.0
    return {"ttft_s": (first or time.perf_counter()) - t0, "tok_s": rate, "n": n, "server_tok_s": ext["decode_tok_s"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"], "prompt": usage["prompt_tokens"],
            "wall_s": (last or t0) - t0, "text": "".join(text)}


def headless(mode: str, max_tokens: int, threads: list[str], seed: int = 1) -> list[dict]:
    """The same turns headless: `tinychat --plain --json` in its own process (as the server runs in its own), one
    input line per turn, the seed fixed for every turn."""
    out = subprocess.run([sys.executable, "-m", "tinychat", "--plain", "--seed", str(seed), "--max-new",
                          str(max_tokens), "--quant", mode, "--no-save", "--json", "--no-ban", "--parrot", *threads],
                         input="\n".join(QUESTIONS) + "\n", cwd=ROOT, capture_output=True, text=True, timeout=600,
                         check=True)
    return [{"tok_s": d["decode_tok_s"], "n": d["n_tokens"], "text": d["text"]}
            for d in map(json.loads, out.stdout.splitlines())]


def served(base: str, max_tokens: int, extra: dict, seed: int = 1) -> list[dict]:
    """The same turns through the server, streamed, each request extending the conversation (the cache kept)."""
    msgs, outs = [], []
    for q in QUESTIONS:
        msgs.append({"role": "user", "content": q})
        o = stream(base, msgs, max_tokens, seed=seed, extra=extra)
        msgs.append({"role": "assistant", "content": o["text"]})
        outs.append(o)
    return outs


def rate(turns: list[dict], key: str = "tok_s") -> float:
    """Tokens over decode time, summed over turns (each turn's rate counts its n - 1 tokens after the first)."""
    toks = sum(t["n"] - 1 for t in turns if t[key] > 0)
    return toks / sum((t["n"] - 1) / t[key] for t in turns if t[key] > 0)


def conversation(tok, target: int) -> list:
    """A system prompt and client-written turns of about `target` tokens, ending with a user message."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    n, i = 0, 0
    while n < target:
        u, a = f"Question {i}: what happened next?", SENTENCE * 3
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        n += len(tok.message_ids("user", u)) + len(tok.message_ids("assistant", a))
        i += 1
    return msgs + [{"role": "user", "content": "And at the end of the night?"}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for both (default: each tunes its own)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from tinychat.loading import default_model_path, resolve_quant
    from tinychat.tokenizer import Tokenizer
    mode, _ = resolve_quant(a.quant, "cpu")
    tok = Tokenizer.from_file(default_model_path() / "tokenizer.json")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    threads = ["--threads", str(a.threads)] if a.threads else []
    srv = subprocess.Popen([sys.executable, "-m", "tinychat", "serve", "--port", str(port), "--quant", mode, *threads],
                           cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or srv.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        ask = [{"role": "user", "content": PROMPT}]
        off = {"phrase_ban": False, "no_parrot": False}     # as the headless chat: one turn, same sampler
        rows = {"headless": [], "server": [], "server_own": []}
        stream(base, ask, 8)                                 # warm both
        for _ in range(a.rounds):
            h = headless(mode, a.tokens, threads)
            sv = served(base, a.tokens, off)
            assert [t["text"] for t in h] == [t["text"] for t in sv], "the same seed should give the same turns"
            rows["headless"].append(rate(h))
            rows["server"].append(rate(sv))
            rows["server_own"].append(rate(sv, "server_tok_s"))
            rows.setdefault("tokens", []).append(sum(t["n"] for t in sv))
            rows.setdefault("ratio_per_round", []).append(round(rate(sv) / rate(h), 3))
        conv = conversation(tok, 1000)
        ttft = {"cached": [], "rebuilt": [], "one_prefill": []}
        prompt_tokens = cached_tokens = 0
        long_msg = [{"role": "user", "content": SENTENCE * 40}]
        for r in range(a.rounds):
            first = stream(base, conv, 4, seed=r)            # the server now holds this conversation
            follow = conv + [{"role": "assistant", "content": first["text"]},
                             {"role": "user", "content": "Why?"}]
            c = stream(base, follow, 4)
            ttft["cached"].append(c["ttft_s"])
            prompt_tokens, cached_tokens = c["prompt"], c["cached"]
            stream(base, [{"role": "user", "content": "Something else."}], 4)
            ttft["rebuilt"].append(stream(base, follow, 4)["ttft_s"])
            ttft["one_prefill"].append(stream(base, long_msg, 4)["ttft_s"])
        clients = {}
        for k in (1, 4):
            t0 = time.perf_counter()
            outs = []
            ths = [threading.Thread(target=lambda i=i: outs.append(stream(base, ask, a.tokens, seed=i, extra=off)))
                   for i in range(k)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            clients[k] = sum(o["n"] for o in outs) / (time.perf_counter() - t0)
    finally:
        srv.terminate()
        srv.wait(30)
    per_round = rows.pop("ratio_per_round")
    med = {k: statistics.median(v) for k, v in rows.items()}
    res = {"quant": mode, "threads": a.threads, "ratio_per_round": per_round, "max_tokens": a.tokens, "rounds": a.rounds, "decode_tok_s": med,
           "ratio_client": med["server"] / med["headless"], "ratio_server_own": med["server_own"] / med["headless"],
           "ttft_ms": {k: round(1000 * statistics.median(v), 1) for k, v in ttft.items()},
           "prefix": {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens},
           "clients_tok_s": clients}
    print(json.dumps(res, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
