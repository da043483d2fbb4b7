"""`tinychat pull REPO[:QUANT][@REVISION]`: a model from the Hugging Face Hub, downloaded into the standard cache by
huggingface_hub and imported from the cached snapshot by the importer (importer/run.py; never a second copy of the
download).

    plan (the repo's files at a commit: GGUF quant or safetensors set)  ->  check (config.json / the GGUF header,
    before any weights)  ->  size and disk space  ->  download (transfer.py)  ->  import (sampler.json included)

Offline (--offline or HF_HUB_OFFLINE=1) the plan comes from the cache alone, and nothing is fetched. A model already
pulled at the same commit and files is left as it is (a no-op). Every failure is a PullError of one line."""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from .cache import constants, hub_cache, hub_module, repo_folder, snapshot_files, snapshot_for
from .errors import PullError
from .ref import GgufChoice, RepoRef, gguf_choices, gguf_files, human_bytes, parse_ref, pick_quant
from .transfer import FileSpec, Interrupted, download, part_bytes, quiet

__all__ = ["Interrupted", "Plan", "PullResult", "plan", "pull"]

SMALL_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
               "model.safetensors.index.json")   # fetched (when the repo has them) before the weights, to check them
_NETWORK = {"ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError", "TransportError",
            "ProxyError", "RemoteProtocolError", "OfflineModeIsEnabled", "ConnectionError", "Timeout"}


class Reporter:
    """Where a pull says what it does: line(text) for a status line, progress(done, total) while bytes arrive."""

    def line(self, text: str) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass


@dataclass
class Plan:
    ref: RepoRef
    commit: str
    kind: str                                   # "gguf" or "safetensors"
    sizes: dict[str, int]                       # every file of the repo at commit (offline: of the snapshot)
    etags: dict[str, str | None] = field(default_factory=dict)
    choices: list[GgufChoice] = field(default_factory=list)
    choice: GgufChoice | None = None
    offline: bool = False
    shards: set = field(default_factory=set)    # a sharded safetensors repo's weight files (from its index)

    @property
    def files(self) -> list[str]:
        """What the import needs from the repo (safetensors shards join once the index is read)."""
        if self.kind == "gguf":
            return list(self.choice.files)
        return [f for f in (*SMALL_FILES, "tokenizer.json", "model.safetensors") if f in self.sizes] + \
            sorted(self.shards)

    def specs(self) -> list[FileSpec]:
        return [FileSpec(f, self.sizes.get(f) or 0, self.etags.get(f)) for f in self.files]

    def default_name(self) -> str:
        """The repo's name (without a -GGUF suffix), plus the quant for a GGUF: SmolLM2-360M-Instruct-Q8_0."""
        base = self.ref.repo.split("/")[-1]
        if self.kind == "gguf":
            if base.lower().endswith("-gguf"):
                base = base[:-5]
            base = f"{base}-{self.choice.quant}" if "/" not in self.choice.quant and "." not in self.choice.quant \
                else base
        return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[:80] or "model"   # as importer/run.py names

    def source(self) -> str:
        where = self.choice.files[0] if self.kind == "gguf" else ""
        return f"{self.ref.repo}@{self.commit[:12]}{'/' + where if where else ''} (Hugging Face)"


@dataclass
class PullResult:
    name: str
    path: Path
    plan: Plan
    fetched: int = 0                # bytes downloaded by this pull
    up_to_date: bool = False        # nothing to do: the model was pulled at this commit already


def _network_error(e: BaseException) -> bool:
    return isinstance(e, (ConnectionError, TimeoutError)) or any(c.__name__ in _NETWORK for c in type(e).__mro__)


def _endpoint() -> str:
    return constants().ENDPOINT


def _hub_error(e: Exception, ref: RepoRef, what: str = "") -> PullError:
    """A huggingface_hub exception as one line that says what to do."""
    from huggingface_hub import errors as hub_errors
    repo = ref.repo
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    code = getattr(response, "headers", {}).get("X-Error-Code") if response is not None else None
    if isinstance(e, hub_errors.GatedRepoError) or code == "GatedRepo":
        how = "set HF_TOKEN to a token with access" if not _token() else "the token in HF_TOKEN has no access yet"
        return PullError(f"{repo} is gated: accept its terms at {_endpoint()}/{repo}, then {how}")
    if isinstance(e, hub_errors.RevisionNotFoundError):
        return PullError(f"{repo} has no revision {ref.revision!r}")
    if isinstance(e, hub_errors.RepositoryNotFoundError):
        private = "" if _token() else " (a private repo needs HF_TOKEN)"
        return PullError(f"{repo}: no such model on {_endpoint()}{private}")
    if isinstance(e, hub_errors.RemoteEntryNotFoundError):
        return PullError(f"{repo}: {what or 'a file'} is not in the repo at this revision")
    if _network_error(e):
        cached = snapshot_for(ref) is not None
        hint = f"; it is in the cache: tinychat pull {ref} --offline" if cached else ""
        return PullError(f"cannot reach {_endpoint()} ({type(e).__name__}){hint}")
    if status is not None:
        return PullError(f"{_endpoint()} answered HTTP {status} for {repo}{' ' + what if what else ''}")
    msg = " ".join(str(e).split())
    return PullError(f"{repo}: {msg[:160] or type(e).__name__}")


