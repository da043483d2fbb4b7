"""Bit identity of two revisions: every decode and prefill path of one revision (default: main) against the working
tree's, compared with torch.equal. A dev tool for refactors that must not move a bit (sessions replay "token-exact"
by comparing bits, and the int8 step versions sessions record must keep their meaning).

    python tests/perf/same_bits.py [--old main] [--arch native x86-64-v4 x86-64-v3 x86-64] [--asm] [--keep DIR]

Each side runs in a fresh process of its own (its own `tinychat` on sys.path, its own native build, one thread) on
the same models: the shipped one (assets/), a tiny TinyAgentLM (Engram, local ring) and two llama-family models (q/k/v
biases, llama3 RoPE scaling; head_dim 16 and 64) built by tests/support.py and saved once. The paths:

  fp32     the full forward (and in query blocks), the training loss (bf16 autocast) and its gradients; append and
           append_chunked (batch 2, ragged, a sub-batch, fp32 and bf16 caches; append padded to stable shapes as on
           GPUs); the eager Decoder (_decode_one: steps,
           a sampled turn, the cache after it); the static device step (Decoder(graph="static"): its prefill feed,
           steps, a sampled turn)
  bf16     quantize_cpu bf16: prefill, the lean step, the eager step on the quantized model
  int8     quantize_cpu int8: prefill on the native GEMM and attention, the native step (tc_step; driven from Python;
           a bf16 cache), the PyTorch lean step (native off: fp32 or bf16 prefill GEMMs), the eager step

--arch: TINYCHAT_NATIVE_ARCH per run ("native": the host's own -march=native); the first runs every path, the others
the int8 ones (what the target flags change). --asm: also compile both revisions' native.c for each level (and
aarch64 with -march=armv8-a / armv8.2-a+dotprod where aarch64-linux-gnu-gcc exists) and compare the disassembly of
every exported function, addresses masked. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys
sys.path.insert(0, {src!r})
import torch
import tinychat
assert tinychat.__file__.startswith({src!r}), tinychat.__file__
torch.set_num_threads(1)
from safetensors.torch import save_file
from tinychat.model import TinyAgentLM
from tinychat.engine import Decoder, EngineOptions, KVCache, append, append_chunked, quantize_cpu
from tinychat.engine import native
out, meta = {{}}, {{"kernel_path": native.kernel_path(), "step_version": native.step_version()}}
ONLY_INT8 = {only_int8!r}


def rec(name, t):
    out[name] = t.detach().cpu().contiguous().clone()


def load(path, quant="none", options=None):
    m = TinyAgentLM.from_pretrained(path)
    if quant != "none":
        quantize_cpu(m, quant, options=options)
    return m


def cache_state(tag, cache):
    L = int(cache.lens_cpu[0])
    for k in ("gk", "gv"):
        rec(f"{{tag}}/cache.{{k}}", getattr(cache, k)[:, :, :, :L])
    for k in ("lk", "lv", "lpos", "lens", "lens_cpu"):
        rec(f"{{tag}}/cache.{{k}}", getattr(cache, k))
    rec(f"{{tag}}/cache.tokens", cache.tokens[:, :L])


def walk(tag, path, prompt, steps, chunks, quant="none", options=None, kv=torch.float32, graph=False, fast=True):
    m = load(path, quant, options)
    V = m.cfg.vocab_size
    cache = KVCache(m, 1, prompt.size(1) + len(steps) + 64, "cpu", dtype=kv)
    dec = Decoder(m, cache, graph=graph, options=options)
    dec.fast = fast
    at = 0
    for n in chunks:
        rec(f"{{tag}}/prefill{{at}}+{{n}}", append(m, cache, prompt[:, at:at + n], [n], pad_shapes=False))
        at += n
    lg = [dec.step(t) for t in steps]
    rec(f"{{tag}}/steps", torch.cat(lg))
    g = torch.Generator().manual_seed(5)
    toks = dec.generate(lg[-1], 24, stop=V - 1, temperature=0.8, top_p=0.95, pen=1.2, pen_ids=list(range(0, V, 7)),
                        generator=g)
    rec(f"{{tag}}/turn", torch.tensor(toks))
    cache_state(tag, cache)
    meta[tag] = dec.mode


def fp32_paths(name, path, prompt, steps, chunks):
    m = load(path)
    V, T = m.cfg.vocab_size, min(prompt.size(1) - 1, 160)
    with torch.no_grad():
        rec(f"{{name}}/forward", m(prompt[:, :T]))
        rec(f"{{name}}/forward-blocks", m(prompt[:, :T], attn_chunk=48))
    from tinychat.training.loss import masked_loss, masked_loss_reference
    idx = torch.cat([prompt[:, :T], prompt[:, 1:T + 1]])
    tgt = torch.roll(idx, -1, 1)
    msk = torch.ones_like(idx, dtype=torch.bool)
    msk[:, :5] = False
    for fn in (masked_loss, masked_loss_reference):
        for bf16 in (True, False):
            m.zero_grad(set_to_none=True)
            loss, n = fn(m, idx, tgt, msk, bf16=bf16)
            loss.backward()
            tag = f"{{name}}/train.{{fn.__name__}}.{{'bf16' if bf16 else 'fp32'}}"
            rec(f"{{tag}}.loss", loss)
            for pname, p in m.named_parameters():
                if p.grad is not None and (pname.startswith(("blocks.0.", "blocks.1.")) or "." not in pname[7:]):
                    rec(f"{{tag}}.grad.{{pname}}", p.grad)
    # append / append_chunked: a batch of 2 ragged rows, then a sub-batch, on fp32 and bf16 caches
    with torch.no_grad():
        for kv in (torch.float32, torch.bfloat16):
            for fn in (append, append_chunked):
                cache = KVCache(m, 2, prompt.size(1) + 8, "cpu", dtype=kv)
                two = torch.cat([prompt[:, :70], prompt[:, 3:73]])
                tag = f"{{name}}/{{fn.__name__}}.{{str(kv)[6:]}}"
                rec(f"{{tag}}.a", fn(m, cache, two, [70, 61]))
                rec(f"{{tag}}.b", fn(m, cache, prompt[:, 80:95], [15], rows=[1]))
                rec(f"{{tag}}.c", fn(m, cache, two[:, 10:13], [3, 2]))
                rec(f"{{tag}}.d", fn(m, cache, prompt[:, :1].expand(2, 1), [1, 1]))
                cache_state(tag, cache)
            cache = KVCache(m, 2, prompt.size(1) + 8, "cpu", dtype=kv)    # append padded to stable shapes (GPUs)
            tag = f"{{name}}/append.padded.{{str(kv)[6:]}}"
            rec(f"{{tag}}.a", append(m, cache, torch.cat([prompt[:, :37], prompt[:, 5:42]]), [37, 30], pad_shapes=True))
            rec(f"{{tag}}.b", append(m, cache, prompt[:, 50:53].expand(2, 3), [3, 1], pad_shapes=True))
            cache_state(tag, cache)
    walk(f"{{name}}/eager", path, prompt, steps, chunks)
    walk(f"{{name}}/eager.bf16cache", path, prompt, steps, chunks, kv=torch.bfloat16)
    walk(f"{{name}}/static", path, prompt, steps, chunks, graph="static")
    walk(f"{{name}}/bf16.lean", path, prompt, steps, chunks, quant="bf16")
    walk(f"{{name}}/bf16.eager", path, prompt, steps, chunks, quant="bf16", fast=False)
    walk(f"{{name}}/int8.torch", path, prompt, steps, chunks, quant="int8",
         options=EngineOptions(native=False, prefill_bf16=False))
    walk(f"{{name}}/int8.torch.bf16gemm", path, prompt, steps, chunks, quant="int8",
         options=EngineOptions(native=False, prefill_bf16=True))
    walk(f"{{name}}/int8.eager", path, prompt, steps, chunks, quant="int8", fast=False)


def int8_paths(name, path, prompt, steps, chunks):
    walk(f"{{name}}/int8.native", path, prompt, steps, chunks, quant="int8", options=EngineOptions())
    walk(f"{{name}}/int8.native.glue", path, prompt, steps, chunks, quant="int8",
         options=EngineOptions(step_in_c=False))
    walk(f"{{name}}/int8.native.bf16cache", path, prompt, steps, chunks, quant="int8", options=EngineOptions(),
         kv=torch.bfloat16)
    walk(f"{{name}}/int8.native.bf16gemm", path, prompt, steps, chunks, quant="int8",
         options=EngineOptions(prefill_bf16=True))


for name, path in {models!r}.items():
    cfg = json.load(open(os.path.join(path, "config.json")))
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(11)
    P = 300 if cfg["max_seq_len"] >= 1024 else 150
    prompt = torch.randint(0, V, (1, P + 1), generator=g)
    steps = torch.randint(0, V, (40,), generator=g).tolist()
    chunks = (P - 45, 37, 1, 7)                            # a long prefill, shorter turns, one token
    if not ONLY_INT8:
        fp32_paths(name, path, prompt, steps, chunks)
    int8_paths(name, path, prompt, steps, chunks)
save_file(out, {out!r})
print(json.dumps(meta))
"""


