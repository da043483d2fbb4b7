"""The standard Hugging Face cache as tinychat reads it: where it is (huggingface_hub's HF_HUB_CACHE: HF_HOME/hub, or
HF_HUB_CACHE itself), a repo's snapshot for a revision, and which cached repos tinychat can import (fetched by
`tinychat pull`, llama.cpp's `-hf`, mlx or `hf download`). No torch; huggingface_hub only for the cache's location.

Layout (huggingface_hub's): HUB/models--ORG--NAME/{refs/REVISION (a commit hash), snapshots/COMMIT/PATH (links into
blobs/), blobs/ETAG}."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PullError
from .ref import RepoRef, gguf_choices

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")      # importer/llama.py's ARCHITECTURES (it has the final word)


def hub_module():
    """huggingface_hub, or PullError with the one line that installs it."""
    try:
        import huggingface_hub
    except ImportError:
        raise PullError("this needs huggingface_hub, the Hugging Face client: pip install huggingface_hub") from None
    return huggingface_hub


def constants():
    """huggingface_hub.constants: what it read from the environment (HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE)."""
    hub_module()
    from huggingface_hub import constants as c
    return c


def hub_cache() -> Path:
    """The hub cache folder huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else its default
    (~/.cache/huggingface/hub, or under XDG_CACHE_HOME). Read from the environment now, as the hub reads it when it
    is imported (a test may set them after that)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(constants().HF_HUB_CACHE).expanduser()


def repo_folder(repo: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache()) / ("models--" + repo.replace("/", "--"))


def snapshot_for(ref: RepoRef, cache: Path | None = None) -> Path | None:
    """The cached snapshot folder of ref's revision (a branch or tag through refs/, or a commit), None when absent."""
    folder = repo_folder(ref.repo, cache)
    rev = ref.revision or "main"
    commit = rev
    ref_file = folder / "refs" / rev
    if ref_file.is_file():
        commit = ref_file.read_text(encoding="utf-8").strip()
    snap = folder / "snapshots" / commit
    return snap if snap.is_dir() else None


def snapshot_files(snap: Path) -> dict[str, int]:
    """{path in the repo: size} of the files a snapshot holds (links to blobs resolved; dangling ones left out)."""
    out = {}
    for root, _dirs, files in os.walk(snap):
        for f in files:
            p = Path(root) / f
            try:
                out[p.relative_to(snap).as_posix()] = p.stat().st_size
            except OSError:
                continue
    return out


@dataclass
class CachedRepo:
    repo: str
    commit: str
    snapshot: Path
    kind: str                               # "safetensors" or "gguf"
    files: dict[str, int] = field(default_factory=dict)
    size: int = 0
    quants: list[str] = field(default_factory=list)


def _gguf_arch(path: Path) -> str | None:
    """general.architecture of a local GGUF, read from its header; None when unreadable."""
    from ..importer.errors import ImportRefused
    from ..importer.gguf_header import read_metadata
    try:
        with open(path, "rb") as f:
            meta = read_metadata(f, str(path))
    except (OSError, ImportRefused):
        return None
    return meta.get("general.architecture") if meta.get("tokenizer.ggml.model") == "gpt2" else None


def importable(repo: str, snap: Path) -> CachedRepo | None:
    """What tinychat could import from a cached snapshot: a safetensors llama-family folder (config.json of a
    supported model_type, tokenizer.json, the weights) or GGUFs of a supported architecture; else None."""
    files = snapshot_files(snap)
    commit = snap.name
    if "config.json" in files and "tokenizer.json" in files:
        try:
            cfg = json.loads((snap / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            cfg = {}
        weights = ["model.safetensors"] if "model.safetensors" in files else []
        if not weights and "model.safetensors.index.json" in files:
            try:
                idx = json.loads((snap / "model.safetensors.index.json").read_text(encoding="utf-8"))
                weights = sorted(set((idx.get("weight_map") or {}).values())) or ["?"]
            except (OSError, UnicodeDecodeError, ValueError, AttributeError):
                weights = ["?"]
        if isinstance(cfg, dict) and cfg.get("model_type") in SUPPORTED_TYPES and weights \
                and all(w in files for w in weights):
            return CachedRepo(repo, commit, snap, "safetensors", files, sum(files.values()))
    choices = [c for c in gguf_choices(files) if not c.split and _gguf_arch(snap / c.files[0]) in SUPPORTED_TYPES]
    if choices:
        return CachedRepo(repo, commit, snap, "gguf", files, sum(c.size for c in choices), [c.quant for c in choices])
    return None


def cached_repos(cache: Path | None = None) -> list[CachedRepo]:
    """The importable model repos in the cache, by repo id: for each, the snapshot refs/main names (else the newest)."""
    cache = cache or hub_cache()
    if not cache.is_dir():
        return []
    out = []
    for d in sorted(cache.glob("models--*")):
        parts = d.name.split("--")
        if len(parts) != 3 or not (d / "snapshots").is_dir():
            continue
        repo = f"{parts[1]}/{parts[2]}"
        snap = snapshot_for(RepoRef(repo), cache)
        if snap is None:
            snaps = sorted((s for s in (d / "snapshots").iterdir() if s.is_dir()), key=lambda s: s.stat().st_mtime)
            snap = snaps[-1] if snaps else None
        found = importable(repo, snap) if snap is not None else None
        if found is not None:
            out.append(found)
    return out