def _token():
    hub = hub_module()
    try:
        return hub.get_token()
    except Exception:  # noqa: BLE001  a broken token file reads as no token
        return None


def _kind(ref: RepoRef, sizes: dict[str, int]) -> str:
    ggufs = gguf_files(sizes)
    st = "config.json" in sizes and ("model.safetensors" in sizes or "model.safetensors.index.json" in sizes)
    if ggufs and (ref.quant or not st):
        return "gguf"
    if st:
        if ref.quant:
            raise PullError(f"{ref.repo} has no GGUF files to pick {ref.quant} from (it is a safetensors repo: "
                            f"tinychat pull {ref.repo})")
        if "tokenizer.json" not in sizes:
            raise PullError(f"{ref.repo}: no tokenizer.json (a fast Hugging Face tokenizer is needed)")
        return "safetensors"
    if any(f.endswith((".bin", ".pt", ".pth")) for f in sizes):
        raise PullError(f"{ref.repo}: only pickle weights (*.bin); tinychat reads safetensors or GGUF only")
    if not sizes:
        raise PullError(f"{ref.repo}: the repo is empty")
    raise PullError(f"{ref.repo}: no GGUF or safetensors model in the repo")


def plan(text: str, offline: bool = False) -> Plan:
    """What pulling text means: the commit, the kind of repo, the GGUF choices and the one picked (--list shows
    them). Online: one model_info call; offline: the cached snapshot."""
    ref = parse_ref(text)
    hub = hub_module()
    offline = offline or constants().HF_HUB_OFFLINE
    if offline:
        snap = snapshot_for(ref)
        if snap is None:
            raise PullError(f"{ref.repo}{'@' + ref.revision if ref.revision else ''} is not in the Hugging Face "
                            f"cache ({hub_cache()}): tinychat pull {ref.repo} downloads it")
        sizes, etags, commit = snapshot_files(snap), {}, snap.name
    else:
        try:
            info = hub.HfApi().model_info(ref.repo, revision=ref.revision, files_metadata=True)
        except Exception as e:  # noqa: BLE001  every hub / network error becomes one line
            if isinstance(e, PullError):
                raise
            raise _hub_error(e, ref) from None
        sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or ()}
        etags = {s.rfilename: (s.lfs.sha256 if s.lfs else s.blob_id) for s in info.siblings or ()}
        commit = info.sha
        if not commit:
            raise PullError(f"{_endpoint()} gave no commit for {ref.repo} (is HF_ENDPOINT a Hugging Face hub?)")
    kind = _kind(ref, sizes)
    p = Plan(ref, commit, kind, sizes, etags, offline=offline)
    if kind == "gguf":
        p.choices = gguf_choices(sizes)
        p.choice = pick_quant(p.choices, ref.quant, ref.repo)
    return p


