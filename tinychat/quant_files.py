"""Stored-quantized model files (`tinychat import --quant int8|int4`): model.safetensors holding every Linear's
packed weight and scales exactly as the runtime's Int8Linear / Int4Linear hold them, so a chat maps the file and
builds those modules from the mapped tensors: no fp32 pass, no quantization at start.

The file: for each Linear at module path P, `P.qweight` and `P.scale` (Int8Linear: int8 (N, K) rows and one bf16
scale a row; Int4Linear: uint8 (N, pad64(K) / 2) nibbles and fp16 (N, pad64(K) / 32) group scales, native_q4.h's
layout), `P.bias` (fp32) where the Linear has one; every other tensor (embedding, cid_map, Engram tables) as the
full-precision folder holds it. Which Linears are int4 is quantize_cpu's rule (int4_keeps_int8): the file holds
exactly what `--quant MODE` makes at start from the full-precision weights (a tied embedding aside: layout 2, below).
The safetensors metadata says so:
FORMAT_KEY ("int8" / "int4") and VERSION_KEY; a file without FORMAT_KEY is a full-precision one.

Two layouts (VERSION_KEY):
- "1" (a model whose head is not its embedding, and every file an older tinychat wrote): the embedding fp32 as the
  full-precision folder holds it (mapped: only the rows read are resident); a chat on the file is token for token the
  chat on the full-precision weights quantized at start.
- "2" (FORMAT_VERSION; a checkpoint with a tied embedding, whose importer left `model.tied_gain`: head = embed
  diag(g), g the final norm's gain): no embedding tensor. The model's embedding IS the head's int8 rows, dequantized
  and divided by g: row t = (q[t] * s[t]) * inv_gain, `embed.inv_gain` (d,) fp32 = 1 / g
  (engine/head_embed.py's HeadRowsEmbedding, the native llama step the same bits). The file defines that model: a
  chat on it is NOT token-identical to the full-precision folder quantized at start (its embedding differs by the
  head's int8 rounding divided by the gain). Accepted because it costs no measured quality (SmolLM2-135M,
  tests/perf/perplexity.py: int4 38.33 vs 38.52 with the fp32 embedding, int8 26.49 vs 26.50) and removes the
  largest tensor of a small model (SmolLM2's int4 file 209 -> 96 MB; a 1B model's tied fp32 embedding is 1 GB).
  A gain with a zero or a reciprocal past fp32's range cannot be divided out: such a model is stored as "1".
  Each attention's q/k/v Linears are stored as the one fused Linear the runtime runs (ATTN.w_qkv.qweight / scale /
  bias: engine/fused.py's rows, [q | k | v], exactly quantize_cpu's fuse_qkv): a load builds it from the mapped
  tensors and the q/k/v Linears as views of its rows, so nothing is copied (layout 1 copies them into the fused
  rows at every load).
- "3" (a model whose importer kept its norm gains apart, tinychat/norm_gains.py: every llama-family import since
  issue #34): layout 2's fused q/k/v (ATTN.w_qkv.*), the embedding as layout 2 where tied (TIED_KEY present) else as
  layout 1, and each gained Linear's input gain beside its packed tensors (ATTN.w_qkv.in_gain, BLOCK.mlp.up.in_gain:
  (d,) fp32, engine/quant.py's in_gain): the weights are quantized with the gain divided out, and under int4 the
  q/k/v rows are int4 too (int4_keeps_int8's gained rule). Older layouts load and run as they always did (folded).
- "4" (FORMAT_VERSION: an int4 file of a model with gains kept apart): layout 3 with int4's per-layer mix, each
  Linear in its own format: q/k/v (fused) int8 on llama.cpp's use_more_bits layers (engine/int4_rules.py's
  int4_more_bits, the config's n_layers), int4 elsewhere. An int8 file of such a model is still written as "3" (the
  mix changes nothing there); a version-3 int4 file loads as it did (q/k/v int4 on every layer).
Every int4 tensor (an int4 Linear's, the head's copy below) is in native_q4_layout.h's grouped layout (rows by groups
of four in super-blocks: engine/int4_layout.py) where the metadata says INT4_LAYOUT_KEY = INT4_LAYOUT; a file without
it (an older tinychat's) holds them plain and they are converted at load (a copy, not mapped: import it again to map
it).
An int4 file of a llama-family model (any layout) also holds the int8 head's int4 copy, H4_KEYS
(engine/two_level_head.py's two-level head: uint8 (V, pad64(d) / 2) and fp16 (V, pad64(d) / 32), quantized from
the full-precision head as quantize_cpu makes it); a file without them (an older tinychat's) loads and runs the int8
head alone.

Torch-free to import (store.py lists models without torch): stored_mode reads the file's header only."""
from __future__ import annotations

