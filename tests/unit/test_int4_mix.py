"""--quant int4's per-layer mix (engine/int4_rules.py's int4_more_bits, after llama.cpp's use_more_bits): the layers it
picks, quantize_cpu's classes, the native llama step's per-layer formats (float64 reference and the PyTorch lean
step), and stored files (layout 4) that hold each Linear in its own format; version-3 files load as before."""
import shutil
import sys
from pathlib import Path

import pytest
import torch

from support import make_llama_model
from tinychat.engine import Decoder, KVCache, int8_kernel_ok, native, quantize_cpu
from tinychat.engine import int4_rules
from tinychat.engine.cpu_step import CpuStep
from tinychat.engine.int4_rules import int4_keeps_int8, int4_more_bits, use_more_bits
from tinychat.engine.native_step import layer_format, layer_formats
from tinychat.engine.quant import Int4Linear, Int8Linear
from tinychat.importer import import_model
from tinychat.loading import load_folder, load_runtime, open_chat
from tinychat.norm_gains import GAINS_FILE
from tinychat.options import EngineOptions
from tinychat.quant_files import QKV, VERSION_KEY, load_quantized, read_header, save_quantized
from tinychat.settings import ChatSettings

sys.path.insert(0, str(Path(__file__).parent))
from test_llama_import import VARIANTS, _weights, write_hf  # noqa: E402
from test_native_llama import TOKENS, RefStep, _lean_walk, _native_walk, _rel, _with_gains  # noqa: E402

needs_kernels = pytest.mark.skipif(native.load() is None, reason=f"native kernels off: {native.why_not}")
needs_int8 = pytest.mark.skipif(not int8_kernel_ok(), reason="this torch build has no CPU int8 kernel")


@pytest.mark.parametrize("n, layers", [
    (30, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]),     # SmolLM2-135M: 14 of 30
    (32, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]),
    (4, [2, 3]),
    (3, [2]),
])
def test_use_more_bits_picks_llama_cpps_layers(n, layers):
    assert [i for i in range(n) if use_more_bits(i, n)] == layers


def test_int4_keeps_q_k_v_int8_on_the_more_bits_layers_of_a_model_with_gains_only():
    assert int4_keeps_int8("blocks.5.attn.w_q", gained=True, n_layers=30)
    assert int4_keeps_int8("blocks.5.attn.w_kv_global", gained=True, n_layers=30)
    assert not int4_keeps_int8("blocks.4.attn.w_q", gained=True, n_layers=30)
    assert not int4_keeps_int8("blocks.5.attn.w_o", gained=True, n_layers=30)
    assert not int4_keeps_int8("blocks.5.mlp.down", gained=True, n_layers=30)
    assert not int4_keeps_int8("blocks.5.attn.w_q", gained=True)               # no layer count: no mix
    assert int4_keeps_int8("blocks.4.attn.w_q", gained=False, n_layers=30)     # folded: q/k/v int8 everywhere
    assert not int4_keeps_int8("blocks.5.mlp.down", gained=False, n_layers=30)
    assert int4_keeps_int8("head", gained=True, n_layers=30)
    assert not int4_more_bits("head", 30) and not int4_more_bits("w_q", 30)


def _mixed(seed=0, bias=True):
    """A tiny llama (4 layers) with norm gains, quantized int4: q/k/v int8 on layers 2 and 3, int4 on 0 and 1. The head
    is int8 alone (the two-level head has its own tests: test_two_level_head.py), so the layers are what differs."""
    return quantize_cpu(_with_gains(make_llama_model(seed, bias=bias)), "int4", options=EngineOptions(head4=False))


def test_quantize_cpu_mixes_the_layers_of_a_model_with_gains_and_not_of_a_folded_one():
    m = _mixed()
    assert [type(f) for f in m.fused_qkv] == [Int4Linear, Int4Linear, Int8Linear, Int8Linear]
    for blk in m.blocks:
        assert type(blk.attn.w_o) is type(blk.mlp.up) is type(blk.mlp.down) is Int4Linear
    assert type(m.head) is Int8Linear
    assert all(f.in_gain is not None for f in m.fused_qkv)
    folded = quantize_cpu(make_llama_model(), "int4")
    assert {type(f) for f in folded.fused_qkv} == {Int8Linear}


def test_layer_formats_are_per_layer_and_the_plan_wide_mask_refuses_a_mix():
    m = _mixed()
    fs = CpuStep.build(m, EngineOptions(native=False))
    assert layer_formats(m, fs) == [15, 15, 14, 14]         # TC_F_QKV (1) clear where q/k/v are int8
    assert layer_format(m, fs) is None                      # tc_step (TinyAgentLM's) has one mask: PyTorch step
    folded = quantize_cpu(make_llama_model(), "int4")
    ffs = CpuStep.build(folded, EngineOptions(native=False))
    assert layer_formats(folded, ffs) == [14] * 4 and layer_format(folded, ffs) == 14


