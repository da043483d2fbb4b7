"""A model's identity: what a session ties itself to, and why a session does not belong to a model.

model_identity is sha256 over the config and every weight as loaded. Every start hashed the whole model: ~0.07 s for
the shipped model, ~0.5 s for an imported fp32 SmolLM2-135M (650 MB), a fifth of its start. The identity is a
function of the folder's config.json and model.safetensors alone (loading is deterministic), so cached_identity keeps
it under the cache folder keyed by those files' device, inode, size and modification time (ns): a file written again
(an import with --force, a new export: atomic renames, so a new inode) is hashed again. SCHEME changes whenever what
the identity covers changes. The cache is a convenience: an entry that cannot be read, or a folder that cannot be
written, only means hashing.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import torch

from .fsutil import atomic_write
from .mapped import MappedWeights
from .nativebuild import cache_dir
from .norm_gains import GAINS_FILE

SCHEME = 2      # 2: an identity is only remembered for weights found finite (no NaN / Inf) while hashed
DERIVED = (".q4weight", ".q4scale")    # the int4 head's copy (engine/two_level_head.py): derived, on / off by option
FILES = ("config.json", "model.safetensors")     # and norm_gains.py's GAINS_FILE where there is one


def model_identity(model, check_finite: bool = True) -> str:
    """sha256 over config + every weight tensor (call before quantizing): what a session ties itself to.
    check_finite: refuse (CheckpointError, naming the tensor) weights holding a NaN or an infinity, found in the same
    read (a chat's load checks its weights here, once per file version: cached_identity)."""
    h = hashlib.sha256(json.dumps(model.cfg.to_dict(), sort_keys=True).encode())
    mapped = MappedWeights()              # weights still in the mapped file: its pages go back once hashed
    sd = model.state_dict()
    plain = _plain_int4(sd)
    for k, t in sorted(sd.items()):
        if k.endswith(DERIVED):
            continue
        h.update(k.encode())
        v = plain.get(k, t).detach().cpu().contiguous()
        floating = v.is_floating_point()
        widen = floating and v.dtype != torch.float32                # Linear weights kept as stored (bf16) hash
        for block in mapped.blocks(v):                                # as the fp32 values they load as; in parts,
            for part in block.reshape(-1).split(1 << 18):             # no whole-tensor copy (the same digest),
                if check_finite and floating and not bool(torch.isfinite(part).all()):  # a mapped block's pages
                    from .model_config import CheckpointError                            # dropped once read
                    raise CheckpointError(f"{k} holds NaN or infinite values (a damaged or badly converted "
                                          "checkpoint)")
                part = part.float() if widen else part
                h.update(part.view(torch.uint8).numpy())
    for k, t in sorted((getattr(model, "in_gains", None) or {}).items()):    # norm_gains.py: kept-apart gains
        h.update(f"in_gains.{k}".encode())
        h.update(t.detach().float().contiguous().view(torch.uint8).numpy())
    return h.hexdigest()


def _plain_int4(sd: dict) -> dict:
    """{key: tensor} of sd's int4 matrices (engine/int4_layout.py's int4_pairs, the head's derived copy left out) in the
    plain row-major layout, each pair converted once: the identity of a stored int4 file does not depend on the byte
    layout a tinychat holds it in, so sessions recorded before the grouped layout still belong to their model."""
    from .engine.int4_layout import int4_pairs, plain
    out = {}
    for k, sk in int4_pairs(sd):
        if not k.endswith(DERIVED):
            out[k], out[sk] = plain(sd[k].detach().cpu(), sd[sk].detach().cpu())
    return out


def other_model(sess, name: str, identity: str) -> str | None:
    """Why `sess` does not belong to the model (name, identity) at hand, or None when it does (or records none)."""
    rec = sess.model.get("hash", "")
    if not rec or rec == identity:
        return None
    was = sess.model.get("name") or ""
    if was and was == name:                  # the same name, other weights: a model updated since, or re-imported
        return (f"session {sess.id} was recorded with another version of the model {was!r} (weights {rec[:12]}, "
                f"this one {identity[:12]})")
    return f"session {sess.id} was recorded with another model ({was or rec[:12]})"


def file_key(folder: Path) -> list | None:
    """What the identity depends on: (name, device, inode, size, mtime_ns) of each file; None if one is missing."""
    key: list = [SCHEME, str(Path(folder).resolve())]
    for name in FILES:
        try:
            st = os.stat(Path(folder) / name)
        except OSError:
            return None
        key.append([name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
    try:                                        # optional: an import's norm gains (norm_gains.py), hashed too
        st = os.stat(Path(folder) / GAINS_FILE)
        key.append([GAINS_FILE, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
    except OSError:
        pass
    return key


def cached_identity(folder: Path, compute: Callable[[], str], where: Path | None = None) -> str:
    """The identity of the model in `folder`: remembered for its files' current versions, else compute() (then
    remembered). where: the cache folder (default: cache_dir("identity"))."""
    key = file_key(folder)
    if key is None:
        return compute()
    where = Path(where) if where is not None else cache_dir("identity")
    entry = where / (hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32] + ".json")
    try:
        rec = json.loads(entry.read_text())
        if rec.get("key") == key and isinstance(rec.get("identity"), str) and len(rec["identity"]) == 64:
            return rec["identity"]
    except (OSError, ValueError, AttributeError):
        pass
    identity = compute()
    if file_key(folder) == key:                 # the files did not change while they were hashed
        try:
            data = json.dumps({"key": key, "identity": identity})
            atomic_write(entry, lambda tmp: tmp.write_text(data))
        except OSError:
            pass
    return identity
