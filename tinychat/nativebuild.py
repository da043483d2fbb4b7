"""Building a C source into a shared object on first use, for ctypes: the one helper behind the engine's decode
kernels (engine/native.py) and the training's attention kernel (training/fastattn.py). No torch.

The object is cached under the user cache folder ($TINYCHAT_HOME/cache when set), in a file named by a hash of
the source, the compiler's version, this CPU's flags, the compiler flags and any extra key parts: code built with
-march=native must not be reused on another CPU, nor after the source or the compiler changed. A build goes to a
temporary file in the same folder first and is renamed into place, so a reader never sees half an object; a cached
object is only used when it matches the size and sha256 recorded beside it when it was built (dlopen maps the file,
and a truncated one, from a full disk or a killed copy, dies with SIGBUS on first use, which no try/except can
catch): a missing or different record means build it again.

Code is only ever loaded from a folder no other user can write (issue #33 item 1: when the cache folder could not be
made, builds fell back to a shared $TMPDIR/tinychat-kernels, where anyone could plant `tc_native_<key>.so`, its key
computable, with the .sha256 record beside it; its constructor ran as the user). The cache folder must belong to this
user and be writable by no one else, and so must every folder above it (root's, or a sticky one such as /tmp, may be
shared), as ssh checks the folders of its keys; an object in it must be this user's too. When the cache folder is not
usable, the object is built into a fresh private temporary folder for this run only (removed at exit), and NOTICES
says so in one line."""
from __future__ import annotations

import atexit
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from tinychat.fsutil import file_sha256
from .errors import TinychatError


SUFFIX = ".dylib" if sys.platform == "darwin" else ".dll" if sys.platform == "win32" else ".so"
NOTICES: list[str] = []     # one line each: a build that could not use the cache folder (shown by the CLI)


class BuildError(TinychatError, RuntimeError):
    """The source did not compile (the compiler's last line), or no folder to put the object in."""


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH; None when there is none."""
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def cpu_flags() -> str:
    """This CPU's feature line (/proc/cpuinfo's flags / Features), else the platform's processor name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() + platform.machine()


def cache_dir(sub: str = "kernels") -> Path:
    """Where built objects are kept: $TINYCHAT_HOME/cache/<sub>, else the user cache folder's <sub>."""
    home = os.environ.get("TINYCHAT_HOME", "").strip()
    if home:
        return Path(home).expanduser() / "cache" / sub
    import platformdirs
    return platformdirs.user_cache_path("tinychat") / sub


def build_key(source: str, cc: str, extra: Sequence[str] = ()) -> str:
    """The 16-hex-digit key of a build: source, compiler version, CPU flags and the extra parts."""
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    return hashlib.sha256("\0".join([source, ver, cpu_flags(), *extra]).encode()).hexdigest()[:16]


def build_shared(source: str, name: str, flag_sets: Sequence[Sequence[str]], cc: str | None = None,
                 key_extra: Sequence[str] = (), libs: Sequence[str] = ("-lm",), timeout: float = 300,
                 dirs: Sequence[Path] | None = None, headers: Mapping[str, str] | None = None) -> Path:
    """The path of `source` built as <name>_<key><SUFFIX>: the cached object when there is one, else compiled with
    the first of flag_sets that works (e.g. with -fopenmp, then without). The key covers source, headers, compiler
    and CPU; key_extra adds what else must force a rebuild (flags, a library version). headers: {file name: text}
    the source includes, written beside it. dirs: where to look and build, in order, the first private one (default: cache_dir(); else a
    fresh private temporary folder, for this run only). BuildError when nothing compiles or no private folder can
    be had."""
    headers = dict(headers or {})
    cc = cc or compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, gcc, clang) on PATH")
    key = build_key("\0".join([source, *headers.values()]) if headers else source, cc, key_extra)
    why = "no folder given"
    for d in dirs or (cache_dir(),):
        why = _usable(Path(d))
        if why is None:
            return _build_in(Path(d), source, name, key, flag_sets, cc, libs, timeout, headers)
    d = Path(tempfile.mkdtemp(prefix=f"tinychat-{name}-"))     # mode 0700, a name no one can guess
    atexit.register(shutil.rmtree, d, True)
    if private_problem(d) is not None:
        raise BuildError(f"no private folder to build {name} in ({why}; {private_problem(d)})")
    NOTICES.append(f"the kernel cache cannot be used ({why}): {name} was built for this run only, in a private "
                   f"temporary folder")
    return _build_in(d, source, name, key, flag_sets, cc, libs, timeout, headers)


def private_problem(folder: Path) -> str | None:
    """Why another user could put code in `folder` (None: no one could): it, and every folder above it, must belong to
    this user (or, above it, root) and be writable by no one else, but for a sticky folder above it (/tmp: others
    cannot rename what is ours there). Links are followed (the real path is checked). None where there are no uids."""
    if not hasattr(os, "getuid"):
        return None
    uid = os.getuid()
    try:
        real = Path(os.path.realpath(folder))
        st = os.stat(real)
    except OSError as e:
        return f"{folder}: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{real} is not a folder"
    if st.st_uid != uid:
        return f"{real} belongs to another user"
    if st.st_mode & 0o022:
        return f"{real} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    for up in real.parents:
        try:
            st = os.stat(up)
        except OSError as e:
            return f"{up}: {e.strerror or e}"
        if st.st_uid not in (0, uid):
            return f"{up} belongs to another user"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{up} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _usable(d: Path) -> str | None:
    """Make the cache folder (mode 0700) and return why it cannot hold code (None: it can). A folder of ours that
    others may write (a umask of 002) is made private first."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(d)
        if hasattr(os, "getuid") and st.st_uid == os.getuid() and st.st_mode & 0o022:
            os.chmod(d, stat.S_IMODE(st.st_mode) & ~0o022)
    except OSError as e:
        return f"{d}: {e.strerror or e}"
    return private_problem(d)


def _build_in(d: Path, source, name, key, flag_sets, cc, libs, timeout, headers) -> Path:
    """The object built in (or cached in) the private folder d."""
    so = d / f"{name}_{key}{SUFFIX}"
    if so.is_file() and _cached_ok(so):
        return so
    with tempfile.TemporaryDirectory(dir=d) as tmp:       # same file system: an atomic rename
        c = Path(tmp) / f"{name}.c"
        c.write_text(source)
        for fname, text in headers.items():
            (Path(tmp) / fname).write_text(text)
        out = Path(tmp) / so.name
        err = ""
        for flags in flag_sets:
            r = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(out), str(c), *libs],
                               capture_output=True, text=True, timeout=timeout)
            if r.returncode == 0:
                break
            err = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        else:
            raise BuildError(f"compiling {name} failed: {err[:200]}")
        digest = _stamp(out)
        os.replace(out, so)
        _write_stamp(so, digest)
    return so


def _stamp(path: Path) -> str:
    """"SIZE SHA256" of a file."""
    return f"{path.stat().st_size} {file_sha256(path)}"


def _write_stamp(so: Path, digest: str) -> None:
    tmp = so.with_name(so.name + ".sha256.tmp")
    tmp.write_text(digest + "\n", encoding="ascii")
    os.replace(tmp, so.with_name(so.name + ".sha256"))


def _cached_ok(so: Path) -> bool:
    """The object is this user's own, writable by no one else, and matches the record written when it was built."""
    try:
        st = os.lstat(so)
        if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) \
                or st.st_mode & 0o022:
            return False
        return so.with_name(so.name + ".sha256").read_text(encoding="ascii").strip() == _stamp(so)
    except (OSError, UnicodeDecodeError):
        return False