def extract(rev: str, dest: Path) -> Path:
    """rev's tree (git archive) in dest: no worktree to register or remove."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def make_models(tmp: Path) -> dict[str, str]:
    """The shipped model and the test models (tests/support.py), saved once so both sides load the same files."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from support import make_llama_model, make_model
    models = {"shipped": str(ROOT / "assets")}
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    for name, m in (("tiny", make_model()),
                    ("llama16", make_llama_model(rope_scaling=scaling)),
                    ("llama64", make_llama_model(seed=3, d_model=96, n_heads=6, n_kv_heads=2, head_dim=64,
                                                 mlp_hidden=128, n_layers=3))):
        d = tmp / name
        m.save_pretrained(d)
        models[name] = str(d)
    return models


def run_side(src: Path, models: dict, out: Path, arch: str, only_int8: bool, home: Path) -> dict:
    env = {**os.environ, "TINYCHAT_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("TINYCHAT_NATIVE_ARCH", None)
    if arch != "native":
        env["TINYCHAT_NATIVE_ARCH"] = f"-march={arch}" if not arch.startswith("-") else arch
    code = CHILD.format(src=str(src), models=models, out=str(out), only_int8=only_int8)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(src))
    if r.returncode:
        sys.exit(f"{src}: the child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(old: Path, new: Path) -> tuple[int, int, list[str]]:
    import torch
    from safetensors.torch import load_file
    a, b = load_file(str(old)), load_file(str(new))
    bad = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            bad.append(f"{k}: only in {'old' if k in a else 'new'}")
        elif not torch.equal(a[k], b[k]):
            diff = (a[k].double() - b[k].double()).abs().max().item() if a[k].shape == b[k].shape else "shape"
            bad.append(f"{k}: differs (max |diff| {diff})")
    return len(set(a) & set(b)), len(a) + len(b), bad


RENAMED = {"exp16": "tc_exp16", "exp8": "tc_exp8", "dot16": "tc_dot16", "hsum8": "tc_hsum8"}   # moved to native_simd.h


def disasm(cc: str, src_dir: Path, flags: list[str], tmp: Path, tag: str) -> dict[str, str]:
    """{function: its instructions, addresses and symbol offsets masked} of native.c built with flags."""
    so = tmp / f"{tag}.so"
    r = subprocess.run([cc, "-fopenmp", "-O3", *flags, "-ffp-contract=off", "-shared", "-fPIC", "-o", str(so),
                        str(src_dir / "tinychat" / "engine" / "native.c"), "-lm"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-1500:])
    objdump = "aarch64-linux-gnu-objdump" if "aarch64" in cc else "objdump"
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                          check=True).stdout
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur and "\t" in line:
            ins = line.split("\t", 1)[1]
            ins = re.sub(r"#.*$", "", ins)                         # the address comments
            ins = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "X(%rip)", ins)     # pc-relative offsets
            ins = re.sub(r"\b[0-9a-f]{3,}\b", "X", ins)           # addresses
            ins = re.sub(r"<[^>]*>", "<>", ins)                    # symbol+offset
            funcs[cur].append(ins)
    skip = ("_init", "_fini", "frame_dummy", "register_tm_clones", "deregister_tm_clones", "__do_global_dtors_aux",
            "tc_kernel_path", "tc_abi_version")
    out = {}
    for f, v in funcs.items():
        if f.endswith("@plt") or f.startswith(skip) or f.startswith(".") or not v:
            continue
        out[RENAMED.get(f.split(".")[0], f.split(".")[0]) + f[len(f.split(".")[0]):]] = "\n".join(v)
    return out