def _free(path: Path) -> tuple[int, int]:
    """(free bytes, device) of the file system path is on (its nearest existing folder)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free, os.stat(p).st_dev


def check_space(download_bytes: int, import_bytes: int, cache: Path, models: Path, repo: str) -> None:
    """PullError with the figures when the download (into the cache) and the imported model (under models) do not
    fit on their disks (counted together when they share one)."""
    c_free, c_dev = _free(cache)
    m_free, m_dev = _free(models)
    if c_dev == m_dev:
        if download_bytes + import_bytes > c_free:
            raise PullError(f"not enough disk space: {repo} needs {human_bytes(download_bytes + import_bytes)} "
                            f"({human_bytes(download_bytes)} to download into {cache}, "
                            f"~{human_bytes(import_bytes)} for the imported model), {human_bytes(c_free)} free")
        return
    if download_bytes > c_free:
        raise PullError(f"not enough disk space: {repo} needs {human_bytes(download_bytes)} in {cache}, "
                        f"{human_bytes(c_free)} free")
    if import_bytes > m_free:
        raise PullError(f"not enough disk space: the imported model needs ~{human_bytes(import_bytes)} in {models}, "
                        f"{human_bytes(m_free)} free")


def _fetch(p: Plan, files: list[str]) -> Path:
    """Download small files (config.json, ...) that the repo has into the cache; returns the snapshot folder."""
    hub = hub_module()
    for f in files:
        try:
            hub.hf_hub_download(p.ref.repo, f, revision=p.commit, token=_token(), cache_dir=hub_cache(),
                                **quiet(hub.hf_hub_download))
        except Exception as e:  # noqa: BLE001
            raise _hub_error(e, p.ref, f) from None
    return repo_folder(p.ref.repo, hub_cache()) / "snapshots" / p.commit


def _check_before_weights(p: Plan) -> dict:
    """The checkpoint's config after the importer's checks, from what is cheap: the small files of a safetensors repo
    (which fixes the shards to fetch) or the header of the GGUF (read by range requests); PullError if refused."""
    from .precheck import check_gguf_metadata, check_hf_files
    where = str(p.ref)
    if p.kind == "safetensors":
        snap = _fetch(p, [f for f in SMALL_FILES if f in p.sizes])
        if "model.safetensors" not in p.sizes:
            try:
                idx = json.loads((snap / "model.safetensors.index.json").read_text(encoding="utf-8"))
                p.shards = set((idx.get("weight_map") or {}).values())
            except (OSError, ValueError, AttributeError):
                raise PullError(f"{p.ref.repo}: model.safetensors.index.json is not readable") from None
            missing = sorted(s for s in p.shards if s not in p.sizes)
            if not p.shards or missing:
                raise PullError(f"{p.ref.repo}: model.safetensors.index.json names shards the repo lacks "
                                f"({', '.join(missing[:3]) or 'none listed'})")
        return check_hf_files(where, snap)
    if p.choice.split:
        raise PullError(f"{p.ref.repo}: {p.choice.quant} is split into {len(p.choice.files)} files; tinychat imports "
                        f"single-file GGUFs (pick another with :QUANT; tinychat pull {p.ref.repo} --list)")
    f = p.choice.files[0]
    snap = snapshot_for(RepoRef(p.ref.repo, revision=p.commit))
    local = snap / f if snap is not None and (snap / f).is_file() else None
    from ..importer.errors import ImportRefused
    from ..importer.gguf_header import read_metadata
    try:
        if local is not None:
            with open(local, "rb") as fh:
                meta = read_metadata(fh, f)
        else:
            from huggingface_hub import HfFileSystem
            fs = HfFileSystem(token=_token(), endpoint=_endpoint(), skip_instance_cache=True)
            with fs.open(f"{p.ref.repo}/{f}", "rb", revision=p.commit, block_size=0) as fh:
                meta = read_metadata(fh, f)
    except ImportRefused as e:
        raise PullError(f"{where}: {e}") from None
    except PullError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _hub_error(e, p.ref, f) from None
    return check_gguf_metadata(where, meta)


def _record_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/REVISION -> commit in the cache, as huggingface_hub records a branch or tag it resolved (the files were
    fetched by commit): offline lookups by branch name (ours, llama.cpp's, `hf download --offline`) find them."""
    if revision == commit:
        return
    from ..fsutil import atomic_write
    atomic_write(storage / "refs" / revision, lambda t: t.write_text(commit, encoding="utf-8"))


def _pulled(name: str) -> dict | None:
    """The hub record (import.json "hub") of an imported model named name; None when there is none."""
    meta_path = paths.models_dir() / name / "import.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None if not (paths.models_dir() / name / "config.json").is_file() else {}
    return meta.get("hub") if isinstance(meta, dict) and isinstance(meta.get("hub"), dict) else {}


def _stored(name: str) -> str:
    """The mode the imported model `name` stores its weights in: "none" (full precision), "int8" or "int4"."""
    from ..quant_files import stored_mode
    return stored_mode(paths.models_dir() / name) or "none"


def _bytes_a_weight(p: Plan, quant: str, dtype: str) -> int:
    """What the import will store a weight in (its disk estimate): 1 packed, else dtype's size. auto: a GGUF's quant
    label says (store_mode.py; the file itself decides after the download)."""
    if quant == "auto" and dtype == "float32" and p.kind == "gguf" and p.choice is not None:
        from ..importer.store_mode import label_bits, mode_for_bits
        quant = mode_for_bits(label_bits(p.choice.quant))
    return 1 if quant in ("int8", "int4") else {"float32": 4}.get(dtype, 2)


