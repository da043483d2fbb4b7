"""Building a C source into a shared object on first use, for ctypes: the one helper behind the engine's decode
kernels (engine/native.py) and the training's attention kernel (training/fastattn.py). No torch.

The object is cached under the user cache folder ($TINYCHAT_HOME/cache when set), in a file named by a hash of
the source, the compiler's version, this CPU's flags, the compiler flags and any extra key parts: code built with
-march=native must not be reused on another CPU, nor after the source or the compiler changed. A build goes to a
temporary file in the same folder first and is renamed into place, so a reader never sees half an object; a cached
object is only used when it matches the size and sha256 recorded beside it when it was built (dlopen maps the file,
and a truncated one, from a full disk or a killed copy, dies with SIGBUS on first use, which no try/except can
catch): a missing or different record means build it again."""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from tinychat.fsutil import file_sha256


SUFFIX = ".dylib" if sys.platform == "darwin" else ".dll" if sys.platform == "win32" else ".so"


class BuildError(RuntimeError):
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
    the source includes, written beside it. dirs: where to look and build, in order (default: cache_dir(), then a
    folder in the system temp dir). BuildError when nothing compiles or no folder is writable."""
    headers = dict(headers or {})
    cc = cc or compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, gcc, clang) on PATH")
    key = build_key("\0".join([source, *headers.values()]) if headers else source, cc, key_extra)
    for d in dirs or (cache_dir(), Path(tempfile.gettempdir()) / "tinychat-kernels"):
        so = d / f"{name}_{key}{SUFFIX}"
        if so.is_file() and _cached_ok(so):
            return so
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
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
    raise BuildError(f"no writable folder for {name}")


def _stamp(path: Path) -> str:
    """"SIZE SHA256" of a file."""
    return f"{path.stat().st_size} {file_sha256(path)}"


def _write_stamp(so: Path, digest: str) -> None:
    tmp = so.with_name(so.name + ".sha256.tmp")
    tmp.write_text(digest + "\n", encoding="ascii")
    os.replace(tmp, so.with_name(so.name + ".sha256"))


def _cached_ok(so: Path) -> bool:
    """The object matches the record written when it was built."""
    try:
        return so.with_name(so.name + ".sha256").read_text(encoding="ascii").strip() == _stamp(so)
    except (OSError, UnicodeDecodeError):
        return False
