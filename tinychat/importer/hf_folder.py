"""Reading a Hugging Face llama-family folder: config.json, model.safetensors (or shards listed by
model.safetensors.index.json), tokenizer.json, the chat template (tokenizer_config.json, or chat_template.jinja) and
the stop tokens it names (tokenizer_config.json's eos_token, generation_config.json's eos_token_id). Safetensors
only: a folder with just pytorch_model.bin is refused (tinychat never unpickles)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import ImportRefused


def _root(folder: Path) -> Path:
    """Where the folder's files may lie: the folder itself, or for a Hugging Face cache snapshot
    (.../models--ORG--NAME/snapshots/REV) the repository's folder, whose blobs/ its files link to."""
    folder = folder.resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


def _inside(folder: Path, name: str) -> Path:
    """folder / name, refused (ImportRefused) when the name is not a plain relative path or the file (a symbolic
    link followed) lies outside the folder: a model folder never brings in files from elsewhere on the disk (an index
    naming "../../.ssh/id_rsa", a chat_template.jinja linking to a private file)."""
    p = Path(name)
    if not isinstance(name, str) or not name or p.is_absolute() or ".." in p.parts:
        raise ImportRefused(f"{folder}: {name!r:.60} is not a file name inside the folder")
    path = folder / p
    if path.exists() and not path.resolve().is_relative_to(_root(folder)):
        raise ImportRefused(f"{path}: a link to a file outside the model folder ({path.resolve()}); "
                            "copy the file into the folder")
    return path


def _json(path: Path, required: bool = True, kind: type = dict):
    path = _inside(path.parent, path.name)
    if not path.is_file():
        if required:
            raise ImportRefused(f"{path.parent}: no {path.name}")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ImportRefused(f"{path}: malformed JSON ({' '.join(str(e).split())[:100]})") from None
    if not isinstance(data, kind):
        raise ImportRefused(f"{path}: not a JSON {'object' if kind is dict else kind.__name__}")
    return data


def _weight_files(folder: Path) -> list[Path]:
    if _inside(folder, "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = _json(folder / "model.safetensors.index.json", required=False)
    if index is not None:
        wmap = index.get("weight_map") or {}
        if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
            raise ImportRefused(f"{folder}: model.safetensors.index.json's weight_map is not {{tensor: file name}}")
        files = sorted(set(wmap.values()))
        paths = [_inside(folder, f) for f in files]
        missing = [f for f, p in zip(files, paths) if not p.is_file()]
        if not files or missing:
            raise ImportRefused(f"{folder}: model.safetensors.index.json names missing shards "
                                f"({', '.join(missing[:3]) or 'none listed'})")
        return paths
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ImportRefused(f"{folder}: only pickle weights (*.bin / *.pt); tinychat reads safetensors only "
                            "(convert them, or import a GGUF file)")
    raise ImportRefused(f"{folder}: no model.safetensors (or model.safetensors.index.json with its shards)")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ImportRefused(f"{path}: not UTF-8 text (byte {e.start})") from None


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
    tok_path = _inside(folder, "tokenizer.json")
    if not tok_path.is_file():
        raise ImportRefused(f"{folder}: no tokenizer.json (a fast Hugging Face tokenizer is needed)")
    tok_text = _text(tok_path)
    tcfg = _json(folder / "tokenizer_config.json", required=False) or {}
    template = tcfg.get("chat_template")
    if isinstance(template, list):          # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if template is not None and not isinstance(template, str):
        raise ImportRefused(f"{folder / 'tokenizer_config.json'}: chat_template is not a template (text)")
    if template is None and _inside(folder, "chat_template.jinja").is_file():
        template = _text(folder / "chat_template.jinja")
    vocab = {}
    try:
        spec = json.loads(tok_text)
        vocab = dict((spec.get("model") or {}).get("vocab") or {})
        vocab.update({t["content"]: t["id"] for t in spec.get("added_tokens") or ()})
        by_id = {i: t for t, i in vocab.items()}
    except (ValueError, AttributeError, TypeError, KeyError, RecursionError):
        raise ImportRefused(f"{tok_path}: not a Hugging Face tokenizer.json") from None
    stops = []
    eos = _token_text(tcfg.get("eos_token"))
    if eos:
        stops.append(eos)
    gen = _json(folder / "generation_config.json", required=False) or {}
    if "eos_token" in tcfg and tcfg["eos_token"] is not None and eos is None:
        raise ImportRefused(f"{folder / 'tokenizer_config.json'}: eos_token is neither a token nor {{\"content\": "
                            "token}")
    ids = gen.get("eos_token_id", cfg.get("eos_token_id"))
    for i in ids if isinstance(ids, list) else [ids]:
        if isinstance(i, int) and i in by_id and by_id[i] not in stops:
            stops.append(by_id[i])
    return cfg, read_tensors(folder), tok_text, template, stops