def pull(text: str, name: str | None = None, offline: bool = False, force: bool = False, context: int | None = None,
         dtype: str = "float32", report: Reporter | None = None, import_progress=None, quant: str = "auto") -> PullResult:
    """Pull text (REPO[:QUANT][@REVISION]) and import it as `name` (default: Plan.default_name). A model of that name
    pulled from the same repo is updated in place (a no-op at the same commit); one from elsewhere needs force.
    import_progress(done, total, what): the importer's stages (importer/run.py's progress). quant: none, or int8 /
    int4 to store packed weights, auto (the default) as the source's own bits say (`tinychat import --quant`: a model
    pulled before at the same commit is up to date whatever auto stored it as)."""
    report = report or Reporter()
    p = plan(text, offline)
    from ..importer.store import check_name
    try:
        name = check_name(name or p.default_name())
    except ValueError as e:
        raise PullError(str(e)) from None
    prior = _pulled(name)
    replace = force
    if prior is not None:
        if prior.get("repo") != p.ref.repo and not force:
            raise PullError(f"a model named {name!r} exists already (from {prior.get('repo') or 'elsewhere'}); "
                            f"pick another --name or add --force")
        replace = True
    if prior is not None and prior.get("repo") == p.ref.repo and prior.get("commit") == p.commit \
            and (p.kind != "gguf" or prior.get("files") == p.files) and quant in ("auto", _stored(name)):
        return PullResult(name, paths.models_dir() / name, p, up_to_date=True)    # files at a commit never change
    fetched = 0
    if not p.offline:
        cache = hub_cache()
        storage = repo_folder(p.ref.repo, cache)
        before = {f for f, e in p.etags.items() if e and (storage / "blobs" / e).exists()}
        cfg = _check_before_weights(p)
        from .precheck import import_bytes
        specs = p.specs()
        missing = [s for s in specs if not (s.etag and (storage / "blobs" / s.etag).exists())]
        need = max(sum(s.size for s in missing) - part_bytes(storage, missing), 0)
        est = import_bytes(cfg, _bytes_a_weight(p, quant, dtype))
        what = f"{p.choice.quant} ({p.choice.files[0]})" if p.kind == "gguf" else f"{len(specs)} files"
        cached = sum(s.size for s in specs if s.path in before) + part_bytes(storage, missing)
        report.line(f"{p.ref.repo} at {p.commit[:12]}: {what}, {human_bytes(sum(s.size for s in specs))}"
                    + (f" ({human_bytes(cached)} of it cached)" if cached else "")
                    + (f"; the import writes ~{human_bytes(est)}" if est else ""))
        check_space(need, est, cache, paths.models_dir(), p.ref.repo)
        try:
            fetched = download(p.ref.repo, p.commit, specs, cache=cache, token=_token(), progress=report.progress)
        except Interrupted:
            raise
        except PullError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _hub_error(e, p.ref) from None
        _record_ref(storage, p.ref.revision or "main", p.commit)
        snap = storage / "snapshots" / p.commit
    else:
        snap = snapshot_for(RepoRef(p.ref.repo, revision=p.commit))
        missing = [f for f in p.files if f not in p.sizes]
        if p.kind == "safetensors" and "model.safetensors" not in p.sizes:
            try:
                idx = json.loads((snap / "model.safetensors.index.json").read_text(encoding="utf-8"))
                p.shards = set((idx.get("weight_map") or {}).values())
            except (OSError, ValueError, AttributeError):
                raise PullError(f"{p.ref.repo}: model.safetensors.index.json is not readable") from None
            missing = [f for f in p.files if f not in p.sizes]
        if missing:
            raise PullError(f"{p.ref.repo} is only partly in the cache (missing {', '.join(missing[:3])}): "
                            f"tinychat pull {p.ref.repo} finishes it")
    src = snap / p.choice.files[0] if p.kind == "gguf" else snap
    report.line(f"importing {p.ref.repo} as {name}")
    from ..importer import ImportRefused, import_model
    origin = {"source": p.source(), "hub": {"repo": p.ref.repo, "revision": p.ref.revision or "main",
                                            "commit": p.commit, "files": p.files,
                                            "quant": p.choice.quant if p.choice else None}}
    try:
        dest = import_model(src, name=name, context=context, dtype=dtype, force=replace, origin=origin,
                            progress=import_progress, quant=quant)
    except ImportRefused as e:
        raise PullError(f"{p.ref}: {e}") from None
    return PullResult(name, dest, p, fetched=fetched)
