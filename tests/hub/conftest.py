"""Fixtures of the pull tests: a fake Hub on 127.0.0.1 (tests/fake_hub.py) with the tiny model's repos, and
`tinychat` run as a fresh process against it (huggingface_hub reads HF_ENDPOINT / HF_HOME / HF_HUB_OFFLINE when it
is imported, as for a user)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_hub import FakeHub
from hub_models import config, gguf_bytes, safetensors_repo

BIG = config(hidden_size=256, intermediate_size=4096, head_dim=64)       # 2 layers of 13 MiB (float32)
HF_VARS = ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE",
           "HF_HUB_DISABLE_XET", "HUGGING_FACE_HUB_TOKEN")


@pytest.fixture(scope="module")
def repos():
    """The files of the test repos, built once per module."""
    return {
        "org/tiny": safetensors_repo(generation={"temperature": 0.6, "top_p": 0.8, "top_k": 20}),
        "org/tiny-sharded": safetensors_repo(seed=1, shards=2),
        # files over huggingface_hub's 10 MiB write chunk, so that a killed download leaves a part on disk
        "org/big-sharded": safetensors_repo(BIG, seed=2, shards=2),
        "org/big-GGUF": {"big-Q8_0.gguf": gguf_bytes(BIG, seed=3)},
        "org/tiny-GGUF": {"tiny-Q8_0.gguf": gguf_bytes(config(intermediate_size=64), qtype="Q8_0",
                                                       sampling={"temp": 0.3, "top_p": 0.95, "top_k": 40}),
                          "tiny-Q4_K_M.gguf": gguf_bytes(seed=1), "mmproj-tiny-f16.gguf": b"\0" * 64,
                          "README.md": b"# tiny GGUF\n"},
        "org/gemma-like": safetensors_repo(config(model_type="gemma2", architectures=["Gemma2ForCausalLM"])),
        "org/phi-GGUF": {"phi-Q8_0.gguf": gguf_bytes(arch="phi3", pad=16 << 20)},
    }


@pytest.fixture
def hub(repos):
    with FakeHub() as h:
        for name, files in repos.items():
            h.add(name, files)
        yield h


@pytest.fixture
def env(tmp_path, hub):
    """The environment of a user whose HF cache is empty, pointed at the fake hub."""
    e = {k: v for k, v in os.environ.items() if k not in HF_VARS}
    e.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
             TINYCHAT_HOME=os.environ["TINYCHAT_HOME"])
    return e


@pytest.fixture
def hf_cache(tmp_path) -> Path:
    return tmp_path / "hf" / "hub"


@pytest.fixture
def tinychat(env):
    """tinychat(*args, env=None (the fixture's), **subprocess.run options) -> CompletedProcess (text)."""
    def run(*args, env=env, timeout=180, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tinychat", *map(str, args)], env=env, capture_output=True,
                              text=True, timeout=timeout, **kw)
    return run


@pytest.fixture
def popen(env):
    """popen(*args) -> a running `tinychat` (stdout / stderr piped, text)."""
    def start(*args, env=env):
        return subprocess.Popen([sys.executable, "-m", "tinychat", *map(str, args)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return start
