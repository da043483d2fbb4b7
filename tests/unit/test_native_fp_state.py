"""Loading our compiled kernels must not change the process's floating-point state (a library linked with
-ffast-math turns on flush-to-zero for everything else in the process)."""
import os
import shutil
import subprocess
import sys

import pytest

CHECK = r"""
import torch
def subnormals_ok():
    return 5e-324 * 1.0 != 0.0 and torch.tensor([1e-40]).item() != 0.0
assert subnormals_ok()
import tinychat.engine.native as N
N.load()
from tinychat.training import fastattn
fastattn._load()
print("ok" if subnormals_ok() else "flushed")
"""


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_loading_native_kernels_keeps_subnormal_floats():
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=dict(os.environ),
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().endswith("ok")
