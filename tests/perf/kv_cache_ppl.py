"""Decoded perplexity of SmolLM2-135M on the held text with the fp16 and the fp32 K/V cache (issue #34's quality goal
for the fp16 cache): the same quantized model, each chunk's first half prefilled into the chat's cache, its second
half fed one token at a time through the chat's decode step (the native step where it runs), every step's logits
scoring the next token. perplexity.py scores through the forward, which never reads a cache; this reads it as a
chat does, every step. Also the top-1 agreement of the fp16 cache's picks with the fp32 cache's. Not a test.

    python tests/perf/kv_cache_ppl.py [--model DIR] [--quants int8 int4] [--ctx 1024] [--chunks 3] [--threads 2]

--model: a `tinychat import` of SmolLM2-135M in full precision (default: perplexity.py's, imported once into
runs/perf/ppl-home). Prints a line per (quant, cache) and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))       # this checkout's tinychat
sys.path.insert(0, str(Path(__file__).resolve().parent))


def decoded_nll(chat, empty: dict, ids: list[int], ctx: int, chunks: int):
    """(sum of NLL, count, the argmax at each scored position) over `chunks` chunks of ctx tokens; empty: the chat
    cache's mark when it held nothing (each chunk starts there)."""
    import torch

    from tinychat.engine import append
    nll, n, picks = 0.0, 0, []
    h = ctx // 2
    with torch.no_grad():
        for s in range(0, min(len(ids) - ctx + 1, chunks * ctx), ctx):
            c = ids[s:s + ctx]
            chat.cache.truncate(empty, 0)
            logits = append(chat.model, chat.cache, torch.tensor([c[:h]]), [h])[0].double()   # predicts c[h]
            for i in range(h, ctx):
                lp = torch.log_softmax(logits.reshape(-1), dim=-1)
                nll -= float(lp[c[i]])
                n += 1
                picks.append(int(logits.reshape(-1).argmax()))
                if i + 1 < ctx:
                    logits = chat.decoder.step(c[i]).double()
    return nll, n, picks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--quants", nargs="+", default=["int8", "int4"])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    from perplexity import TEXT, _default_model
    from tinychat.chat.runtime import Chat
    from tinychat.engine import quantize_cpu
    from tinychat.loading import load_folder
    from tinychat.model import TOKENIZER_FILE
    from tinychat.options import EngineOptions
    from tinychat.settings import ChatSettings
    from tinychat.tokenizer import Tokenizer
    torch.set_num_threads(a.threads)
    path = a.model or _default_model()
    tok = Tokenizer.from_file(path / TOKENIZER_FILE)
    ids = tok.encode(TEXT.read_text(encoding="utf-8"))
    rows = {}
    for quant in a.quants:
        model = quantize_cpu(load_folder(path, quant).eval(), quant)
        ref = None
        for kv in ("fp32", "fp16"):
            t0 = time.perf_counter()
            chat = Chat(model, tok, ChatSettings(), autosave=False, max_len=a.ctx + 8, rebuild=False,
                        options=EngineOptions.from_env(kv_cache=kv, tune_threads=False))
            assert chat.plan.kv_cache == kv, (chat.plan.kv_cache, kv)
            if chat.cache.length(0):
                raise SystemExit("the chat's cache is not empty after opening it")
            nll, n, picks = decoded_nll(chat, chat.cache.mark(0), ids, a.ctx, a.chunks)
            ref = picks if ref is None else ref
            agree = sum(p == q for p, q in zip(picks, ref)) / len(ref)
            key = f"{quant} {kv}"
            rows[key] = {"ppl": math.exp(nll / n), "nll": nll / n, "scored": n, "top1_vs_fp32": agree,
                         "s": round(time.perf_counter() - t0, 1)}
            print(f"{quant} cache {kv}: decoded ppl {math.exp(nll / n):.4f}, top-1 agreement with the fp32 cache "
                  f"{agree:.4f} ({n} tokens, {rows[key]['s']} s)", flush=True)
    print(json.dumps({"model": str(path), "ctx": a.ctx, "text_tokens": len(ids), "rows": rows}))


if __name__ == "__main__":
    main()
