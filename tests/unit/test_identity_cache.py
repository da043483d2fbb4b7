"""A model folder's identity is hashed once per version of its files (tinychat/identity.py): the same value
as hashing, again after the files change, and never an error from the cache itself."""
import os

import torch

from tinychat.identity import cached_identity, model_identity
from tinychat.model import TinyAgentLM, config_for


def _folder(tmp_path, seed=0):
    torch.manual_seed(seed)
    TinyAgentLM(config_for("tiny")).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def _counting(folder):
    calls = []

    def compute():
        calls.append(1)
        return model_identity(TinyAgentLM.from_pretrained(folder))
    return compute, calls


def test_the_second_start_reads_the_identity_it_hashed_the_first_time(tmp_path):
    folder = _folder(tmp_path)
    compute, calls = _counting(folder)
    first = cached_identity(folder, compute, tmp_path / "cache")
    again = cached_identity(folder, compute, tmp_path / "cache")
    assert first == again == model_identity(TinyAgentLM.from_pretrained(folder)) and len(calls) == 1


def test_rewritten_weights_are_hashed_again(tmp_path):
    folder = _folder(tmp_path)
    compute, calls = _counting(folder)
    old = cached_identity(folder, compute, tmp_path / "cache")
    torch.manual_seed(1)
    TinyAgentLM(config_for("tiny")).save_pretrained(folder)          # atomic rename: a new file
    new = cached_identity(folder, compute, tmp_path / "cache")
    assert new != old and len(calls) == 2
    st = os.stat(folder / "model.safetensors")
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1))   # touched in place
    cached_identity(folder, compute, tmp_path / "cache")
    assert len(calls) == 3


def test_a_damaged_entry_or_an_unwritable_cache_only_means_hashing(tmp_path):
    folder = _folder(tmp_path)
    compute, calls = _counting(folder)
    want = cached_identity(folder, compute, tmp_path / "cache")
    [entry] = (tmp_path / "cache").iterdir()
    entry.write_text('{"key": [1], "identity": "not it"')
    assert cached_identity(folder, compute, tmp_path / "cache") == want and len(calls) == 2
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cached_identity(folder, compute, blocker / "cache") == want and len(calls) == 3
