"""The user's imported models: one folder per model under paths.models_dir(), listed by `tinychat models` and
opened by name with `tinychat --model NAME`. No torch here (listing models must be instant)."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from .. import paths
from .errors import ImportRefused
from ..quant_files import WEIGHTS_FILE, older_int4_layout, read_header, stored_mode
from .lock import acquire, sweep

IMPORT_FILE = "import.json"      # where the model came from, its chat format and stop tokens
CHAT_FORMAT_FILE = "chat_format.json"
TEMPLATE_FILE = "chat_template.jinja"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def check_name(name: str) -> str:
    if not _NAME.match(name or "") or name in (".", ".."):
        raise ImportRefused(f"model name {name!r}: use letters, digits, '.', '_' or '-' (at most 80, no '/')")
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


def pulled_as(repo: str, quant: str | None = None) -> list[str]:
    """The names of the imported models `tinychat pull` took from the Hugging Face repo `repo` (import.json's hub
    record; case-insensitive), only those of GGUF type `quant` when given: what `--model ORG/NAME[:QUANT]` opens."""
    root = paths.models_dir()
    if not root.is_dir():
        return []
    out = []
    for d in _model_dirs(root):
        try:
            hub = json.loads((d / IMPORT_FILE).read_text(encoding="utf-8")).get("hub")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(hub, dict) or str(hub.get("repo", "")).lower() != repo.lower():
            continue
        if quant is None or str(hub.get("quant") or "").lower() == quant.lower():
            out.append(d.name)
    return out


def _model_dirs(root: Path) -> list[Path]:
    """The imported model folders under root, by name (.NAME.importing: an import under way, not one)."""
    return [d for d in sorted(root.iterdir()) if not d.name.startswith(".") and (d / "config.json").is_file()]


def close_names(name: str, limit: int = 3) -> list[str]:
    """Imported models' names a mistyped --model NAME may have meant: those that start with it (an import keeps its
    file's suffix: SmolLM2-135M-Instruct.Q4_1) or contain it, ignoring case, then difflib's close matches."""
    import difflib
    root = paths.models_dir()
    if not root.is_dir():
        return []
    names = [d.name for d in _model_dirs(root)]
    low = name.lower()
    near = [n for n in names if n.lower().startswith(low)] + [n for n in names if low in n.lower()
                                                              and not n.lower().startswith(low)]
    near += [n for n in difflib.get_close_matches(name, names, n=limit, cutoff=0.6) if n not in near]
    return near[:limit]


def list_models() -> list[dict]:
    """[{name, path, source, format, params, quant, bytes, disk_bytes}] for every imported model folder, by name.
    quant: the mode its weights are stored in (quant_files.stored_mode: "int8", "int4"), None for full precision;
    older_layout: its int4 tensors are in an older tinychat's layout, converted at every load (import it again). bytes:
    the files' sizes; disk_bytes: what they take on the disk (allocated blocks, as du counts them). Leftovers of
    killed imports are swept first (lock.sweep)."""
    root = paths.models_dir()
    out = []
    if not root.is_dir():
        return out
    sweep(root)
    for d in _model_dirs(root):
        meta = {}
        try:
            meta = json.loads((d / IMPORT_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            pass
        if not isinstance(meta, dict):
            meta = {}
        fmt = meta.get("chat_format")
        size, disk = folder_size(d)
        header = read_header(d / WEIGHTS_FILE) or {}       # read once for both of its facts
        out.append({"name": d.name, "path": str(d), "source": str(meta.get("source", "?")),
                    "format": str(fmt.get("format", "?")) if isinstance(fmt, dict) else "?",
                    "params": meta.get("params") if isinstance(meta.get("params"), int) else None,
                    "quant": stored_mode(d, header), "older_layout": older_int4_layout(d, header),
                    "bytes": size, "disk_bytes": disk})
    return out


def folder_size(folder: Path) -> tuple[int, int]:
    """(bytes of the files, bytes allocated on the disk) of a folder and everything under it; links not followed."""
    size = disk = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            size += st.st_size
            disk += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return size, disk


def human_bytes(n: int) -> str:
    """1.2 GiB, 623 MiB, 41.5 KiB, 512 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n} B"


def remove_model(name: str) -> Path:
    """Delete the imported model `name` (its folder); ImportRefused when there is none, ModelBusy while a chat has
    it open or an import writes it. The folder is renamed out of the way first, so it disappears at once and a
    kill midway leaves a leftover that the next listing sweeps, never half a model."""
    try:
        path = model_path(name)
    except ValueError as e:
        raise ImportRefused(str(e)) from None
    root = path.parent
    with acquire(root, name, shared=False, action="rm"):     # its file goes with it
        if not path.is_dir() and not path.is_symlink():
            raise ImportRefused(f"no imported model named {name!r} (`tinychat models` lists them)")
        gone = root / f".{name}.removing"
        if gone.is_dir() and not gone.is_symlink():
            shutil.rmtree(gone)
        path.rename(gone)
        if gone.is_symlink() or not gone.is_dir():
            gone.unlink()
        else:
            shutil.rmtree(gone, ignore_errors=True)
    return path
