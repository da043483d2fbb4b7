"""import_model: read a source (HF folder or GGUF file), check it, convert it and write the tinychat model folder.
The folder is written under a temporary name and renamed into place, so a failed import leaves nothing behind."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from ..fsutil import atomic_write
from ..model_config import TOKENIZER_FILE
from ..tokenizer import CHAT_FORMATS, Tokenizer, TokenizerError
from . import chat_format
from ..sampler_defaults import SAMPLER_FILE
from .errors import ImportRefused
from .lock import acquire, sweep
from .sampler import model_sampler
from .store_mode import STORE_CHOICES, resolve_store
from .store import CHAT_FORMAT_FILE, IMPORT_FILE, TEMPLATE_FILE, check_name, model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def open_source(src: Path):
    """None for a Hugging Face folder, else the GGUF file's reader (opened once: its metadata's parse takes seconds on
    a big vocabulary); ImportRefused (one line) for anything else."""
    if not src.exists():
        raise ImportRefused(f"{src}: no such file or folder")
    if src.is_dir():
        return None
    with open(src, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ImportRefused(f"{src}: neither a Hugging Face model folder nor a GGUF file")
    from .gguf_file import open_reader
    return open_reader(src)


def read_source(src: Path, reader):
    """(config dict, tensors, tokenizer.json text, chat template, stop tokens) of a folder (reader None) or a .gguf
    file (its open_source reader)."""
    if reader is None:
        from .hf_folder import read_hf_folder
        return read_hf_folder(src)
    from .gguf_file import read_gguf
    return read_gguf(src, reader)


def default_name(src: Path) -> str:
    stem = src.name[:-5] if src.name.lower().endswith(".gguf") else src.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "model"
    return name[:80]


STAGES = ("reading the weights", "converting", "writing the model folder")


def import_model(src, name: str | None = None, context: int | None = None, dtype: str = "float32",
                 force: bool = False, progress=None, origin: dict | None = None, quant: str = "auto") -> Path:
    """Import src as a tinychat model named `name` (default: from the source's file / folder name). Returns its
    folder. ImportRefused (one line) for anything it cannot import; FileExistsError-like refusal when the name is
    taken (unless force). progress(done, total, what): called as each of STAGES starts and when all are done (an
    import of SmolLM2-135M's GGUF spends ~10-20 s in each of the first two on a 2-vCPU host). origin: what
    import.json records of where src came from, over the defaults (`tinychat pull`: {"source": "REPO@COMMIT
    (Hugging Face)", "hub": {...}}). The folder gets the model's sampler.json. quant: "none" (the weights in
    dtype), "int8" / "int4" (the Linears stored packed as `--quant` makes them at start: quant_files.py), or "auto"
    (store_mode.py: a GGUF's own bits say which; import.json records the mode and why)."""
    def stage(i: int) -> None:
        if progress is not None:
            progress(i, len(STAGES), STAGES[i] if i < len(STAGES) else "done")
    src = Path(src).expanduser()
    try:
        name = check_name(name or default_name(src))
    except ValueError as e:
        raise ImportRefused(str(e)) from None
    if dtype not in DTYPES:
        raise ImportRefused(f"--dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if quant not in STORE_CHOICES:
        raise ImportRefused(f"--quant must be one of {', '.join(STORE_CHOICES)} (got {quant!r})")
    if quant in ("int8", "int4") and dtype != "float32":
        raise ImportRefused(f"--dtype {dtype} goes with full-precision imports; --quant {quant} stores packed weights "
                            "made from the float32 ones")
    from ..weights_check import MAX_POSITIONS
    if context is not None and not 16 <= context <= MAX_POSITIONS:
        raise ImportRefused(f"--context must be between 16 and {MAX_POSITIONS:,} positions (got {context:,})")
    dest = model_path(name)
    if dest.exists() and not force:
        raise ImportRefused(f"a model named {name!r} exists already ({dest}); pick another --name or add --force")
    sweep(dest.parent)                                   # what killed imports left (their names' locks are free)
    with acquire(dest.parent, name, shared=False, action="import"):   # no other import of the name, no chat on it
        if dest.exists() and not force:                  # imported by another process meanwhile
            raise ImportRefused(f"a model named {name!r} exists already ({dest}); pick another --name or add --force")
        return _import(src, name, dest, context, dtype, stage, origin, quant)


def _import(src: Path, name: str, dest: Path, context: int | None, dtype: str, stage, origin: dict | None,
            quant: str = "none") -> Path:
    """import_model's work, under the name's exclusive lock."""
    stage(0)
    reader = open_source(src)
    cfg, tensors, tok_text, template, stops = read_source(src, reader)
    quant, quant_why = resolve_store(reader, quant, dtype)
    from ..norm_gains import save_gains
    from .llama import build_config, build_model, check_tensors
    c = build_config(cfg, tensors, context, name)        # refuse unsupported architectures before any heavy work
    check_tensors(c, cfg, tensors)                       # and tensors the config does not imply, or NaN / Inf
    fmt = chat_format.detect(template, stops)
    try:
        tok = Tokenizer.from_str(tok_text, source=f"{src} (tokenizer)", chat=CHAT_FORMATS[fmt["format"]])
    except TokenizerError as e:
        raise ImportRefused(str(e)) from None
    # the checkpoint's own parameter count (what its card says: SmolLM2-135M, 134.5M): a tied head counted once, as
    # the source holds it (the stored model has it untied, and norm gains folded, so model.num_params() is not it)
    params = sum(t.numel() for k, t in tensors.items() if not k.endswith("rotary_emb.inv_freq"))
    stage(1)
    model = build_model(cfg, tensors, context, name, checked=True)
    if tok.vocab_size > model.cfg.vocab_size:
        raise ImportRefused(f"tokenizer has {tok.vocab_size} tokens, the model's embedding only {model.cfg.vocab_size}")
    missing = [s for s in fmt["stop_tokens"] if tok.hf.token_to_id(s) is None]
    if missing:
        raise ImportRefused(f"stop token(s) {', '.join(missing)} not in the tokenizer")
    fmt["stop_ids"] = [tok.hf.token_to_id(s) for s in fmt["stop_tokens"]]
    tmp = dest.parent / f".{name}.importing"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    stage(2)
    try:
        if quant == "none":
            model.save_pretrained(tmp, dtype=DTYPES[dtype])
            save_gains(model, tmp)                    # the norm gains, for --quant at start (norm_gains.py)
        else:
            from ..quant_files import save_quantized
            try:
                save_quantized(model, tmp, quant)
            except ValueError as e:
                raise ImportRefused(str(e)) from None
        atomic_write(tmp / TOKENIZER_FILE, lambda t: t.write_text(tok_text, encoding="utf-8"))
        atomic_write(tmp / CHAT_FORMAT_FILE, lambda t: t.write_text(json.dumps(fmt, indent=2), encoding="utf-8"))
        if template:
            atomic_write(tmp / TEMPLATE_FILE, lambda t: t.write_text(template, encoding="utf-8"))
        meta = {"source": str(src.resolve()), "kind": "gguf" if src.is_file() else "huggingface",
                "architecture": cfg.get("model_type"), "params": params, "dtype": dtype, "quant": quant,
                **({"quant_why": quant_why} if quant_why else {}),
                "chat_format": fmt, **(origin or {})}
        atomic_write(tmp / IMPORT_FILE, lambda t: t.write_text(json.dumps(meta, indent=2), encoding="utf-8"))
        hints = [str((origin or {}).get("hub", {}).get("repo", "")), str(fmt.get("default_system") or "")]
        sampler = model_sampler(src, hints, model.cfg.max_seq_len)
        atomic_write(tmp / SAMPLER_FILE, lambda t: t.write_text(sampler.to_json(), encoding="utf-8"))
        old = dest.parent / f".{name}.removing"       # --force: the old model out of the way, the new one in
        if dest.exists():
            if old.exists():
                shutil.rmtree(old)
            dest.rename(old)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    stage(len(STAGES))
    return dest