def asm_check(old_src: Path, tmp: Path, archs: list[str]) -> list[str]:
    targets = [("gcc", [f"-march={a}"] if not a.startswith("-") else a.split(), a) for a in archs if a != "native"]
    targets.insert(0, ("gcc", ["-march=native"], "native"))
    cross = subprocess.run(["which", "aarch64-linux-gnu-gcc"], capture_output=True, text=True).stdout.strip()
    if cross:
        targets += [(cross, ["-march=armv8-a"], "aarch64 neon"), (cross, ["-march=armv8.2-a+dotprod"], "aarch64 dotprod")]
    lines = []
    for cc, flags, name in targets:
        a = disasm(cc, old_src, flags, tmp, "old")
        b = disasm(cc, ROOT, flags, tmp, "new")
        diff = sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))
        lines.append(f"asm {name:16s} {len(set(a) & set(b))} functions, "
                     + ("identical" if not diff else f"DIFFER: {', '.join(diff)}"))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="main", help="the revision to compare against (default main)")
    ap.add_argument("--arch", nargs="+", default=["native", "x86-64-v4", "x86-64-v3", "x86-64"])
    ap.add_argument("--asm", action="store_true", help="also compare the kernels' disassembly per target")
    ap.add_argument("--asm-only", action="store_true", help="only the disassembly (no runs)")
    ap.add_argument("--keep", type=Path, help="keep the outputs in this folder")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-bits-") as t:
        tmp = a.keep or Path(t)
        tmp.mkdir(parents=True, exist_ok=True)
        old_src = extract(a.old, tmp / "old-src")
        models = make_models(tmp) if not a.asm_only else {}
        failed = 0
        for i, arch in enumerate(a.arch if not a.asm_only else ()):
            outs, metas = {}, {}
            for side, src in (("old", old_src), ("new", ROOT)):
                outs[side] = tmp / f"{side}-{arch}.safetensors"
                metas[side] = run_side(src, models, outs[side], arch, i > 0, tmp / "home")
            n, _, bad = compare(outs["old"], outs["new"])
            print(f"arch {arch:10s} kernel path {metas['old']['kernel_path']} -> {metas['new']['kernel_path']}, "
                  f"step v{metas['old']['step_version']} -> v{metas['new']['step_version']}: {n} tensors, "
                  + ("all torch.equal" if not bad else f"{len(bad)} DIFFER"))
            modes = sorted({k: v for k, v in metas["new"].items() if "/" in k}.items())
            if any(metas["old"].get(k) != v for k, v in modes):
                print("  decoder modes differ:", [(k, metas["old"].get(k), v) for k, v in modes
                                                   if metas["old"].get(k) != v])
                failed += 1
            for line in bad[:40]:
                print("  ", line)
            failed += bool(bad)
        if a.asm or a.asm_only:
            for line in asm_check(old_src, tmp, a.arch):
                print(line)
                failed += "DIFFER" in line
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
