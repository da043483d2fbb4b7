"""The kernels built for targets other than this machine's own: a C harness of tests/native (kv16_harness.c,
q8_harness.c) compiled for the flags a test gives, run natively (the x86-64 levels this CPU can run) or under
qemu-user (aarch64), against the float64 references inside it. Each harness prints its kernel path first and "ok"
last; a test asserts the path it built for. Skips where the compiler, the CPU's features or qemu are absent
(.ci/run installs gcc-aarch64-linux-gnu and qemu-user)."""
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tinychat" / "engine"
HARNESSES = ROOT / "tests" / "native"

# aarch64's kernel paths, each the flags that build it: the same in every harness
AARCH64 = [(["-march=armv8-a"], "neon"), (["-march=armv8.2-a+dotprod"], "neon-dotprod"),
           (["-march=armv8-a", "-DTC_FORCE_SCALAR"], "scalar")]


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo's flags line), empty where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build_and_run(harness: str, cc: str, flags, tmp_path: Path, runner=(), warnings=()) -> str:
    """Compile tests/native/<harness> with cc for flags (warnings are errors, less those in `warnings`), run it (under
    runner: qemu), assert it built and ended "ok", and return the kernel path it printed."""
    return build_and_run_out(harness, cc, flags, tmp_path, runner, warnings).split()[0]


def build_and_run_out(harness: str, cc: str, flags, tmp_path: Path, runner=(), warnings=()) -> str:
    """build_and_run, returning all the harness printed."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    exe = tmp_path / "h"
    r = subprocess.run([cc, "-O2", *flags, "-ffp-contract=off", "-Wall", "-Werror", *warnings, f"-I{ENGINE}",
                        str(HARNESSES / harness), "-o", str(exe), "-lm"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def run_x86(harness: str, flags, needs: set[str], tmp_path: Path, warnings=()) -> str:
    """build_and_run natively with gcc (or cc) for an x86-64 level; skips off x86-64 or where this CPU lacks a flag
    of `needs`."""
    return run_x86_out(harness, flags, needs, tmp_path, warnings).split()[0]


def run_x86_out(harness: str, flags, needs: set[str], tmp_path: Path, warnings=()) -> str:
    """run_x86, returning all the harness printed."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("no C compiler / not x86-64")
    if not needs <= cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(needs - cpu_flags())}")
    return build_and_run_out(harness, cc, flags, tmp_path, warnings=warnings)


def run_aarch64(harness: str, flags, tmp_path: Path, warnings=()) -> str:
    """build_and_run with the aarch64 cross compiler, under qemu-aarch64; skips without either."""
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("no aarch64 cross compiler / qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    return build_and_run(harness, cc, flags, tmp_path, (qemu, "-L", "/usr/aarch64-linux-gnu"), warnings)
