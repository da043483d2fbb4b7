"""`tinychat info`: a model's summary, what --quant auto runs here, the int8 kernels and the sampler defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .cli_common import MODEL_HELP, _model_arg
from .loading import load_model_for, resolve_device


def _int8_kernels() -> str:
    """The int8 kernel path this machine runs (engine/native.py: e.g. avx512-vnni, avx2-vnni, neon-dotprod; "pytorch"
    where the native kernels are off), with why when off."""
    from .engine import native
    path = native.kernel_path()
    return path if native.why_not is None else f"{path} ({native.why_not})"


def _int8_step() -> str:
    """The int8 step as sessions recorded here name it (Chat.step_name without the prefill's part): the native
    step's version on this kernel path, or the PyTorch fallback; replay compares it with a session's."""
    from .engine import native
    from .plan import step_name
    if native.load() is None:
        return step_name(False, None, None, None)
    return step_name(True, None, native.step_version(), native.kernel_path())


PREFILL_KERNELS = {"bf16-gemm": "bf16 GEMMs", "fp32-gemm": "fp32 GEMMs",
                   "int8-gemv": "int8 GEMV"}


def _prefill(mode: str) -> str:
    """What a --quant int8 / int4 model's long prefill runs on here (its Linear's prefill_kernel at 256 rows, the
    engine options from the environment): the native int8 / int4 GEMM, bf16 GEMMs (AMX machines,
    TINYCHAT_PREFILL_BF16=1; for int8 also no kernels on a CPU with bf16 dot products), or fp32 GEMMs."""
    import torch

    from .engine.quant import QUANT_CLASSES
    from .options import EngineOptions
    o = EngineOptions.from_env()
    lin = QUANT_CLASSES[mode](torch.nn.Linear(64, 64, bias=False), prefill_bf16=o.prefill_bf16, native=o.native)
    kernel = lin.prefill_kernel(256)
    return f"native {mode} GEMM" if kernel == "native-gemm" else PREFILL_KERNELS[kernel]


def info(name: Optional[Path] = typer.Argument(None, metavar="MODEL", show_default=False, help="The model, as --model takes it (`tinychat info smollm2`).", callback=_model_arg),
         model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
         config: Optional[str] = typer.Option(None, "--config", metavar="tiny|demo|full", help="A named size with random weights: tiny, demo, full."),
         json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Model summary: parameters, layers, and the KV-cache size per token next to a standard GQA cache."""
    if name is not None and model is not None and Path(name) != Path(model):
        raise typer.BadParameter("give the model once: as MODEL or as --model", param_hint="MODEL")
    model = model if model is not None else name
    m, desc = load_model_for(model, config)
    c = m.cfg
    family = "TinyAgentLM" if c.is_tinyagent else "llama family"
    from .engine.head_embed import HeadRowsEmbedding
    from .quant_files import param_counts
    counts = param_counts(m)                    # a stored-quantized model's packed weights counted too
    facts = {
        "model": desc, "family": family, "stored": getattr(m, "stored_quant", None), "params": counts[0],
        "linear_params": counts[1], "embed_from_head": isinstance(m.embed, HeadRowsEmbedding),
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "kv_group": c.kv_group, "swa_window": c.swa_window,
        "max_seq_len": c.max_seq_len, "engram_layers": list(c.engram_layers), "engram_orders": list(c.engram_orders),
        "kv_bytes_per_token": c.kv_bytes_per_token(2), "gqa_kv_bytes_per_token": c.gqa_kv_bytes_per_token(2),
        "ring_bytes": c.ring_bytes(2),
        "int8_kernels": _int8_kernels(), "int8_prefill": _prefill("int8"), "int8_step": _int8_step(),
        "int4_prefill": _prefill("int4"),
        **_sampler_facts(model, config),
    }
    from .loading import auto_quant
    facts["quant_auto"], facts["quant_auto_why"] = auto_quant(resolve_device("auto"))
    if json_out:
        import json
        typer.echo(json.dumps(facts))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape

    from .textsafe import safe_line
    t = Table(title=escape(safe_line(f"{family} — {desc}")), show_header=False)     # a path: no markup, no escapes
    t.add_column(style="bold")
    t.add_column(justify="right")
    emb = ", embedding from head rows" if facts["embed_from_head"] else ""
    t.add_row("weights", f"stored {facts['stored']} (packed in the file{emb})" if facts["stored"] else "full precision")
    t.add_row("parameters", f"{facts['params'] / 1e6:.2f} M")
    t.add_row("Linear parameters", f"{facts['linear_params'] / 1e6:.2f} M")
    t.add_row("layers / groups", f"{c.n_layers} / {c.n_groups} (kv_group {c.kv_group})")
    t.add_row("heads / kv heads / head dim", f"{c.n_heads} / {c.n_kv_heads} / {c.head_dim}")
    t.add_row("d_model / mlp", f"{c.d_model} / {c.mlp_hidden}")
    t.add_row("vocab / context", f"{c.vocab_size} / {c.max_seq_len}")
    t.add_row("local window", f"{c.swa_window}")
    t.add_row("Engram", f"layers {list(c.engram_layers)}, orders {list(c.engram_orders)}" if c.has_engram else "none")
    t.add_row("--quant auto (the default)", escape(safe_line(f"{facts['quant_auto']}: {facts['quant_auto_why']}")))
    t.add_row("int8 kernels (--quant int8)", escape(safe_line(facts["int8_kernels"])))
    t.add_row("int8 step (sessions record)", facts["int8_step"])
    t.add_row("int8 prefill", facts["int8_prefill"])
    t.add_row("int4 prefill (--quant int4)", facts["int4_prefill"])
    t.add_row("KV bytes / token (bf16)", f"{facts['kv_bytes_per_token']:,}")
    t.add_row("standard GQA cache / token", f"{facts['gqa_kv_bytes_per_token']:,} "
              f"({facts['gqa_kv_bytes_per_token'] / facts['kv_bytes_per_token']:.1f}x)")
    t.add_row("fixed local rings", f"{facts['ring_bytes'] / 1024:,.0f} KiB")
    Console().print(t)
    s = Table(title="sampler defaults (flags and /set change them; a session keeps its own)")
    for col in ("setting", "value", "from"):
        s.add_column(col)
    for k, v in facts["sampler"].items():
        val = v["value"]
        val = ("on" if val else "off") if isinstance(val, bool) else "random" if val is None else f"{val:g}" \
            if isinstance(val, float) else str(val)
        s.add_row(k.replace("_", "-"), val, v["from"])
    for k, v in facts.get("sampler_unused", {}).items():
        s.add_row(k.replace("_", "-"), str(v), "recommended by the model; tinychat's sampler has no such knob")
    Console().print(s)


def _sampler_facts(model: Optional[Path], config: Optional[str]) -> dict:
    """{"sampler": {setting: {"value", "from"}}} a new chat on this model starts with (no flags), and what the model
    recommends that tinychat cannot use ("sampler_unused")."""
    from .loading import default_model_path, model_defaults
    from .sampler_defaults import FIELDS, ModelDefaults, resolve
    folder = model if model is not None else default_model_path() if config is None else None
    md = model_defaults(Path(folder)) if folder is not None else ModelDefaults()
    st, src = resolve(md)
    out = {"sampler": {k: {"value": getattr(st, k), "from": src[k]} for k in FIELDS}}
    if md.unused:
        out["sampler_unused"] = md.unused
    return out
