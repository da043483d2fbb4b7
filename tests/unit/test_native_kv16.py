"""The fp16 K/V cache: the conversions and the fp16 attention kernels (native_f16.h, native_attn_kv.h's _h kernels)
against float64 references on the same fp16 values, on this machine's build and on every other kernel path (x86-64
levels natively, aarch64 under qemu-user through tests/native/kv16_harness.c, which tests/native_harness.py builds);
prefill's writes, the cache's size, the default choice and the step's name sessions record."""
import pytest
import torch

from native_harness import AARCH64, run_aarch64, run_x86
from support import make_llama_model, make_model
from tinychat.engine import KVCache, append, quantize_cpu
from tinychat.engine import native
from tinychat.options import EngineOptions
from tinychat.plan import kv_format, step_name

HARNESS = "kv16_harness.c"
# native_attn.h's OpenMP pragmas (built without -fopenmp) and the static functions this harness does not call
WARNINGS_OFF = ("-Wno-unknown-pragmas", "-Wno-unused-function")


def _lib():
    lib = native.load()
    if lib is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    return lib


def test_rows_round_to_fp16_as_torch_half_does():
    lib = _lib()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20011, generator=g) * torch.exp(torch.randn(20011, generator=g) * 5)
    ties = torch.arange(0x3c00, 0x3c00 + 500, dtype=torch.int16).view(torch.float16).float()
    x = torch.cat([x, (ties[:-1] + ties[1:]) / 2, torch.tensor([65504.0, 65519.99, 65520.0, -0.0, 3e-8, 6e-8, 1e-7])])
    h = torch.empty(x.numel(), dtype=torch.float16)
    lib.tc_f2h_rows(x.data_ptr(), h.data_ptr(), x.numel())
    assert torch.equal(h.view(torch.int16), x.half().view(torch.int16))
    back = torch.empty(x.numel())
    lib.tc_h2f_rows(h.data_ptr(), back.data_ptr(), x.numel())
    assert torch.equal(back, h.float())


