"""Checks of a checkpoint against its config, made before and after it is loaded, below model.py (no import of it):
the tensors a config implies, by name and shape, computed without building the model (a 113 KB GGUF claiming 100,000
layers, or an MLP 2^24 wide, built its model with random weights before the shapes were compared: minutes and
gigabytes), a safetensors file's header compared with them, and the first weight holding a NaN or an infinity."""
from __future__ import annotations

from pathlib import Path

import torch

from .mapped import MappedWeights

MAX_POSITIONS = 1 << 17    # max_seq_len's ceiling (Llama 3.x's 131,072): the RoPE tables are built for all of them


def state_count(cfg) -> int:
    """How many tensors state_shapes(cfg) names, counted without naming them: a claim of 10^9 layers is refused by
    this number before a name is made."""
    per_layer = 4 + (1 if cfg.has_local else 0) + cfg.attn_bias * (1 + (1 if cfg.has_local else 0))
    n = 3 + cfg.n_layers * per_layer
    n += (cfg.n_layers + cfg.kv_group - 1) // cfg.kv_group * (1 + cfg.attn_bias)        # the global K/V layers
    if cfg.has_engram:
        n += 5 * len({i for i in cfg.engram_layers if 0 <= i < cfg.n_layers})
    return n


def state_shapes(cfg) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{state_dict name: (shape, is floating)} of TinyAgentLM(cfg), from the config alone: a checkpoint's tensors are
    compared with it before anything is built (a 113 KB file claiming 100,000 layers, or an MLP 2^24 wide, would
    otherwise allocate the model first). tests/unit/test_model_shapes.py checks it against built models."""
    d, H, Hk, D, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
    out: dict[str, tuple[tuple[int, ...], bool]] = {"cid_map": ((V,), False), "embed.weight": ((V, d), True),
                                                     "head.weight": ((V, d), True)}

    def linear(name: str, rows: int, cols: int, bias: bool = False) -> None:
        out[name + ".weight"] = ((rows, cols), True)
        if bias:
            out[name + ".bias"] = ((rows,), True)

    n_tables = len(cfg.engram_orders) * cfg.engram_heads
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        linear(p + "attn.w_q", H * D, d, cfg.attn_bias)
        if cfg.has_local:
            linear(p + "attn.w_kv_local", 2 * Hk * D, d, cfg.attn_bias)
        if i % cfg.kv_group == 0:
            linear(p + "attn.w_kv_global", 2 * Hk * D, d, cfg.attn_bias)
        linear(p + "attn.w_o", d, H * D)
        linear(p + "mlp.up", cfg.mlp_hidden * (2 if cfg.mlp_kind == "swiglu" else 1), d)
        linear(p + "mlp.down", d, cfg.mlp_hidden)
        if cfg.has_engram and i in cfg.engram_layers:
            out[p + "engram.table.weight"] = ((n_tables * cfg.engram_table_size, cfg.engram_dim), True)
            linear(p + "engram.w_k", d, n_tables * cfg.engram_dim)
            linear(p + "engram.w_v", d, n_tables * cfg.engram_dim)
            out[p + "engram.mult"] = ((n_tables, max(cfg.engram_orders)), False)
            out[p + "engram.offset"] = ((n_tables,), False)
    return out


def check_shapes(wpath: Path, cfg, source: str, error: type[Exception] = ValueError) -> None:
    """`error` unless the safetensors file at wpath holds exactly the tensors the config implies (state_shapes), of
    those shapes: its header only is read, nothing is built, and the tensors are counted (state_count) before any is
    named, so the work is bounded by what the file holds whatever the config claims."""
    from safetensors import safe_open
    with safe_open(str(wpath), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    count = state_count(cfg)
    if count > 4 * len(shapes) + 1000:      # far more than the file holds: refused by the count, nothing named
        raise error(f"{wpath}: weights do not match {source} (it implies {count:,} tensors, the file holds "
                    f"{len(shapes):,})")
    want = state_shapes(cfg)
    missing = sorted(set(want) - set(shapes))
    extra = sorted(set(shapes) - set(want))
    if missing or extra:
        what = (f"missing {', '.join(missing[:3])}" if missing else "") + \
               ("; " if missing and extra else "") + (f"unexpected {', '.join(extra[:3])}" if extra else "")
        raise error(f"{wpath}: weights do not match {source} ({what})")
    for k, (shape, _) in want.items():
        if shapes[k] != shape:
            raise error(f"{wpath}: {k} has shape {shapes[k]}, {source} implies {shape}")


def first_nonfinite(model) -> str | None:
    """The name of the first floating tensor of the model holding a NaN or an infinity, else None. Reads the weights
    block by block, the pages of a mapped file handed back as it goes (mapped.py)."""
    mapped = MappedWeights()
    for k, t in model.state_dict().items():
        if not t.is_floating_point():
            continue
        for block in mapped.blocks(t.detach()):
            for part in block.reshape(-1).split(1 << 20):     # a small boolean temporary, however big the tensor
                if not bool(torch.isfinite(part).all()):
                    return k
    return None
