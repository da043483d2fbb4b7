"""Which small instruct model runs well here, before downloading any: random weights in the shape of each candidate
(its config.json's numbers, as `tinychat import` would build it), measured by `tinychat bench` in fresh processes,
alternating round by round (a loaded host slows all alike).

    python tests/perf/llama_shapes.py [--quant int8] [--threads 1] [--rounds 2] [--only smollm2-360m qwen2.5-0.5b]

Writes the model folders once under runs/perf/shapes/ (bf16, git-ignored) and prints one Markdown table: decode
tok/s after a 100-token prompt, prefill tok/s, peak RSS, the int8 file size a pull would need on disk as float32.
Random weights decode at the speed of real ones (the engine does the same work); what they cannot tell is quality."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the config.json numbers of each candidate (Hugging Face repos of the same names)
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, bias=False, repo="HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-360m": dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                         intermediate_size=2560, vocab_size=49152, bias=False, repo="HuggingFaceTB/SmolLM2-360M-Instruct"),
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, bias=True, repo="Qwen/Qwen2.5-0.5B-Instruct"),
    "llama3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=8192, vocab_size=128256, bias=False, repo="meta-llama/Llama-3.2-1B-Instruct"),
}


def build(name: str, out: Path) -> Path:
    """The candidate's model folder with random weights (bf16), built once, in a process of its own (a child
    inherits its parent's peak RSS on Linux: the benches must not start from a process that held a 1B model)."""
    d = out / name
    if not (d / "config.json").is_file():
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import llama_shapes as L; " \
               f"L._build({name!r}, L.Path({str(d)!r}))"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return d


def _build(name: str, d: Path) -> None:
    import torch

    from tinychat.importer.llama import build_config
    from tinychat.model import TinyAgentLM
    s = dict(SHAPES[name])
    bias = s.pop("bias")
    s.pop("repo")
    cfg = {"model_type": "qwen2" if bias else "llama", "hidden_act": "silu", "rope_theta": 100000.0,
           "max_position_embeddings": 4096, **s}
    fake = {"model.embed_tokens.weight": torch.empty(s["vocab_size"], 1)}
    if bias:
        fake["model.layers.0.self_attn.q_proj.bias"] = torch.empty(1)
    torch.manual_seed(0)
    with torch.no_grad():
        m = TinyAgentLM(build_config(cfg, fake, 4096, name))
    m.save_pretrained(d, dtype=torch.bfloat16)


def bench(path: Path, quant: str, threads: int) -> dict:
    cmd = [sys.executable, "-m", "tinychat", "bench", "--model", str(path), "--quant", quant, "--threads",
           str(threads), "--prompt-len", "100", "--gen-len", "64", "--repeats", "3", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ})
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    a = ap.parse_args()
    out = ROOT / "runs" / "perf" / "shapes"
    paths = {n: build(n, out) for n in a.only}
    runs: dict[str, list[dict]] = {n: [] for n in a.only}
    for _ in range(a.rounds):
        for n in a.only:
            runs[n].append(bench(paths[n], a.quant, a.threads))
            print(n, json.dumps(runs[n][-1]), file=sys.stderr, flush=True)
    print(f"random weights, --quant {a.quant}, {a.threads} thread(s), medians of {a.rounds} alternated rounds")
    print("| shape of | params (head untied) | decode tok/s | prefill 100 tok/s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for n in a.only:
        med = lambda k: statistics.median(r[k] for r in runs[n])  # noqa: E731
        print(f"| {SHAPES[n]['repo']} | {runs[n][0]['params'] / 1e6:.0f}M | {med('decode_tok_s'):.1f} | "
              f"{med('prefill_tok_s'):.0f} | {med('peak_rss_mb'):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
