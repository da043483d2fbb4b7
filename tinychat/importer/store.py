"""The user's imported models: one folder per model under paths.models_dir(), listed by `tinychat models` and
opened by name with `tinychat --model NAME`. No torch here (listing models must be instant)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .. import paths

IMPORT_FILE = "import.json"      # where the model came from, its chat format and stop tokens
CHAT_FORMAT_FILE = "chat_format.json"
TEMPLATE_FILE = "chat_template.jinja"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def check_name(name: str) -> str:
    if not _NAME.match(name or "") or name in (".", ".."):
        raise ValueError(f"model name {name!r}: use letters, digits, '.', '_' or '-' (at most 80, no '/')")
    return name


def model_path(name: str) -> Path:
    return paths.models_dir() / check_name(name)


def resolve(model: str | Path | None) -> Path | None:
    """--model as given: an existing path wins; else the name of an imported model; else the path unchanged (so the
    loader's own "no such model folder" error speaks)."""
    if model is None:
        return None
    p = Path(model)
    if p.exists() or "/" in str(model) or not _NAME.match(str(model)):
        return p
    q = paths.models_dir() / str(model)
    return q if (q / "config.json").is_file() else p


def list_models() -> list[dict]:
    """[{name, path, source, format, params, bytes}] for every imported model folder, by name."""
    root = paths.models_dir()
    out = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not (d / "config.json").is_file():    # .NAME.importing: an import under way
            continue
        meta = {}
        try:
            meta = json.loads((d / IMPORT_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            pass
        size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
        out.append({"name": d.name, "path": str(d), "source": meta.get("source", "?"),
                    "format": meta.get("chat_format", {}).get("format", "?"), "params": meta.get("params"),
                    "bytes": size})
    return out
