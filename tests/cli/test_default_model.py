"""The shipped model (assets/): found without --model, loads the way the app loads it, chats, stays within the
size budget, and travels inside a non-editable install."""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"


def test_default_model_is_found_and_is_the_demo_size():
    from tinychat.loading import default_model_path
    p = default_model_path()
    assert p is not None and p.resolve() == ASSETS.resolve()
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["name"] == "demo" and cfg["vocab_size"] == 8192 and cfg["engram_layers"]
    assert (p / "model.safetensors").stat().st_size <= 60 * 1024 * 1024
    card = (p / "MODEL_CARD.md").read_text()
    for needle in ("## Sources and licenses", "Apache-2.0", "MIT", "## How it was made (exact commands)",
                   "python -m tinychat.training train", "## Validation loss", "## Quality on held-out conversations",
                   "## Sample conversations"):
        assert needle in card, needle


def test_default_model_chats_and_ends_its_replies(tmp_path):
    """Greedy replies to two everyday messages: English words (contractions count), ended by <|im_end|> well before the cap."""
    from tinychat.chat.runtime import Chat, ChatSettings
    from tinychat.loading import load_runtime
    m, tok, name, ident = load_runtime(None)
    assert name == "default"
    chat = Chat(m, tok, ChatSettings(temperature=0.0, max_new=192), autosave=False, quant="int8")
    for msg in ("Hi! How are you today?", "Can you tell me what a rainbow is?"):
        r = chat.send(msg)
        assert r.finish == "stop", r.text
        words = [w.strip(".,!?;:'\"()").lower() for w in r.text.split()]
        assert len(words) >= 3 and sum(w.replace("'", "").isalpha() for w in words) >= 0.8 * len(words), r.text


def test_tinychat_without_model_flag_answers_on_a_pipe(tmp_path):
    env = {"TINYCHAT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "tinychat", "--plain", "--json", "--quant", "int8", "--seed", "1",
                        "--max-new", "40"], input="Hello there!\n", capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    reply = json.loads(p.stdout.strip().splitlines()[0])
    assert reply["n_tokens"] >= 1 and reply["text"].strip()


@pytest.mark.slow
def test_wheel_carries_the_model_and_package_data(tmp_path):
    """A non-editable install gets the model inside the package (tinychat/assets), not a link to the checkout, and
    the other files the package reads at run time."""
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and "No module named" in p.stderr:
        pytest.skip("no wheel building tools here")
    assert p.returncode == 0, p.stderr[-2000:]
    (whl,) = tmp_path.glob("tinychat-*.whl")
    with zipfile.ZipFile(whl) as z:
        sizes = {i.filename: i.file_size for i in z.infolist()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "MODEL_CARD.md"):
        assert sizes.get(f"tinychat/assets/{name}", 0) == (ASSETS / name).stat().st_size, name
    assert sizes.get("tinychat/engine/native.c", 0) > 1000           # the kernels' source, compiled on first use
    assert sizes.get("tinychat/tui/app.tcss", 0) > 100