@needs_kernels
@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("bias", [True, False], ids=["qkv-bias", "no-bias"])
def test_the_native_llama_step_on_a_mixed_model_equals_the_float64_reference(bias, nt):
    m = _mixed(bias=bias)
    got, step, cache = _native_walk(m, nt, rescore=False)
    assert step.nat.tab[:, -1].tolist() == [15, 15, 14, 14]
    ref = RefStep(m, step)
    want = torch.stack([ref(t, L, rescore=False) for L, t in enumerate(TOKENS[0].tolist())])
    assert _rel(got, want) < 1e-4
    assert _rel(cache.gk[3, 0, :, :TOKENS.size(1)], torch.stack(ref.k[3], 1)) < 1e-4     # an int8-q/k/v layer


@needs_kernels
def test_the_native_llama_step_reads_each_layers_own_format():
    m = _mixed()
    got, _, _ = _native_walk(m, rescore=False)
    dec = Decoder(m, KVCache(m, 1, 64, "cpu", dtype=torch.float32), graph=False,
                  options=EngineOptions(native=True, tune_threads=False))
    dec.cpu_step.nat.rescore_k = 0
    dec.cpu_step.nat.tab[:, -1] = 15                  # every QKV read as int4 (before the plan is built): wrong
    wrong = torch.stack([dec.step(t)[0] for t in TOKENS[0].tolist()])
    assert not torch.allclose(got, wrong, rtol=0.05, atol=0.05 * got.abs().max().item())


@needs_kernels
def test_the_native_llama_step_on_a_mixed_model_stays_close_to_the_pytorch_lean_step():
    m = _mixed()
    fast, _, _ = _native_walk(m)
    slow = _lean_walk(m, torch.float32)
    assert _rel(fast, slow) < 0.02          # int8 activations vs bf16 ones, the same weights
    assert (fast.argmax(-1) == slow.argmax(-1)).float().mean() >= 0.9


def _import_pair(tmp_path):
    cfg = VARIANTS["llama-tied"]
    src = write_hf(tmp_path / "hf", cfg, _weights(cfg, qk_std=0.15))
    return import_model(src, name="full"), import_model(src, name="p4", quant="int4")


def _qkv_dtypes(h, n):
    return [h[f"blocks.{i}.attn.{QKV}.qweight"]["dtype"] for i in range(n)]


@needs_int8
def test_a_stored_int4_file_holds_the_mix_and_loads_it_as_quantizing_at_start(tmp_path):
    full, packed = _import_pair(tmp_path)
    h = read_header(packed / "model.safetensors")
    assert h["__metadata__"][VERSION_KEY] == "4"
    assert _qkv_dtypes(h, 3) == ["U8", "U8", "I8"]                 # 3 layers: layer 2 has more bits
    m = load_quantized(packed)
    ref = quantize_cpu(load_folder(full, "int4"), "int4")
    assert [type(f) for f in m.fused_qkv] == [type(f) for f in ref.fused_qkv] == [Int4Linear, Int4Linear, Int8Linear]
    have, want = m.state_dict(), ref.state_dict()
    for k, v in want.items():
        assert k == "embed.weight" or torch.equal(have[k], v), k
    st = ChatSettings(max_new=8, temperature=0.0, seed=1)
    r = open_chat(load_runtime(packed, "int4"), "int4", "cpu", st, {}, autosave=False).send("hello there")
    assert len(r.token_ids) > 3


@needs_int8
def test_an_int8_file_of_a_model_with_gains_stays_version_3(tmp_path):
    cfg = VARIANTS["llama-tied"]
    src = write_hf(tmp_path / "hf", cfg, _weights(cfg, qk_std=0.15))
    h = read_header(import_model(src, name="p8", quant="int8") / "model.safetensors")
    assert h["__metadata__"][VERSION_KEY] == "3" and set(_qkv_dtypes(h, 3)) == {"I8"}


@needs_int8
def test_a_version_3_int4_file_without_the_mix_still_loads_and_chats(tmp_path, monkeypatch):
    full, _ = _import_pair(tmp_path)
    shutil.copytree(full, tmp_path / "v3")
    (tmp_path / "v3" / "model.safetensors").unlink()
    (tmp_path / "v3" / GAINS_FILE).unlink()
    with monkeypatch.context() as mp:                     # written as before the mix: q/k/v int4 on every layer
        mp.setattr(int4_rules, "INT4_MORE_BITS_NAMES", ())
        save_quantized(load_folder(full, "int4"), tmp_path / "v3", "int4")
    from test_quant_files import _damage
    _damage(tmp_path / "v3", lambda sd, meta: meta.update({VERSION_KEY: "3"}))
    h = read_header(tmp_path / "v3" / "model.safetensors")
    assert h["__metadata__"][VERSION_KEY] == "3" and set(_qkv_dtypes(h, 3)) == {"U8"}
    m = load_quantized(tmp_path / "v3")
    assert {type(f) for f in m.fused_qkv} == {Int4Linear}
    st = ChatSettings(max_new=8, temperature=0.0, seed=1)
    r = open_chat(load_runtime(tmp_path / "v3", "int4"), "int4", "cpu", st, {}, autosave=False).send("hello there")
    assert len(r.token_ids) > 3
