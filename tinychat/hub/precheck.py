"""Refusing a model before its weights download: the checks `tinychat import` makes, run on what a few KiB (config.json,
tokenizer_config.json) or MiB (a GGUF's header) already say. Same rules, same one-line reasons (importer/llama.py,
importer/chat_format.py, importer/gguf_file.py), prefixed by the repo."""
from __future__ import annotations

import json
from pathlib import Path

from ..importer import chat_format
from ..importer.errors import ImportRefused
from .errors import PullError


def _refused(where: str, e: ImportRefused) -> PullError:
    return PullError(f"{where}: {e}")


def check_hf_files(where: str, folder: Path) -> dict:
    """The config of an HF folder holding at least config.json (and tokenizer_config.json / chat_template.jinja
    when the repo has them), after the importer's architecture and chat-template checks; PullError when refused."""
    from ..importer.llama import check_supported
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PullError(f"{where}: config.json is not readable ({' '.join(str(e).split())[:100]})") from None
    template = None
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        try:
            tcfg = json.loads(tc.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            tcfg = {}
        template = tcfg.get("chat_template") if isinstance(tcfg, dict) else None
        if isinstance(template, list):
            template = next((t.get("template") for t in template if isinstance(t, dict)
                             and t.get("name") == "default"), None)
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    try:
        check_supported(cfg)
        chat_format.detect(template, [])
    except ImportRefused as e:
        raise _refused(where, e) from None
    return cfg


def check_gguf_metadata(where: str, meta: dict) -> dict:
    """The HF-style config of a GGUF's header (importer/gguf_file.hf_config), after the importer's checks: the
    architecture, the tokenizer (byte-level BPE with a known pre-tokenizer) and the chat template."""
    from ..importer.gguf_file import PRE_TOKENIZERS, hf_config
    from ..importer.llama import check_supported
    from ..importer.gguf_header import MetadataReader
    try:
        cfg = hf_config(MetadataReader(meta))
        check_supported(cfg)
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ImportRefused(f"only byte-level BPE (gpt2) GGUF tokenizers are supported, got {model!r}")
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        if pre not in PRE_TOKENIZERS:
            raise ImportRefused(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
        chat_format.detect(meta.get("tokenizer.chat_template"), [])
    except ImportRefused as e:
        raise _refused(where, e) from None
    except (TypeError, ValueError) as e:
        raise PullError(f"{where}: the GGUF header has a bad value ({' '.join(str(e).split())[:100]})") from None
    return cfg


def import_bytes(cfg: dict, bytes_per_weight: int = 4) -> int:
    """What `tinychat import` writes for a config (float32 by default): every weight once, the head stored untied
    (importer/llama.py folds the final norm into it), norms folded away; 0 when the config lacks a size."""
    try:
        d, L = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        H = int(cfg["num_attention_heads"])
        Hk = int(cfg.get("num_key_value_heads") or H)
        D = int(cfg.get("head_dim") or d // H)
        F, V = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    per_layer = d * H * D + 2 * d * Hk * D + H * D * d + 3 * d * F + (H + 2 * Hk) * D
    return (2 * V * d + L * per_layer) * bytes_per_weight
