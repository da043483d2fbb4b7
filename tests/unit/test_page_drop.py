"""EngineOptions.drop_pages (engine/page_drop.py): a stored-quantized model's mapped weight pages handed back once
read, per layer in the native steps (tc_drop in C) and after each quant Linear's prefill forward. A turn's tokens and
logits are the same bits with and without it (both native steps, prefill, int8 and int4 files); after a turn with it
the file's resident pages are fewer by at least the pages of the weights the step read (counted in
/proc/self/smaps); without it nothing is armed and every page read stays; the default drops for a stored model of
page_drop.DROP_MIN_BYTES or more only, and otherwise a two-level head's int8 rows (read a few a token) after each step."""
import copy
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from tinychat.engine import Decoder, KVCache, append, int8_kernel_ok, native
from tinychat.engine import page_drop
from tinychat.engine import two_level_head as head4
from tinychat.importer import import_model
from tinychat.loading import load_runtime, open_chat
from tinychat.model import TinyAgentLM, config_for
from tinychat.options import EngineOptions
from tinychat.quant_files import configure, load_quantized, save_quantized
from tinychat.settings import ChatSettings

sys.path.insert(0, str(Path(__file__).parent))         # the import tests' tiny llama writers
from test_llama_import import PROMPT, _config, _weights, write_hf  # noqa: E402

