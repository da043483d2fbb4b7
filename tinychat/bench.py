"""`tinychat bench`: prefill, time to first token and batch-1 decode speed of a model, through the engine the chat
runs on (append for the prompt, Decoder for the reply), with warm-up and medians over repeats.

run_bench() returns one flat dict (the `--json` object); render_table() turns it into a rich Table.
Decode is greedy with the stop token banned, so every repeat decodes exactly gen_len tokens whatever the weights
(random weights give flat distributions, where a nucleus draw would time the sampler's sort, not the model)."""
from __future__ import annotations

import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .errors import TinychatError


class BenchError(TinychatError, ValueError):
    """A benchmark that cannot run as asked (a bad flag value, a device this build lacks); one line."""


DEVICES = ("cpu", "cuda")

Progress = Callable[[int, int, str], None]   # progress(done, total, what): done of total units finished


def _peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1 << 20) if sys.platform == "darwin" else r / 1024    # bytes on macOS, KiB on Linux


def _load(model_path, config, seed: int = 0, quant: str = "none"):
    from .loading import load_model_for
    return load_model_for(Path(model_path) if model_path is not None else None, config, seed=seed, quant=quant)


def _int8_kernels(nat):
    """The kernel path of the native step that ran (engine/native_q8.h, native_q4.h), None where none ran."""
    return None if nat is None else nat.lib.tc_kernel_path().decode()


def _int8_prefill(model, rows: int):
    """The kernel the int8 / int4 Linears' prefill of `rows` tokens runs ("native-gemm", "bf16-gemm", "fp32-gemm",
    "int8-gemv"), None for a model without them."""
    from .engine.quant import bulk_prefill_kernel
    return bulk_prefill_kernel(model, rows)


def run_bench(model_path: Optional[str | Path] = None, config: Optional[str] = None, quant: str = "none",
              device: str = "cpu", prompt_len: int = 100, gen_len: int = 64, repeats: int = 3,
              progress: Optional[Progress] = None, *, warmup: int = 1, graph=None, compile: bool = False,
              seed: int = 0, threads: Optional[int] = None, prefill_lens: tuple = (), options=None) -> dict:
    """Measure one model. model_path / config: a checkpoint folder or a named size with random weights (neither: the
    shipped model). quant: none | int8 | bf16 (CPU weight-only modes, quantize_cpu). device: cpu | cuda.
    Each repeat prefills prompt_len random tokens into an emptied cache (append), samples the first token (TTFT =
    prefill + that draw) and decodes gen_len more through Decoder.generate. Medians over `repeats`, after `warmup`
    untimed repeats. graph / compile: Decoder options (GPU modes; None = the Decoder's default for the device).
    progress(done, total, what) is called as repeats finish. prefill_lens: more prompt lengths whose prefill alone
    is timed the same way (result["prefill_by_len"]: {length: tok/s}). threads: torch.set_num_threads first (None: as is)
    and the int8 step's thread tuning off. options: EngineOptions (default: EngineOptions.from_env()).
    On a CPU that other processes keep busy, fewer threads than cores is often faster: a descheduled worker stalls
    every op's barrier."""
    import torch

    from .choices import QUANT_MODES
    from .engine import EngineOptions

    if quant not in QUANT_MODES:
        raise BenchError(f"quant must be one of {', '.join(QUANT_MODES)} (got {quant!r})")
    if device not in DEVICES:
        raise BenchError(f"device must be one of {', '.join(DEVICES)} (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is available to this PyTorch build")
    if device == "cuda" and quant in ("int8", "int4"):
        raise BenchError(f"--quant {quant} is a CPU mode (weight-only {quant} kernels); on cuda use none or bf16")
    prompt_len, gen_len, repeats, warmup = int(prompt_len), int(gen_len), int(repeats), max(0, int(warmup))
    if prompt_len < 1 or gen_len < 1 or repeats < 1:
        raise BenchError("prompt-len, gen-len and repeats must be positive")

    options = options or EngineOptions.from_env()
    if threads is not None:
        from .loading import check_threads
        check_threads(threads)              # 0 ran with torch's own count while a chat refused it
        torch.set_num_threads(int(threads))
        options = options.replace(tune_threads=False)     # pinned: the int8 step's thread tuner stays off
    return _run(model_path, config, quant, device, prompt_len, gen_len, repeats, warmup, progress, graph,
                compile, seed, prefill_lens, options)