import json
from pathlib import Path

FORMAT_KEY = "tinychat_quant"
VERSION_KEY = "tinychat_quant_version"
FORMAT_VERSION = 4             # the newest layout this tinychat writes (int4's per-layer mix)
VERSIONS = ("1", "2", "3", "4")    # the layouts it reads
TIED_KEY = "embed.inv_gain"    # version 2: the (d,) fp32 factors of the embedding read from the head's int8 rows
QKV = "w_qkv"                  # version 2: ATTN.w_qkv.* per attention, its q/k/v Linears' rows fused (engine/fused.py)
MODES = ("int8", "int4")
H4_KEYS = ("head.q4weight", "head.q4scale")     # int4 llama files: the head's int4 copy (engine/two_level_head.py)
INT4_LAYOUT_KEY = "tinychat_int4_layout"        # the int4 tensors' byte layout: INT4_LAYOUT, or plain where absent
INT4_LAYOUT = "grouped"
WEIGHTS_FILE = "model.safetensors"
_HEADER_MAX = 64 << 20        # a safetensors header larger than this is not one tinychat wrote


def read_header(wpath: Path) -> dict | None:
    """The JSON header of the safetensors file at wpath ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}),
    or None when there is no such file or it is not a readable safetensors file (the loader's own errors say why)."""
    try:
        with open(wpath, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= _HEADER_MAX:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) else None


def stored_mode(folder: Path, header: dict | None = None) -> str | None:
    """The quant mode the model folder's weights are stored in (FORMAT_KEY: "int8", "int4", or what a newer tinychat
    wrote), or None for full-precision weights (or no readable weights file: the loader reports it). header: the
    file's, where the caller has read it already (read_header)."""
    header = read_header(Path(folder) / WEIGHTS_FILE) if header is None else header
    meta = (header or {}).get("__metadata__")
    if not isinstance(meta, dict) or FORMAT_KEY not in meta:
        return None
    return str(meta[FORMAT_KEY])


def older_int4_layout(folder: Path, header: dict | None = None) -> bool:
    """Whether the folder's stored file holds int4 tensors (an int4 file's Linears, or any file's H4_KEYS head copy)
    in the plain layout of a tinychat before the grouped one: converted at every load (a copy, not mapped) until the
    model is imported again. Reads the header only (header: as stored_mode takes it)."""
    header = (read_header(Path(folder) / WEIGHTS_FILE) if header is None else header) or {}
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or FORMAT_KEY not in meta or meta.get(INT4_LAYOUT_KEY) == INT4_LAYOUT:
        return False
    return meta.get(FORMAT_KEY) == "int4" or H4_KEYS[0] in header


def _linear_class(name: str, mode: str, gained: bool = False, n_layers: int | None = None):
    """The quant Linear class quantize_cpu(mode) gives the Linear at module path name (gained: a model with input
    gains, layouts 3 and 4; n_layers: its layer count where the file holds int4's per-layer mix, layout 4)."""
    from .engine.int4_rules import int4_keeps_int8
    from .engine.quant import Int4Linear, Int8Linear
    return Int4Linear if mode == "int4" and not int4_keeps_int8(name, gained, n_layers) else Int8Linear


