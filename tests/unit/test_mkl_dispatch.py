"""tinychat/training/mkl_dispatch.py: the training pipeline re-executes itself on AMD CPUs with MKL's vendor test
answered by a preloaded one-line library."""
import os
import subprocess
import sys

import pytest

from tinychat import nativebuild
from tinychat.training import mkl_dispatch as MD

AMD, INTEL = "AuthenticAMD", "GenuineIntel"


@pytest.fixture
def home(tmp_path, monkeypatch):
    if nativebuild.compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("env, vendor, system, machine, want", [
    ({}, AMD, "Linux", "x86_64", True),
    ({}, INTEL, "Linux", "x86_64", False),
    ({}, "", "Linux", "x86_64", False),
    ({MD.ENV: "0"}, AMD, "Linux", "x86_64", False),
    ({MD.ENV: "1"}, AMD, "Linux", "x86_64", True),
    ({}, AMD, "Darwin", "x86_64", False),
    ({}, AMD, "Linux", "aarch64", False),
    ({"LD_PRELOAD": "/c/mklshim_0123.so"}, AMD, "Linux", "x86_64", False),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so"}, AMD, "Linux", "x86_64", True),
])
def test_only_an_amd_x86_64_linux_process_without_the_shim_wants_it(env, vendor, system, machine, want):
    assert MD.wanted(env, vendor, system, machine) is want


def test_the_vendor_comes_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert MD.cpu_vendor(info) == AMD
    assert MD.cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_reexec_runs_the_same_step_with_the_shim_preloaded_first(home, monkeypatch):
    monkeypatch.setattr(MD, "cpu_vendor", lambda: AMD)
    monkeypatch.setattr(MD.platform, "machine", lambda: "x86_64")
    calls = []
    env = {"LD_PRELOAD": "/usr/lib/other.so", "PATH": "/bin"}
    assert MD.reexec(["train", "--run", "runs/x"], env=env, execve=lambda *a: calls.append(a)) is True
    (path, argv, new_env), = calls
    assert path == sys.executable and argv == [sys.executable, "-m", "tinychat.training", "train", "--run", "runs/x"]
    first, rest = new_env["LD_PRELOAD"].split(os.pathsep)
    assert rest == "/usr/lib/other.so" and os.path.basename(first).startswith("mklshim_")
    assert first.startswith(str(home)) and new_env["PATH"] == "/bin"
    assert not MD.wanted(new_env, AMD, "Linux", "x86_64")          # the new process does not go round again


def test_reexec_leaves_other_cpus_and_a_turned_off_shim_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(MD, "cpu_vendor", lambda: INTEL)
    assert MD.reexec(["train"], env={}, execve=lambda *a: calls.append(a)) is False
    monkeypatch.setattr(MD, "cpu_vendor", lambda: AMD)
    assert MD.reexec(["train"], env={MD.ENV: "0"}, execve=lambda *a: calls.append(a)) is False
    assert calls == []


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_the_preloaded_shim_answers_mkls_vendor_test_in_a_torch_process(home):
    lib = MD.shim_path()
    code = "import torch, tinychat.training.mkl_dispatch as m; print(m.active())"

    def run(env):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=120).stdout.strip()

    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    assert run({**base, "LD_PRELOAD": str(lib)}) == "True"
    assert run(base) == "False"