MODES = ["int8", "int4"]
pytestmark = [pytest.mark.skipif(not int8_kernel_ok(), reason="this torch build has no CPU int8 kernel"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise, /proc/self/smaps: Linux")]
# wide enough that each layer Linear spans many whole pages (a 4 KiB page holds 4,096 int8 / 8,192 int4 weights)
WIDE = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=64)


def _needs_kernels():
    if native.load() is None:
        pytest.skip(f"native kernels off: {native.why_not}")


def _stored(tmp_path, mode, kind="llama") -> Path:
    """A test-made stored-quantized folder: a tiny wide llama (tied: layout 2) or TinyAgentLM (layout 1)."""
    if kind == "llama":
        cfg = _config("llama", **WIDE)
        return import_model(write_hf(tmp_path / "hf", cfg, _weights(cfg, qk_std=0.15)), name=f"p-{mode}", quant=mode)
    torch.manual_seed(0)
    cfg = dataclasses.replace(config_for("tiny"), d_model=256, mlp_hidden=512, head_dim=64)
    save_quantized(TinyAgentLM(cfg), tmp_path / f"t-{mode}", mode)
    return tmp_path / f"t-{mode}"


def _mapping(ptr: int) -> tuple[int, int]:
    """(bytes, resident bytes: /proc/self/smaps' Rss) of the mapping holding address ptr."""
    size = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and ":" not in head:
                a, b = (int(x, 16) for x in head.split("-"))
                size = b - a if a <= ptr < b else None
            elif size is not None and head == "Rss:":
                return size, int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {ptr:#x}")


def _pages_mapped(t) -> tuple[int, int]:
    """(pages mapped in this process, pages) of tensor t's bytes: /proc/self/pagemap's present bit (63)."""
    import mmap
    import struct
    a, n = t.data_ptr(), t.numel() * t.element_size()
    first, last = a // mmap.PAGESIZE, (a + n - 1) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = struct.unpack(f"<{last - first + 1}Q", f.read((last - first + 1) * 8))
    return sum(e >> 63 & 1 for e in entries), len(entries)


def _turn(folder, drop, n=8, step_in_c=True):
    """A prefill of PROMPT then n greedy native steps on a fresh load of folder: (model, tokens, every logits row,
    the CpuStep, what configure resolved, the file mapping's resident bytes after the prefill)."""
    m = load_quantized(folder)
    opts = EngineOptions(drop_pages=drop, step_in_c=step_in_c)
    armed = configure(m, opts)
    cache = KVCache(m, 1, 128, "cpu", dtype=torch.float32)
    dec = Decoder(m, cache, graph=False, options=opts)
    rows = [append(m, cache, torch.tensor([PROMPT]), [len(PROMPT)])]
    after_prefill = _mapping(m.head.qweight.data_ptr())[1]
    toks = []
    for _ in range(n):
        toks.append(int(rows[-1].argmax()))
        rows.append(dec.step(toks[-1]))
    return m, toks, torch.cat(rows), dec.cpu_step, armed, after_prefill


@pytest.mark.parametrize("kind,step_in_c", [("llama", True), ("tinyagent", True), ("tinyagent", False)],
                         ids=["llama-step", "tinyagent-step", "tinyagent-calls"])
@pytest.mark.parametrize("mode", MODES)
def test_a_turn_gives_the_same_tokens_and_logits_with_and_without_page_drops(tmp_path, mode, kind, step_in_c):
    _needs_kernels()
    folder = _stored(tmp_path, mode, kind)
    _, toks, logits, fs, armed, _ = _turn(folder, False, step_in_c=step_in_c)
    _, dtoks, dlogits, dfs, darmed, _ = _turn(folder, True, step_in_c=step_in_c)
    assert not armed and darmed and fs.nat is not None and dfs.nat is not None
    assert fs.nat.drops is None and dfs.nat.drops is not None          # the drop table reached the native step
    assert len(set(toks)) > 2 and dtoks == toks
    assert torch.equal(dlogits, logits)                                 # prefill and every step: the same bits


@pytest.mark.parametrize("kind", ["llama", "tinyagent"])
@pytest.mark.parametrize("mode", MODES)
def test_after_a_turn_with_page_drops_the_files_resident_pages_are_fewer_by_the_weights_read(tmp_path, mode, kind):
    _needs_kernels()
    folder = _stored(tmp_path, mode, kind)
    m_off, toks, _, fs_off, _, pre_off = _turn(folder, False)
    _, rss_off = _mapping(m_off.head.qweight.data_ptr())
    m_on, dtoks, _, fs_on, _, pre_on = _turn(folder, True)
    size, rss_on = _mapping(m_on.head.qweight.data_ptr())
    table = fs_on.nat.drops[0]
    dropped = int(table[:, 1::2].sum())                     # the bytes of whole pages the step hands back
    weights = page_drop.mapped_quant_bytes(m_on)
    armed = page_drop.armed_bytes(m_on)                    # what the prefill's Linears hand back
    # the tables cover the Linears' mapped weights (the layers' and the head's; TinyAgentLM's Engram projections are
    # the prefill's only), but for the pages a tensor shares with its neighbours
    assert dropped >= weights // 2 and armed >= weights // 2
    # without drops every page read stays resident: all of the step's; of the prefill's, all where its GEMMs run
    # bf16 on AMX, and 94-97% with the native GEMMs (AMD Zen 4: a few armed pages the prefill never reads)
    assert rss_off >= dropped and pre_off >= armed * 0.9
    # with them, after the turn and after the prefill (before any step), a good part of them are gone (measured:
    # 81-100% on Intel, 40% of the step's for int4 on an AMD Zen 4 guest; the kernel maps a neighbour's pages around a
    # fault: fault-around, large folios)
    assert rss_off - rss_on >= dropped // 3, "the step's drops"
    assert pre_off - pre_on >= armed // 2, "the prefill's drops"
    if kind == "llama":                                     # the llama step's own: every page of its table gone
        assert rss_on <= size - dropped + dropped // 4
    assert dtoks == toks
    assert all(m.__dict__.get("page_drop") is None for m in page_drop.quant_linears(m_off))


@pytest.mark.parametrize("mode", MODES)
def test_with_page_drops_off_nothing_is_armed_or_dropped(tmp_path, mode):
    _needs_kernels()
    folder = _stored(tmp_path, mode)
    m, _, _, fs, armed, _ = _turn(folder, False)
    assert armed is False and fs.drop_pages is False and fs.nat.drops is None
    assert fs.nat._plan[2] is not None and fs.nat._plan_keep.drop == 0            # the C step's plan: no table
    assert all(lin.__dict__.get("page_drop") is None for lin in page_drop.quant_linears(m))
    assert _mapping(m.head.qweight.data_ptr())[1] >= 0.9 * page_drop.mapped_quant_bytes(m)


def test_the_default_drops_for_a_stored_model_of_the_threshold_and_not_below(tmp_path):
    folder = _stored(tmp_path, "int4")
    m = load_quantized(folder)
    size = page_drop.mapped_quant_bytes(m)
    assert size > 0
    assert page_drop.resolve(None, m, min_bytes=size) and not page_drop.resolve(None, m, min_bytes=size + 1)
    assert page_drop.resolve(True, m, min_bytes=size + 1) and not page_drop.resolve(False, m, min_bytes=size)
    assert not page_drop.resolve(None, m)                  # a test model is far below DROP_MIN_BYTES: off
    full = TinyAgentLM(config_for("tiny"))                 # not stored: nothing mapped to hand back
    assert not page_drop.resolve(None, full, min_bytes=0)
    env = EngineOptions.from_env
    assert env({"TINYCHAT_DROP_PAGES": "1"}).drop_pages is True
    assert env({"TINYCHAT_DROP_PAGES": "0"}).drop_pages is False
    assert env({"TINYCHAT_DROP_PAGES": "auto"}).drop_pages is None and env({}).drop_pages is None


@pytest.mark.parametrize("mode", MODES)
def test_a_chat_with_page_drops_records_the_same_step_and_replies_the_same(tmp_path, mode):
    folder = _stored(tmp_path, mode)
    st = ChatSettings(max_new=8, temperature=0.0, seed=1)
    rt = load_runtime(folder, mode)
    chats = [open_chat(rt, mode, "cpu", st, {}, options=EngineOptions(drop_pages=d), autosave=False)
             for d in (False, True)]
    replies = [c.send("hello there").token_ids for c in chats]
    assert [c.plan.drop_pages for c in chats] == [False, True]
    assert replies[0] == replies[1] and len(replies[0]) > 3
    assert chats[0].step_name() == chats[1].step_name()     # the rounding is the same: so is the recorded step


def test_a_copy_of_a_model_armed_to_drop_drops_nothing(tmp_path):
    m = load_quantized(_stored(tmp_path, "int4"))
    assert page_drop.arm(m, True) > 0
    c = copy.deepcopy(m)                                    # its tensors are heap copies: no addresses carried over
    assert all(lin.__dict__.get("page_drop") is None for lin in page_drop.quant_linears(c))
    assert page_drop.arm(m, False) == 0
    assert all(lin.page_drop is None for lin in page_drop.quant_linears(m))


def test_by_default_only_a_two_level_heads_int8_rows_go_back_after_each_step(tmp_path):
    _needs_kernels()
    folder = _stored(tmp_path, "int4")                 # a stored int4 llama: the two-level head, far below 4 GiB
    m, toks, logits, fs, armed, _ = _turn(folder, None)
    m_off, toks_off, logits_off, fs_off, _, _ = _turn(folder, False)
    assert head4.active(m.head) and not armed and fs.drop_pages is False and fs_off.nat.drops is None
    table = fs.nat.drops[0]
    assert int(table[:-1, 1::2].sum()) == 0            # no layer's row: the body's pages stay
    head_rows = page_drop.PageRanges((m.head.qweight, m.head.scale), fs.nat.drops[1][-1]._mapped)
    assert [tuple(int(v) for v in table[-1, 2 * i:2 * i + 2]) for i in range(len(head_rows.spans))] == \
        head_rows.spans and int(table[-1, 2 * len(head_rows.spans):].abs().sum()) == 0   # the int8 rows alone
    assert toks == toks_off and torch.equal(logits, logits_off)
    on, pages = _pages_mapped(m.head.qweight)
    off, _ = _pages_mapped(m_off.head.qweight)
    assert on <= 2 and off >= pages // 2, (on, off, pages)   # the edge pages a neighbour shares; without: fault-around
    assert _pages_mapped(m.head.q4weight)[0] >= _pages_mapped(m.head.q4weight)[1] - 2     # the copy's scan stays
