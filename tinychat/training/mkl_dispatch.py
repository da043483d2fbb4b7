"""MKL's vendor dispatch on AMD CPUs, and the one-line library that lifts it for the training pipeline.

PyTorch's CPU wheel links Intel oneMKL into libtorch_cpu. MKL chooses its kernels by CPU vendor as well as by
features: on an AMD CPU it runs its generic code path even where the CPU has AVX-512 (MKL_VERBOSE says "for
Intel(R) Architecture processors", and `perf` shows `mkl_blas_def_*` kernels). Training reaches MKL through
PyTorch's CPU flash attention, whose block GEMMs call MKL's bf16 x bf16 -> fp32 GEMM (~30,000 calls in a step of
32 x 150 tokens), and through fp32 GEMMs. MKL asks `mkl_serv_intel_cpu_true()` through libtorch_cpu's dynamic
symbol table, so a library loaded first that defines it (returning 1) makes MKL choose by the CPU's features
alone (what it buys a training step: docs/benchmarks.md, "MKL's vendor dispatch on AMD").

The dynamic loader reads LD_PRELOAD only when a process starts, so `python -m tinychat.training` re-executes
itself once with the library preloaded (`reexec`), on Linux x86-64 with an AMD CPU. TINYCHAT_MKL_SHIM=0 turns it
off; without a C compiler the step runs as before. Kernels change with it, so a run resumed with and without it
is not bit-identical (as on another CPU). No torch here: this runs before torch is imported.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..nativebuild import BuildError, build_shared

SOURCE = "/* MKL's vendor test, answered yes: MKL then picks kernels by CPU features */\n" \
         "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
ENV = "TINYCHAT_MKL_SHIM"
NAME = "mklshim"            # build_shared names the object NAME_<key>.so: how LD_PRELOAD shows it is there


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor_id ("AuthenticAMD", "GenuineIntel"), "" when unknown."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def wanted(env: Mapping[str, str], vendor: str, system: str, machine: str) -> bool:
    """Whether a step should run with the library preloaded: an AMD x86-64 CPU under Linux (LD_PRELOAD), not
    turned off, not already preloaded."""
    if env.get(ENV, "").strip() == "0" or system != "Linux" or machine not in ("x86_64", "AMD64"):
        return False
    if f"{NAME}_" in env.get("LD_PRELOAD", ""):
        return False
    return vendor == "AuthenticAMD"


def shim_path() -> Path:
    """The built library (cached like the engine's kernels; BuildError without a compiler)."""
    return build_shared(SOURCE, NAME, [["-O2"]], libs=())


def active() -> bool:
    """Whether this process has the library preloaded (its symbol answers first in the global scope)."""
    try:
        return f"{NAME}_" in os.environ.get("LD_PRELOAD", "") and ctypes.CDLL(None).mkl_serv_intel_cpu_true() == 1
    except (AttributeError, OSError):
        return False


def reexec(argv: Sequence[str], env: Mapping[str, str] | None = None,
           execve: Callable[[str, list, dict], None] = os.execve) -> bool:
    """Re-execute `python -m tinychat.training ARGV` with the library preloaded, where wanted. Returns False (and
    the caller goes on in this process) where not wanted or the library cannot be built; execve does not return."""
    env = dict(os.environ if env is None else env)
    if not wanted(env, cpu_vendor(), platform.system(), platform.machine()):
        return False
    try:
        lib = shim_path()
    except (BuildError, OSError) as e:
        print(f"note: MKL keeps its generic path on this AMD CPU ({e}); {ENV}=0 hides this note",
              file=sys.stderr)
        return False
    env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    sys.stdout.flush(), sys.stderr.flush()
    execve(sys.executable, [sys.executable, "-m", "tinychat.training", *argv], env)
    return True


def describe() -> str:
    """One line for a step's log: whether MKL chooses by features here ("" on other vendors' CPUs)."""
    if active():
        return "MKL: vendor test answered by the preloaded shim (kernels chosen by CPU features)"
    if cpu_vendor() == "AuthenticAMD":
        return f"MKL: generic code path on this AMD CPU (shim not preloaded; {ENV}={os.environ.get(ENV, '')!r})"
    return ""
