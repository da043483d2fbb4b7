"""Pages of a mapped weight file go back to the system once read (tinychat/mapped.py), and nothing else is touched:
tensors outside the file keep their memory, dropped ones read back the same values, hashes and quantized models
do not change."""
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tinychat.chat.runtime import model_identity
from tinychat.engine import quantize_cpu
from tinychat.mapped import MappedWeights
from tinychat.model import TinyAgentLM, config_for

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise of /proc/self/maps ranges: Linux")


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@linux
def test_a_read_tensor_of_a_mapped_file_leaves_memory_and_reads_back_the_same(tmp_path):
    want = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0))        # 16 MiB
    save_file({"w": want, "small": torch.ones(3)}, str(tmp_path / "m.safetensors"))
    sd = load_file(str(tmp_path / "m.safetensors"))
    w = sd["w"]
    assert torch.equal(w, want)                          # every page read: resident
    before = _rss_file_kb()
    mapped = MappedWeights()
    dropped = mapped.drop(w)
    assert dropped >= want.numel() * 4 - 2 * 4096        # all but the edge pages
    assert before - _rss_file_kb() >= dropped // 1024 // 2
    assert torch.equal(w, want)                          # faulted back in from the file


@linux
def test_tensors_outside_a_weight_file_are_never_dropped(tmp_path):
    save_file({"w": torch.zeros(1024, 1024)}, str(tmp_path / "m.safetensors"))
    sd = load_file(str(tmp_path / "m.safetensors"))
    anon = torch.randn(1024, 1024)
    keep = anon.clone()
    mapped = MappedWeights()
    assert mapped.holds(sd["w"]) and not mapped.holds(anon)
    assert mapped.drop(anon) == 0 and torch.equal(anon, keep)
    assert mapped.drop(sd["w"].t()) == 0                 # not contiguous: left alone
    assert mapped.drop(torch.empty(0)) == 0


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_a_stored_model_hashes_and_quantizes_as_one_loaded_in_full(tmp_path, mode):
    torch.manual_seed(0)
    TinyAgentLM(config_for("tiny")).save_pretrained(tmp_path / "m", dtype=torch.float32)
    full = TinyAgentLM.from_pretrained(tmp_path / "m")
    stored = TinyAgentLM.from_pretrained(tmp_path / "m", stored_linears=True)
    assert model_identity(stored) == model_identity(full)
    quantize_cpu(full, mode)
    quantize_cpu(stored, mode)
    ids = torch.arange(40).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(stored(ids), full(ids))
    assert model_identity(stored) == model_identity(full)


@linux
def test_a_big_mapped_tensor_read_by_blocks_never_has_all_its_pages_resident(tmp_path):
    from tinychat.mapped import BLOCK
    want = torch.randn(16384, 1024, generator=torch.Generator().manual_seed(1))      # 64 MiB
    save_file({"w": want}, str(tmp_path / "m.safetensors"))
    w = load_file(str(tmp_path / "m.safetensors"))["w"]
    mapped = MappedWeights()
    start, peak, total, rows = _rss_file_kb(), 0, 0.0, 0
    for part in mapped.blocks(w):
        total += float(part.double().sum())                # every page of the block read
        rows += part.size(0)
        peak = max(peak, _rss_file_kb() - start)
    assert rows == w.size(0) and total == pytest.approx(float(want.double().sum()))
    assert peak * 1024 < 3 * BLOCK                         # a block or two, not 64 MiB
    assert _rss_file_kb() - start < 1024                   # and none left behind


@linux
def test_a_copy_out_of_a_mapped_tensor_equals_the_cast_and_hands_the_pages_back(tmp_path):
    want = torch.randn(8192, 1024, generator=torch.Generator().manual_seed(2))       # 32 MiB
    save_file({"w": want}, str(tmp_path / "m.safetensors"))
    w = load_file(str(tmp_path / "m.safetensors"))["w"]
    start = _rss_file_kb()
    got = MappedWeights().copy_out(w, torch.bfloat16)
    assert torch.equal(got, want.to(torch.bfloat16))
    assert _rss_file_kb() - start < 1024
    anon = torch.randn(5, 7)                               # outside a file: a plain copy
    assert torch.equal(MappedWeights().copy_out(anon, torch.float64), anon.double())


@linux
def test_a_model_loaded_to_be_quantized_keeps_its_big_fp32_tables_where_the_file_lies(tmp_path, monkeypatch):
    import tinychat.model as M
    monkeypatch.setattr(M, "KEEP_MAPPED_BYTES", 4096)       # the tiny model's tables count as big
    torch.manual_seed(0)
    TinyAgentLM(config_for("tiny")).save_pretrained(tmp_path / "m", dtype=torch.float32)
    full = TinyAgentLM.from_pretrained(tmp_path / "m")
    stored = TinyAgentLM.from_pretrained(tmp_path / "m", stored_linears=True)
    mapped = MappedWeights()
    assert mapped.holds(stored.embed.weight) and not mapped.holds(full.embed.weight)
    assert not mapped.holds(stored.cid_map)                 # rebuilt in place by set_token_strings: a copy
    assert model_identity(stored) == model_identity(full)
    ids = torch.arange(40).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(quantize_cpu(stored, "int8")(ids), quantize_cpu(full, "int8")(ids))