@pytest.mark.parametrize("D", [16, 64, 24])
@pytest.mark.parametrize("L", [0, 40, 300])
@pytest.mark.parametrize("H,Hk", [(9, 3), (8, 2), (12, 2), (4, 4)])
def test_fp16_attention_matches_the_float64_reference_on_the_rounded_keys(D, L, H, Hk):
    lib = _lib()
    M = 512
    g = torch.Generator().manual_seed(D * 1000 + L + H)
    q = torch.randn(H * D, generator=g)
    gk, gv = (torch.randn(Hk, M + 1, D, generator=g) * 2).half(), torch.randn(Hk, M + 1, D, generator=g).half()
    rep = H // Hk
    want = torch.cat([torch.softmax(gk[h // rep, :L + 1].double() @ q[h * D:(h + 1) * D].double(), 0)
                      @ gv[h // rep, :L + 1].double() for h in range(H)])
    first = None
    for nt in (1, 2, 3):
        y, sc = torch.empty(H * D), torch.empty(nt * rep * (M + 1))
        lib.tc_attend_h(q.data_ptr(), H, Hk, D, gk.data_ptr(), gv.data_ptr(), M + 1, L, y.data_ptr(), sc.data_ptr(),
                        nt)
        torch.testing.assert_close(y.double(), want, rtol=2e-5, atol=2e-5)
        first = y.clone() if first is None else first
        assert torch.equal(y, first), f"{nt} threads changed the bits"


@pytest.mark.parametrize("D", [64, 24])
@pytest.mark.parametrize("L0,C", [(0, 37), (50, 20)])
def test_fp16_prefill_attention_gives_the_fp32_kernels_bits_on_the_widened_rows(D, L0, C):
    lib = _lib()
    if not native.kernel_info().prefill_attn:
        pytest.skip("prefill's attention runs on SDPA on this kernel path")
    H, Hk, M = 9, 3, 128
    g = torch.Generator().manual_seed(D + L0)
    q = torch.randn(H, C, D, generator=g) * 0.3
    gk, gv = (torch.randn(Hk, M + 1, D, generator=g) * 2).half(), torch.randn(Hk, M + 1, D, generator=g).half()
    got = native.prefill_attn_h(lib, q, gk, gv, L0)
    assert torch.equal(got, native.prefill_attn(lib, q, gk.float(), gv.float(), None, L0, 0))
    rep = H // Hk
    for h, i in ((0, 0), (4, C - 1), (8, C // 2)):               # each query against keys 0..its position, float64
        n = L0 + i + 1
        w = torch.softmax(gk[h // rep, :n].double() @ q[h, i].double(), 0) @ gv[h // rep, :n].double()
        torch.testing.assert_close(got[h, i].double(), w, rtol=2e-5, atol=2e-5)


X86 = [(["-march=x86-64-v4", "-mavx512vnni"], "avx512-vnni", {"avx512_vnni", "avx512bw"}),
       (["-march=x86-64-v4"], "avx512", {"avx512f", "avx512bw", "avx512vl", "f16c"}),
       (["-march=x86-64-v3", "-mavxvnni"], "avx2-vnni", {"avx_vnni", "avx2", "f16c"}),
       (["-march=x86-64-v3", "-mno-f16c"], "avx2", {"avx2", "fma"}),       # no F16C: the plain C conversions
       (["-march=x86-64"], "scalar", set())]


@pytest.mark.parametrize("flags,path,needs", X86, ids=[p + ("-nof16c" if "-mno-f16c" in f else "") for f, p, _ in X86])
def test_x86_kernel_paths_fp16_cache_kernels_match_the_float64_reference(flags, path, needs, tmp_path):
    assert run_x86(HARNESS, flags, needs, tmp_path, WARNINGS_OFF) == path


@pytest.mark.parametrize("flags,path", AARCH64, ids=[p for _, p in AARCH64])
def test_aarch64_fp16_cache_kernels_match_the_float64_reference_under_qemu(flags, path, tmp_path):
    assert run_aarch64(HARNESS, flags, tmp_path, WARNINGS_OFF) == path


def test_an_fp16_cache_holds_half_the_bytes():
    m = make_llama_model()
    a, b = KVCache(m, 1, 256, "cpu", dtype=torch.float32), KVCache(m, 1, 256, "cpu", dtype=torch.float16)
    assert b.kv16 and not a.kv16 and b.attn_dtype == torch.float32
    assert 2 * b.nbytes() == a.nbytes()
    a.lens_cpu[0] = b.lens_cpu[0] = 100
    assert 2 * b.used_bytes() == a.used_bytes()


def test_prefill_writes_the_fp16_rounding_of_the_keys_an_fp32_cache_gets_and_replays_to_the_same_bits():
    _lib()
    q = quantize_cpu(make_llama_model(), "int8")
    toks = torch.randint(0, 512, (1, 30), generator=torch.Generator().manual_seed(8))
    c32, c16 = KVCache(q, 1, 64, "cpu", dtype=torch.float32), KVCache(q, 1, 64, "cpu", dtype=torch.float16)
    append(q, c32, toks, [30])
    append(q, c16, toks, [30])
    # layer 0's K/V come before any attention: the same fp32 values, rounded once (to nearest even)
    assert torch.equal(c16.gk[0, :, :, :30], c32.gk[0, :, :, :30].half())
    assert torch.equal(c16.gv[0, :, :, :30], c32.gv[0, :, :, :30].half())
    assert not torch.equal(c16.gk[1, :, :, :30].float(), c32.gk[1, :, :, :30])     # later layers: another rounding
    again = KVCache(q, 1, 64, "cpu", dtype=torch.float16)              # a replay of the same feed: the same bits
    append(q, again, toks[:, :11], [11])
    append(q, again, toks[:, 11:], [19])
    append(q, c16 := KVCache(q, 1, 64, "cpu", dtype=torch.float16), toks[:, :11], [11])
    append(q, c16, toks[:, 11:], [19])
    assert torch.equal(again.gk, c16.gk) and torch.equal(again.gv, c16.gv)


def test_auto_takes_fp16_for_an_int8_llama_on_native_kernels_and_fp32_elsewhere():
    llama, tiny = make_llama_model(), make_model()
    auto = EngineOptions()
    assert kv_format(llama, "int8", "cpu", auto, "avx512-vnni") == "fp16"
    assert kv_format(llama, "int4", "cpu", auto, "neon") == "fp16"
    assert kv_format(llama, "int8", "cpu", auto, "scalar") == "fp32"       # no fp16 conversions in hardware
    assert kv_format(llama, "int8", "cpu", auto, None) == "fp32"           # no kernels
    assert kv_format(llama, "int8", "cpu", EngineOptions(native=False), "avx2") == "fp32"
    assert kv_format(llama, "none", "cpu", auto, "avx2") == "fp32"         # no int8 step records it
    assert kv_format(llama, "int8", "cuda", auto, None) is None            # GPUs: bf16
    assert kv_format(tiny, "int8", "cpu", EngineOptions(kv_cache="fp16"), "avx2") == "fp32"   # TinyAgentLM's ring
    assert kv_format(llama, "int8", "cpu", EngineOptions(kv_cache="fp32"), "avx2") == "fp32"
    assert kv_format(llama, "int8", "cpu", EngineOptions(kv_cache="fp16", native=False), None) == "fp16"
    assert EngineOptions.from_env({"TINYCHAT_KV_CACHE": "fp32"}).kv_cache == "fp32"
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        EngineOptions(kv_cache="fp8")


def test_the_step_name_records_an_fp16_cache():
    from tinychat.chat.replay import describe_step
    name = step_name(True, "native-gemm", 5, "avx512-vnni", "int8", kv16=True)
    assert name == "native-int8-v5+kv16@avx512-vnni"
    assert step_name(False, "bf16-gemm", 5, None, "int8", kv16=True) == "torch-int8+bf16-prefill+kv16"
    assert describe_step(name) == "the native int8 step v5 with an fp16 KV cache on avx512-vnni kernels"
    assert describe_step("torch-int8+bf16-prefill+kv16") == \
        "the PyTorch int8 step with bf16 prefill GEMMs with an fp16 KV cache"