def packed_shapes(cls, rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """{"qweight": (shape, dtype), "scale": (shape, dtype)} of an Int8Linear / Int4Linear of rows x cols (safetensors
    dtype names)."""
    from .engine.quant import Int4Linear
    if cls is Int4Linear:
        kp = -(-cols // 64) * 64                  # native.pad64
        return {"qweight": ((rows, kp // 2), "U8"), "scale": ((rows, kp // 32), "F16")}
    return {"qweight": ((rows, cols), "I8"), "scale": ((rows,), "BF16")}


_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _st_dtype(t) -> str:
    name = str(t.dtype).removeprefix("torch.")
    return next((k for k, v in _ST_DTYPES.items() if v == name), name)


def tied_inv_gain(model):
    """The (d,) fp32 factors the embedding of a tied model is read with from its head rows (1 / the final gain the
    importer left as model.tied_gain), or None: an untied model, or a gain that cannot be divided out (a zero, a
    reciprocal past fp32's range)."""
    import torch
    g = getattr(model, "tied_gain", None)
    if g is None:
        return None
    inv = (1.0 / g.detach().double()).float()
    if g.shape != (model.cfg.d_model,) or not bool(torch.isfinite(inv).all()) or bool((inv == 0).any()):
        return None
    return inv.contiguous()


def qkv_groups(model) -> list[tuple[str, list, dict]]:
    """Per block of a model with blocks: (its attention's module path, the fused q/k/v pieces (engine/fused.py's
    qkv_rows), {piece Linear: its module path}); [] for a model without blocks."""
    from .engine.fused import qkv_rows
    if not hasattr(model, "blocks"):
        return []
    names = {m: n for n, m in model.named_modules()}
    c = model.cfg
    out = []
    for blk in model.blocks:
        pieces = qkv_rows(blk.attn, c.n_kv_heads, c.head_dim)
        out.append((names[blk.attn], pieces, {lin: names[lin] for lin, _, _ in pieces}))
    return out


def layout(model, mode: str, tied: bool = False, gained: bool = False,
           mixed: bool = False, h4: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, safetensors dtype)} of the stored-`mode` file of a model like `model` (an unquantized
    TinyAgentLM, built from its config): every Linear's packed tensors, the other tensors as the model holds them;
    tied (versions 2, 3): no embed.weight, TIED_KEY instead; tied or gained (version 3): per attention one fused
    q/k/v Linear (ATTN.w_qkv.*, the rows in engine/fused.py's order) instead of its q/k/v Linears' tensors; gained:
    each gained Linear's in_gain (engine/int4_rules.py's gain_key), the fused one's for q/k/v; mixed (version 4):
    int4's per-layer mix (int4_keeps_int8 given the config's n_layers); h4: the int8 head's int4 copy (H4_KEYS:
    engine/two_level_head.py's two-level head, Int4Linear's packed shapes)."""
    import torch

    from .engine.int4_rules import gain_key
    sd = model.state_dict()
    out = {}
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    nl = model.cfg.n_layers if mixed else None
    for k, t in sd.items():
        mod, _, leaf = k.rpartition(".")
        if mod in linears and leaf in ("weight", "bias"):
            continue
        out[k] = (tuple(t.shape), _st_dtype(t))
    for n, m in linears.items():
        for leaf, spec in packed_shapes(_linear_class(n, mode, gained, nl), m.out_features, m.in_features).items():
            out[f"{n}.{leaf}"] = spec
        if m.bias is not None:
            out[f"{n}.bias"] = ((m.out_features,), "F32")
        if gained and gain_key(n) is not None:
            out[f"{n}.in_gain"] = ((m.in_features,), "F32")
    if h4:
        from .engine.quant import Int4Linear
        for leaf, spec in zip(H4_KEYS, packed_shapes(Int4Linear, model.head.out_features,
                                                     model.head.in_features).values()):
            out[leaf] = spec
    if tied:
        del out["embed.weight"]
        out[TIED_KEY] = ((model.cfg.d_model,), "F32")
    if tied or gained:
        for attn, pieces, names in qkv_groups(model):
            for n in names.values():
                for leaf in ("qweight", "scale", "bias", "in_gain"):
                    out.pop(f"{n}.{leaf}", None)
            first, rows = pieces[0][0], sum(b - a for _, a, b in pieces)
            for leaf, spec in packed_shapes(_linear_class(names[first], mode, gained, nl), rows,
                                            first.in_features).items():
                out[f"{attn}.{QKV}.{leaf}"] = spec
            if first.bias is not None:
                out[f"{attn}.{QKV}.bias"] = ((rows,), "F32")
            if gained and gain_key(names[first]) is not None:
                out[f"{attn}.{QKV}.in_gain"] = ((first.in_features,), "F32")
    return out


def save_quantized(model, folder: Path, mode: str) -> None:
    """Quantize `model` (a full-precision TinyAgentLM) to `mode` in place (quantize_cpu: the bytes a chat's start
    would make) and write folder/config.json and folder/model.safetensors (atomic writes) holding it packed: layout
    version 3 where the model keeps its norm gains apart (model.in_gains; 4 for int4: its per-layer mix), else version 2 (no embedding, TIED_KEY)
    where tied_inv_gain(model) gives the factors, else version 1.
    ValueError when this build cannot make the mode (int8 without torch's int8 kernel runs as bf16)."""
    from safetensors.torch import save_file

    from .engine.int4_rules import head4_eligible
    from .engine.quant import quant_mode, quantize_cpu
    from .fsutil import atomic_write
    from .model_config import CONFIG_FILE
    from .options import EngineOptions
    if mode not in MODES:
        raise ValueError(f"--quant must be one of {', '.join(MODES)} to store packed weights (got {mode!r})")
    inv = tied_inv_gain(model)
    gained = bool(getattr(model, "in_gains", None))
    mixed = gained and mode == "int4"      # quantize_cpu's per-layer mix (int4_more_bits): layout 4
    h4 = head4_eligible(model, model.head)      # int8 and int4 alike; asked before quantize_cpu makes the head int8
    want = layout(model, mode, tied=inv is not None, gained=gained, mixed=mixed, h4=h4)
    groups = qkv_groups(model) if inv is not None or gained else []
    quantize_cpu(model, mode, options=EngineOptions.from_env(head4=True),      # the copy stored whatever the env
                 int8_head4=True)                                               # says, int8 files' too
    if quant_mode(model) != mode:
        raise ValueError(f"this PyTorch build cannot make --quant {mode} weights (it runs {quant_mode(model)})")
    # clones: the q/k/v Linears' rows are views of the fused projection (safetensors refuses shared storage)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if inv is not None:
        del sd["embed.weight"]              # read from the head rows (head_embed.py)
        sd[TIED_KEY] = inv
    if groups:
        for (attn, _, names), fused in zip(groups, model.fused_qkv):    # q/k/v as the runtime fuses them
            for n in names.values():
                for leaf in ("qweight", "scale", "bias", "in_gain"):
                    sd.pop(f"{n}.{leaf}", None)
            for leaf, t in [*fused.named_buffers(recurse=False), *fused.named_parameters(recurse=False)]:
                sd[f"{attn}.{QKV}.{leaf}"] = t.detach().contiguous().clone()
    got = {k: (tuple(v.shape), _st_dtype(v)) for k, v in sd.items()}
    if got != want:                         # the runtime's modules and layout() disagree: a bug here
        bad = sorted(set(got.items()) ^ set(want.items()))[:2]
        raise ValueError(f"internal error: the {mode} tensors are not the stored layout ({bad})")
    version = "4" if mixed else "3" if gained else "2" if inv is not None else "1"
    meta = {"format": "pt", FORMAT_KEY: mode, VERSION_KEY: version, INT4_LAYOUT_KEY: INT4_LAYOUT}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / WEIGHTS_FILE, lambda tmp: save_file(sd, str(tmp), metadata=meta))
    atomic_write(folder / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(model.cfg.to_dict(), indent=2)))


def _check_header(wpath: Path, header: dict, cfg) -> tuple[str, str]:
    """(the stored mode, the layout version), after the header's metadata and tensor count are compared with what
    the config implies; CheckpointError (one line) for anything else."""
    from .model_config import CheckpointError
    from .weights_check import state_count
    meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    mode, version = meta.get(FORMAT_KEY), meta.get(VERSION_KEY)
    if mode not in MODES:
        raise CheckpointError(f"{wpath}: weights stored as {str(mode)[:40]!r}, a quant mode this tinychat does not "
                              f"read ({', '.join(MODES)})")
    if version not in VERSIONS:
        raise CheckpointError(f"{wpath}: stored {mode} weights of format version {str(version)[:20]!r}; this tinychat "
                              f"reads versions {', '.join(VERSIONS)} (import the model again)")
    n = len(header) - 1
    if state_count(cfg) > 4 * n + 1000:     # a config claiming far more than the file holds: nothing is built
        raise CheckpointError(f"{wpath}: weights do not match config.json (it implies {state_count(cfg):,} tensors, "
                              f"the file holds {n:,})")
    return mode, version


def _compare(wpath: Path, header: dict, want: dict) -> None:
    from .model_config import CheckpointError
    have = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        if not isinstance(v, dict) or not isinstance(v.get("shape"), list):
            raise CheckpointError(f"{wpath}: unreadable safetensors header entry {k[:60]!r}")
        have[k] = (tuple(v["shape"]), v.get("dtype"))
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        what = (f"missing {', '.join(missing[:3])}" if missing else "") + ("; " if missing and extra else "") + \
               (f"unexpected {', '.join(extra[:3])}" if extra else "")
        raise CheckpointError(f"{wpath}: stored weights do not match config.json ({what})")
    for k, (shape, dtype) in want.items():
        if have[k] != (shape, dtype):
            raise CheckpointError(f"{wpath}: {k} is {have[k][1]} {have[k][0]}, config.json implies {dtype} {shape}")


def load_quantized(folder: Path, check_finite: bool = True):
    """The TinyAgentLM of a stored-quantized folder, its Linears Int8Linear / Int4Linear holding the mapped file's
    tensors (nothing quantized, no fp32 copy of them), q/k/v fused as quantize_cpu leaves them, and
    model.stored_quant the mode. The header is checked first (_check_header, then every tensor's name, shape and
    dtype against the config); check_finite: refuse NaN / Inf in any floating tensor, the scales included (a chat's
    load checks them with its identity instead: identity.py). CheckpointError, one line, for a bad file. A version-2
    file's model.embed is a HeadRowsEmbedding reading the head's tensors (engine/head_embed.py)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .engine.fused import fuse_qkv
    from .engine.quant import release_freed_memory
    from .mapped import MappedWeights
    from .model import _SKIP_INIT, KEEP_MAPPED_BYTES, CheckpointError, TinyAgentLM, load_config
    from .weights_check import first_nonfinite
    cfg = load_config(folder)
    wpath = Path(folder) / WEIGHTS_FILE
    header = read_header(wpath)
    if header is None:
        raise CheckpointError(f"{wpath}: unreadable safetensors file")
    mode, version = _check_header(wpath, header, cfg)
    gained = version in ("3", "4")
    nl = cfg.n_layers if version == "4" else None      # int4's per-layer mix
    tied = version == "2" or (gained and TIED_KEY in header)
    h4 = H4_KEYS[0] in header               # the two-level head's copy (older files, and int8 ones until 2026-12: none)
    fused_file = tied or gained             # q/k/v stored fused (ATTN.w_qkv.*)
    token = _SKIP_INIT.set(True)
    try:
        model = TinyAgentLM(cfg)
    finally:
        _SKIP_INIT.reset(token)
    _compare(wpath, header, layout(model, mode, tied, gained, mixed=nl is not None, h4=h4))
    try:
        sd = load_file(str(wpath))          # memory-mapped
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{wpath}: unreadable safetensors file ({str(e).splitlines()[0][:120]})") from None
    if (header.get("__metadata__") or {}).get(INT4_LAYOUT_KEY) != INT4_LAYOUT:
        _regroup_int4(sd)
    mapped = MappedWeights()
    groups = qkv_groups(model) if fused_file else []
    fused_in_file = {n for _, _, names in groups for n in names.values()}
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n not in fused_in_file]
    for n, m in targets:
        q = _linear_class(n, mode, gained, nl).from_packed(sd[f"{n}.qweight"], sd[f"{n}.scale"], sd.get(f"{n}.bias"),
                                                       m.in_features, in_gain=sd.get(f"{n}.in_gain"))
        parent, _, leaf = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, q)
    del targets, m
    if h4:                                  # the int8 head's int4 copy, mapped as it lies
        from .engine import two_level_head as head4
        head4.attach(model.head, sd[H4_KEYS[0]], sd[H4_KEYS[1]])
    if tied:                                # the embedding: the head's int8 rows (shapes checked: _compare)
        from .engine.head_embed import HeadRowsEmbedding
        model.embed = HeadRowsEmbedding(model.head, torch.empty(cfg.d_model))
    for k, v in sd.items():                 # the other tensors: big floats stay mapped, small buffers are copied
        if not k.endswith((".qweight", ".scale", ".q4weight", ".q4scale")) and not (v.is_floating_point()
                                                                             and v.nbytes >= KEEP_MAPPED_BYTES):
            sd[k] = mapped.copy_out(v, v.dtype)
    if fused_file:
        _fused_from_file(model, sd, mode, groups, gained, nl)
    model.load_state_dict(sd, strict=True, assign=True)
    del sd
    if not fused_file and hasattr(model, "blocks"):
        pieces = [t for b in model.blocks for lin in (b.attn.w_q, b.attn.w_kv_local, b.attn.w_kv_global)
                  if lin is not None for t in (lin.qweight, lin.scale)]
        fuse_qkv(model)                     # the fused rows are a copy: the pieces' pages of the file go back
        for t in pieces:
            mapped.drop(t)
        del pieces
    release_freed_memory()
    if check_finite and (bad := first_nonfinite(model)):
        raise CheckpointError(f"{wpath}: {bad} holds NaN or infinite values (a damaged file)")
    model.stored_quant = mode
    return model.eval()


def _regroup_int4(sd: dict) -> None:
    """An older file's plain int4 tensors (uint8 packed rows and their fp16 scales) in the grouped layout, in sd."""
    from .engine.int4_layout import grouped, int4_pairs
    for k, sk in int4_pairs(sd):
        sd[k], sd[sk] = grouped(sd[k], sd[sk])


def _fused_from_file(model, sd: dict, mode: str, groups, gained: bool = False, n_layers: int | None = None) -> None:
    """Versions 2 to 4: model.fused_qkv, one quant Linear per attention holding the file's ATTN.w_qkv tensors as they lie
    (taken out of sd), and its q/k/v Linears made of views of their rows (engine/fused.py's piece_rows; a copy only
    for a piece whose rows split around another's), their tensors put in sd under their own names: what quantize_cpu
    leaves, with no copy of the mapped rows."""
    from .engine.fused import piece_packed, piece_rows, piece_runs
    fused = []
    for attn, pieces, names in groups:
        first = pieces[0][0]
        cls = _linear_class(names[first], mode, gained, n_layers)
        gain = sd.pop(f"{attn}.{QKV}.in_gain", None)
        f = cls.from_packed(sd.pop(f"{attn}.{QKV}.qweight"), sd.pop(f"{attn}.{QKV}.scale"),
                            sd.pop(f"{attn}.{QKV}.bias", None), first.in_features, in_gain=gain)
        for lin, runs in piece_runs(pieces).items():
            parts = dict(zip(("qweight", "scale"), piece_packed(f, lin, runs)))
            bias = None if f.bias is None else piece_rows(f.bias.detach(), lin, runs)
            q = cls.from_packed(parts["qweight"], parts["scale"], bias, lin.in_features, in_gain=f.in_gain)
            q.in_gain = f.in_gain                    # the fused Linear's own tensor, shared
            n = names[lin]
            parent, _, leaf = n.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, q)
            sd.update({f"{n}.{k}": v for k, v in parts.items()})
            if bias is not None:
                sd[f"{n}.bias"] = q.bias
            if f.in_gain is not None:
                sd[f"{n}.in_gain"] = f.in_gain
        fused.append(f)
    model.fused_qkv = fused