def _run(model_path, config, quant, device, prompt_len, gen_len, repeats, warmup, progress, graph, compile, seed,
         prefill_lens, options) -> dict:
    import torch

    from .engine import Decoder, KVCache, append, sample_top_p
    from .plan import decide
    total = 2 + warmup + repeats + len(prefill_lens)
    done = 0
    threads = torch.get_num_threads()       # as set: the tuned step may leave torch's count lower (sync_torch)

    def tick(what):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, what)

    # a CPU quant mode loads the Linear weights as stored, as the app does (no fp32 copy before quantizing)
    model, desc = _load(model_path, config, seed, quant if device == "cpu" else "none")
    cfg = model.cfg
    prefill_lens = tuple(int(n) for n in prefill_lens)
    if any(n < 1 or n > cfg.max_seq_len for n in prefill_lens):
        raise BenchError(f"prefill lengths must be within 1..{cfg.max_seq_len}")
    if prompt_len + gen_len + 2 > cfg.max_seq_len:
        raise BenchError(f"prompt-len + gen-len ({prompt_len} + {gen_len}) must stay below the model's "
                         f"max_seq_len {cfg.max_seq_len}")
    linear_params = model.num_linear_params()
    tick("model loaded")

    dev = torch.device(device)
    plan = None
    if device == "cpu":
        plan = decide(model, quant, device, options, graph=graph)   # quantized as a chat's model is (plan.py)
        kv_dtype = plan.kv_dtype()          # a chat's: fp32, or fp16 (options.kv_cache; fp32 attention either way)
    else:
        if quant == "bf16":
            model = model.to(torch.bfloat16)
        model = model.to(dev)
        kv_dtype = torch.bfloat16
    quant_eff = plan.quant if plan is not None else ("bf16" if quant == "bf16" else "none")
    model.eval()

    max_len = max([prompt_len + gen_len + 2, *prefill_lens])
    cache = KVCache(model, 1, max_len, dev, dtype=kv_dtype)
    dec = Decoder(model, cache, graph=graph, compile=compile, options=options, plan=plan)
    V = cfg.vocab_size
    stop = V - 1                      # banned: never sampled, so every repeat decodes gen_len tokens
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, V - 1, (warmup + repeats, prompt_len), generator=gen)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        if dec.graph:
            dec.warmup(gen_len, stop, 0.0, 1.0)
        tick("warm-up")
        pre, ttft, dectps = [], [], []
        for r in range(warmup + repeats):
            cache.reset([0])
            dec.clear_turn_state()
            idx = prompts[r:r + 1].to(dev)
            sync()
            t0 = time.perf_counter()
            logits = append(model, cache, idx, [prompt_len], pad_shapes=options.pad_shapes)
            sync()
            t1 = time.perf_counter()
            first = sample_top_p(logits, 0.0, 1.0)
            int(first)                    # the first token on the host: what a chat would print
            t2 = time.perf_counter()
            out = dec.generate(logits, gen_len, stop, temperature=0.0, top_p=1.0, ban_ids=(stop,))
            sync()
            t3 = time.perf_counter()
            if len(out) != gen_len:
                raise RuntimeError(f"decoded {len(out)} tokens, expected {gen_len}")
            if r >= warmup:
                pre.append(prompt_len / (t1 - t0))
                ttft.append((t2 - t0) * 1e3)
                dectps.append(gen_len / (t3 - t2))   # gen_len sampled tokens (+ the cut-off stop step, not counted)
            tick("warm-up" if r < warmup else f"repeat {r - warmup + 1}/{repeats}")
        by_len = {}
        for n in prefill_lens:
            ts = []
            for r in range(warmup + repeats):
                cache.reset([0])
                idx = torch.randint(0, V - 1, (1, n), generator=gen).to(dev)
                sync()
                t0 = time.perf_counter()
                append(model, cache, idx, [n], pad_shapes=options.pad_shapes)
                sync()
                if r >= warmup:
                    ts.append(n / (time.perf_counter() - t0))
            by_len[str(n)] = statistics.median(ts)
            tick(f"prefill {n}")

    kv_bytes = torch.empty(0, dtype=kv_dtype).element_size()
    nat = dec.cpu_step.nat if dec.cpu_step is not None else None
    tuned = nat is not None and options.tune_threads
    return {
        "model": desc,
        "config": cfg.name or None,
        "quant": quant_eff,
        "device": device,
        "mode": dec.mode,
        "native": nat is not None,
        "int8_kernels": _int8_kernels(nat),   # which native int8 path ran (avx512-vnni, avx2-vnni, ...), else None
        "int8_prefill": _int8_prefill(model, prompt_len) if device == "cpu" else None,   # its prefill's GEMM
        "threads": threads if device == "cpu" else None,
        "huge_pages_mb": (plan.huge_pages >> 20) if plan is not None else 0,   # streamed weights on huge pages
        # the int8 native step picks 1..threads by measurement unless pinned (--threads); its choice at the end
        "threads_auto": tuned,
        "threads_used": (nat.tuner.choice or threads) if tuned else (threads if device == "cpu" else None),
        "linear_params": linear_params,
        "params": sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers()),
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "repeats": repeats,
        "prefill_tok_s": statistics.median(pre),
        "ttft_ms": statistics.median(ttft),
        "decode_tok_s": statistics.median(dectps),
        "decode_ms_per_token": 1e3 / statistics.median(dectps),
        "prefill_tok_s_all": pre,
        "prefill_by_len": by_len,
        "decode_tok_s_all": dectps,
        "kv_dtype": str(kv_dtype).replace("torch.", ""),
        "kv_bytes_per_token": cfg.kv_bytes_per_token(kv_bytes),
        "gqa_kv_bytes_per_token": cfg.gqa_kv_bytes_per_token(kv_bytes),
        "peak_rss_mb": _peak_rss_mb(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": _cpu_name(),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def render_table(result: dict):
    """A rich Table of a run_bench() result."""
    from rich.table import Table

    from .textsafe import plural
    r = result
    from rich.markup import escape

    from .textsafe import safe_line
    title = escape(safe_line(f"tinychat bench — {r['model']}, {r['quant']} on {r['device']} ({r['mode']})"))
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("Linear parameters", f"{r['linear_params'] / 1e6:.2f} M")
    t.add_row(f"prefill ({plural(r['prompt_len'], 'token')})", f"{r['prefill_tok_s']:,.0f} tok/s")
    t.add_row("time to first token", f"{r['ttft_ms']:,.1f} ms")
    t.add_row(f"decode (batch 1, {plural(r['gen_len'], 'token')})", f"{r['decode_tok_s']:,.1f} tok/s "
              f"({r['decode_ms_per_token']:.2f} ms/token)")
    gqa = r["gqa_kv_bytes_per_token"]
    t.add_row(f"KV bytes / token ({r['kv_dtype']})", f"{r['kv_bytes_per_token']:,} "
              f"(standard GQA cache: {gqa:,}, {gqa / r['kv_bytes_per_token']:.1f}x)")
    t.add_row("peak RSS", f"{r['peak_rss_mb']:,.0f} MB")
    if r.get("threads"):
        t.add_row("threads", f"{r['threads']}" + (f" (auto: the int8 step ran on {r['threads_used']})"
                                                   if r.get("threads_auto") else ""))
    if r.get("int8_kernels"):                  # the int8 / int4 step's (the --json keys kept their first names)
        t.add_row("native kernels", r["int8_kernels"])
    if r.get("int8_prefill"):
        t.add_row("prefill GEMM", r["int8_prefill"])
    if r.get("huge_pages_mb"):
        t.add_row("weights on huge pages", f"{r['huge_pages_mb']:,} MB")
    t.add_row("medians over", plural(r["repeats"], "repeat"))
    return t
