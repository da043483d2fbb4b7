"""A session's KV snapshot (`<id>.kv.safetensors` beside its file) and model identity hashes."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tinychat.fsutil import atomic_write
from tinychat.jsonfields import one_line, show
from tinychat.sessions.session import SNAPSHOT_FORMAT, SessionError, SnapshotError, snapshot_path


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_hash(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """sha256 of a file, read in chunks (weights can be hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def identity_hash(config: Mapping[str, Any] | Any, weights_path: str | Path) -> str:
    """Model identity = sha256 over the config (canonical JSON: sorted keys, tuples as lists) + the weights' hash.

    `config` is a dict or a dataclass (e.g. ModelConfig). Same weights under another config is another model.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    canon = json.dumps(dict(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    h = hashlib.sha256(b"tinychat.model-identity/1\0")
    h.update(canon.encode("ascii"))
    h.update(b"\0" + file_hash(weights_path).encode("ascii"))
    return h.hexdigest()


# -- KV snapshots ---------------------------------------------------------------------------------------------
# `<id>.kv.safetensors` holds whatever tensors the runtime hands over (its cache buffers) plus string metadata.
# Two reserved metadata keys tie the file to its session; the caller's `meta` should say what the snapshot is
# valid for (model identity hash, quant, dtype, number of tokens) so the runtime can refuse a stale one.

_META_FORMAT = "tinychat.kv_format"
_META_SESSION = "tinychat.session_id"


def save_snapshot(
    session_id: str, tensors: Mapping[str, Any], meta: Mapping[str, str], dir: str | Path | None = None
) -> Path:
    """Atomically write `tensors` (name -> contiguous torch.Tensor, no shared storage) and `meta` (str -> str)."""
    from safetensors.torch import save_file

    target = snapshot_path(session_id, dir)
    bad = [k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"snapshot metadata must map str to str; bad key(s): {bad[:3]}")
    if any(k.startswith("tinychat.") for k in meta):
        raise ValueError("snapshot metadata keys starting with 'tinychat.' are reserved")
    full_meta = {**meta, _META_FORMAT: SNAPSHOT_FORMAT, _META_SESSION: session_id}
    try:
        atomic_write(target, lambda tmp: save_file(dict(tensors), str(tmp), metadata=full_meta))
    except Exception as e:  # noqa: BLE001  OSError, or safetensors' own error ("I/O error") on a full disk
        with contextlib.suppress(OSError):  # an older snapshot no longer matches the session: never load it
            if target.is_file():
                target.unlink()
        detail = getattr(e, "strerror", None) or one_line(e)[:160]
        raise SnapshotError(f"{target}: cannot write the KV snapshot ({detail})") from None
    return target


def tensors_sha256(tensors: Mapping[str, Any]) -> str:
    """sha256 over a snapshot's tensors (names, dtypes, shapes and bytes, in name order): what a session records
    of its snapshot, so a snapshot damaged on disk (the header intact, the numbers not) is never used."""
    import torch

    h = hashlib.sha256(b"tinychat.kv-tensors/1\0")
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def load_snapshot(
    session_id: str, dir: str | Path | None = None, device: str = "cpu"
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(tensors, meta) from `<id>.kv.safetensors`, None when there is none; SessionError when it is unusable."""
    path = snapshot_path(session_id, dir)
    if not path.exists():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            meta = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # noqa: BLE001  safetensors raises its own error types (and OSError) for damaged files
        raise SessionError(f"{path}: corrupt KV snapshot ({one_line(e)[:160]})") from None
    if meta.get(_META_FORMAT) != SNAPSHOT_FORMAT:
        raise SessionError(f"{path}: not a tinychat KV snapshot (format {show(meta.get(_META_FORMAT))})")
    if meta.get(_META_SESSION) != session_id:
        raise SessionError(f"{path}: KV snapshot belongs to session {show(meta.get(_META_SESSION))}")
    return tensors, {k: v for k, v in meta.items() if not k.startswith("tinychat.")}