def configure(model, options) -> bool:
    """Set the engine options a quantize_cpu run would fix into each quant Linear (prefill_bf16, native) on a
    stored-quantized model's Linears, the fused q/k/v ones included, and whether each hands its mapped pages back
    after its forward (options.drop_pages, resolved for this model: engine/page_drop.py), and the two-level int4
    head's copy dropped where options.head4 is off. Returns whether pages go back."""
    from .engine import page_drop
    from .engine import two_level_head as head4
    from .engine.quant import Int4Linear, Int8Linear
    if not options.head4:
        head4.detach(model.head)            # the two-level head off: the int8 head alone
    mods = [m for m in model.modules() if type(m) in (Int8Linear, Int4Linear)]
    for m in [*mods, *getattr(model, "fused_qkv", [])]:
        m.prefill_bf16, m.native = options.prefill_bf16, bool(options.native)
    drop = page_drop.resolve(options.drop_pages, model)
    page_drop.arm(model, drop)
    return drop


def mismatch(stored: str, quant: str) -> str:
    """The one line for a chat asking another mode than a stored-quantized model's."""
    return (f"the model is stored {stored} (packed at import): run it with --quant {stored} or auto; "
            f"for --quant {quant} import it again with --quant none")


def param_counts(model) -> tuple[int, int]:
    """(parameters, Linear parameters) of a model as its full-precision form counts them (num_params,
    num_linear_params): a quant Linear's weights are buffers, counted here as the in x out values they stand for, and
    so is an embedding read from the head rows (version 2: the V x d table it stands for)."""
    import torch

    from .engine.head_embed import HeadRowsEmbedding
    from .engine.quant import Int4Linear, Int8Linear
    packed = sum(m.in_features * m.out_features for m in model.modules() if type(m) in (Int8Linear, Int4Linear))
    plain = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    emb = model.embed.num_embeddings * model.embed.embedding_dim if isinstance(model.embed, HeadRowsEmbedding) else 0
    return sum(p.numel() for p in model.parameters()) + packed + emb, plain + packed
