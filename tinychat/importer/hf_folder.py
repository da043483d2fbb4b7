"""Reading a Hugging Face llama-family folder: config.json, model.safetensors (or shards listed by
model.safetensors.index.json), tokenizer.json, the chat template (tokenizer_config.json, or chat_template.jinja) and
the stop tokens it names (tokenizer_config.json's eos_token, generation_config.json's eos_token_id). Safetensors
only: a folder with just pytorch_model.bin is refused (tinychat never unpickles)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import ImportRefused


def _json(path: Path, required: bool = True):
    if not path.is_file():
        if required:
            raise ImportRefused(f"{path.parent}: no {path.name}")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImportRefused(f"{path}: malformed JSON ({' '.join(str(e).split())[:100]})") from None


def _weight_files(folder: Path) -> list[Path]:
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = _json(folder / "model.safetensors.index.json", required=False)
    if index is not None:
        files = sorted(set((index.get("weight_map") or {}).values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if not files or missing:
            raise ImportRefused(f"{folder}: model.safetensors.index.json names missing shards "
                                f"({', '.join(missing[:3]) or 'none listed'})")
        return [folder / f for f in files]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ImportRefused(f"{folder}: only pickle weights (*.bin / *.pt); tinychat reads safetensors only "
                            "(convert them, or import a GGUF file)")
    raise ImportRefused(f"{folder}: no model.safetensors (or model.safetensors.index.json with its shards)")


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    out = {}
    for f in _weight_files(folder):
        try:
            out.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ImportRefused(f"{f}: unreadable safetensors file ({str(e).splitlines()[0][:100]})") from None
    return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}


def _token_text(t) -> str | None:
    if isinstance(t, str):
        return t
    if isinstance(t, dict) and isinstance(t.get("content"), str):
        return t["content"]
    return None


def read_hf_folder(folder: str | Path):
    """(config dict, tensors, tokenizer.json text, chat template or None, stop token strings)."""
    folder = Path(folder)
    cfg = _json(folder / "config.json")
    if not isinstance(cfg, dict):
        raise ImportRefused(f"{folder / 'config.json'}: not a JSON object")
    tok_path = folder / "tokenizer.json"
    if not tok_path.is_file():
        raise ImportRefused(f"{folder}: no tokenizer.json (a fast Hugging Face tokenizer is needed)")
    tok_text = tok_path.read_text(encoding="utf-8")
    tcfg = _json(folder / "tokenizer_config.json", required=False) or {}
    template = tcfg.get("chat_template")
    if isinstance(template, list):          # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    vocab = {}
    try:
        spec = json.loads(tok_text)
        vocab = dict((spec.get("model") or {}).get("vocab") or {})
        vocab.update({t["content"]: t["id"] for t in spec.get("added_tokens") or ()})
    except (json.JSONDecodeError, AttributeError, TypeError, KeyError):
        raise ImportRefused(f"{tok_path}: not a Hugging Face tokenizer.json") from None
    by_id = {i: t for t, i in vocab.items()}
    stops = []
    eos = _token_text(tcfg.get("eos_token"))
    if eos:
        stops.append(eos)
    gen = _json(folder / "generation_config.json", required=False) or {}
    ids = gen.get("eos_token_id", cfg.get("eos_token_id"))
    for i in ids if isinstance(ids, list) else [ids]:
        if isinstance(i, int) and i in by_id and by_id[i] not in stops:
            stops.append(by_id[i])
    return cfg, read_tensors(folder), tok_text, template, stops
