"""quantize_cpu and the lean CPU step (engine/cpu_step.py, native or PyTorch) against _decode_one on the same quantized
model, and against fp32."""
import pytest
import torch

from support import make_model
from tinychat.engine import (BF16Linear, Decoder, EngineOptions, Int8Linear, KVCache, append, int8_kernel_ok,
                             quantize_cpu)

# Relative error = max |Δlogit| / max |logit|, over a 40-token greedy walk.
FAST_VS_ONE = {"int8": 0.02, "bf16": 0.02}    # same quantized weights, different op order / norm epsilon
QUANT_VS_FP32 = {"int8": 0.08, "bf16": 0.05}  # the quantization itself


def _walk(model, fast: bool, tokens):
    cache = KVCache(model, 1, 128, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=False)
    dec.fast = fast
    out = [append(model, cache, tokens[:, :10], [10])]
    for t in tokens[0, 10:].tolist():
        out.append(dec.step(t))
    return torch.cat(out), dec.mode


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_fast_step_matches_decode_one_on_the_quantized_model(mode):
    if mode == "int8" and not int8_kernel_ok():
        pytest.skip("this torch build has no CPU int8 kernel")
    tokens = torch.randint(0, 512, (1, 50), generator=torch.Generator().manual_seed(2))
    ref, _ = _walk(make_model(), True, tokens)
    q = quantize_cpu(make_model(), mode)
    assert isinstance(q.blocks[0].mlp.up, {"int8": Int8Linear, "bf16": BF16Linear}[mode])
    fast, fmode = _walk(q, True, tokens)
    one, omode = _walk(q, False, tokens)
    assert (fmode, omode) == (f"fast-{mode}", "eager")
    assert _rel(fast, one) < FAST_VS_ONE[mode]
    assert _rel(fast, ref) < QUANT_VS_FP32[mode]
    assert _rel(one, ref) < QUANT_VS_FP32[mode]
    assert _rel(fast, ref) > 0          # really quantized


def test_int8_linear_matches_dequantized_weights_for_prefill_and_decode_rows():
    if not int8_kernel_ok():
        pytest.skip("this torch build has no CPU int8 kernel")
    lin = torch.nn.Linear(64, 96, bias=False)
    q = Int8Linear(lin)
    w = q.weight
    assert (w - lin.weight).abs().max() <= lin.weight.abs().max() / 127 + 1e-6
    for rows in (1, 200):                                  # int8 kernel path, dequantize + GEMM path
        x = torch.randn(rows, 64)
        assert torch.allclose(q(x), x @ w.t(), rtol=0.02, atol=0.02)


def test_unknown_quant_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown quant mode"):
        quantize_cpu(make_model(), "int3")


def test_quant_mode_names_match_the_quant_classes():
    from tinychat.choices import QUANT_MODES
    from tinychat.engine.quant import QUANT_CLASSES
    assert QUANT_MODES == ("none", *QUANT_CLASSES)


def test_quant_none_leaves_model_unchanged():
    m = make_model()
    assert quantize_cpu(m, "none") is m and isinstance(m.head, torch.nn.Linear)


def _step(model, max_len=64, options=None):
    """A fresh Decoder's lean CPU step on the model (what the decoder steps through)."""
    return Decoder(model, KVCache(model, 1, max_len, "cpu", dtype=torch.float32), graph=False,
                   options=options).cpu_step


def _walk_dtype(model, fast: bool, tokens, dtype, options=None):
    cache = KVCache(model, 1, 128, "cpu", dtype=dtype)
    dec = Decoder(model, cache, graph=False, options=options)
    dec.fast = fast
    out = [append(model, cache, tokens[:, :10], [10])]
    for t in tokens[0, 10:].tolist():
        out.append(dec.step(t))
    return torch.cat(out)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])   # native attention / PyTorch attention
def test_native_int8_step_matches_the_pytorch_steps(kv_dtype):
    """The native kernels (engine/native.py, built where a C compiler exists) against the PyTorch lean step and
    _decode_one on the same int8 model, with the tolerances the PyTorch lean step has: over a 40-token walk the
    logits stay within 2 % of the largest logit (FAST_VS_ONE). The native step rounds the activations to int8 in
    blocks of 32 (one fp32 scale each, INT8_STEP_VERSION 2), the PyTorch steps to bf16: the logits differ by that
    rounding (0.66 % here, 0.32 % with the int16 activations of v1), never bit for bit. Exactness between runs of the same build is tc_step's own test."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    tokens = torch.randint(0, 512, (1, 50), generator=torch.Generator().manual_seed(3))
    ref = _walk_dtype(make_model(), True, tokens, kv_dtype)
    q = quantize_cpu(make_model(), "int8")
    assert _step(q).nat is not None
    nat = _walk_dtype(q, True, tokens, kv_dtype)
    no_native = EngineOptions(native=False)
    assert _step(q, options=no_native).nat is None
    torch_fast = _walk_dtype(q, True, tokens, kv_dtype, options=no_native)
    one = _walk_dtype(q, False, tokens, kv_dtype)
    assert _rel(nat, one) < FAST_VS_ONE["int8"]
    assert _rel(nat, torch_fast) < FAST_VS_ONE["int8"]
    assert _rel(nat, ref) < QUANT_VS_FP32["int8"]
    assert _rel(nat, torch_fast) > 0          # really the other path


def test_native_step_runs_one_tensor_op_per_token():
    """The native int8 step keeps its bookkeeping (token history, ring positions, lengths, the embedding row, the
    Engram addresses) in numpy views and Python ints: the only tensor op left per token is the copy of the logits.
    Each tensor op hands the GIL away and back, which in the app costs the decode thread a wait whenever the UI
    thread is rendering; this counts them (it does not time anything)."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    q = quantize_cpu(make_model(), "int8")
    assert any(b.engram is not None for b in q.blocks)
    cache = KVCache(q, 1, 64, "cpu", dtype=torch.float32)
    dec = Decoder(q, cache)
    with torch.no_grad():
        for t in range(3):
            dec.step(t)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for t in range(10):
                dec.step(t + 5)
    top = [e.name for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    assert len(top) <= 10, sorted(top)
    assert cache.length() == 13 and int(cache.lens[0]) == 13
    assert cache.tokens[0, :13].tolist() == [0, 1, 2, *range(5, 15)]


@pytest.mark.parametrize("nt", [1, 2])
def test_native_step_in_one_call_equals_the_kernels_called_from_python(nt, monkeypatch):
    """tc_step (the whole token in one native call: history, ring position, lengths, Engram hashing, embedding,
    segments, head, softcap) against the same kernels driven from Python: bit for bit, logits and every cache
    tensor, past the ring's wrap-around and across an Engram id map changed in place."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    monkeypatch.setattr(torch, "get_num_threads", lambda: nt)
    q = quantize_cpu(make_model(), "int8")
    W = q.cfg.swa_window
    toks = torch.randint(0, q.cfg.vocab_size, (3 * W + 5,), generator=torch.Generator().manual_seed(9)).tolist()
    cid0 = q.cid_map.clone()
    runs = {}
    for in_c in (True, False):
        q.cid_map.copy_(cid0)
        cache = KVCache(q, 1, len(toks) + 4, "cpu", dtype=torch.float32)
        dec = Decoder(q, cache, options=EngineOptions(step_in_c=in_c, tune_threads=False))
        if in_c:
            assert dec.cpu_step.nat.plan(q, cache) is not None
        out = []
        with torch.no_grad():
            for i, t in enumerate(toks):
                if i == W:
                    q.cid_map.copy_(torch.roll(cid0, 1))
                out.append(dec.step(t))
        runs[in_c] = (torch.cat(out), cache)
    (a, ca), (b, cb) = runs[True], runs[False]
    assert torch.equal(a, b)
    for name in ("lk", "lv", "gk", "gv", "lpos", "tokens", "lens", "lens_cpu"):
        assert torch.equal(getattr(ca, name), getattr(cb, name)), name
    assert ca.length() == len(toks)


def test_native_kernels_off_or_unusable_fall_back_to_pytorch(monkeypatch):
    from tinychat.engine import native
    monkeypatch.setenv("TINYCHAT_NATIVE", "0")
    native.reset()
    try:
        assert native.load() is None and "TINYCHAT_NATIVE" in native.why_not
        q = quantize_cpu(make_model(), "int8")
        assert _step(q).nat is None
        tokens = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(4))
        assert torch.isfinite(_walk_dtype(q, True, tokens, torch.float32)).all()
    finally:
        monkeypatch.delenv("TINYCHAT_NATIVE")
        native.reset()
    h = quantize_cpu(make_model(), "int8", head=False)       # full-precision head: the PyTorch lean step
    step = _step(h)
    assert step is not None and step.nat is None


def test_a_deep_copy_of_a_quantized_model_keeps_its_native_step_on_its_own_weights():
    import copy

    from tinychat.engine import native
    q = quantize_cpu(make_model(), "int8")
    c = copy.deepcopy(q)
    tokens = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(5))
    before = _walk_dtype(q, True, tokens, torch.float32)
    if native.load() is not None:
        nat = _step(c).nat
        assert nat is not None              # the copy's own Decoder builds its native step
        assert nat.head[0] == c.head.qweight.data_ptr() != q.head.qweight.data_ptr()
    for blk in q.blocks:                    # the original's weights change: the copy must not read them
        blk.mlp.down.qweight.zero_()
    assert torch.equal(_walk_dtype(c, True, tokens, torch.float32), before)
    assert not torch.equal(_walk_dtype(q, True, tokens, torch.float32), before)


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_fused_qkv_of_quantized_rows_equals_quantizing_the_fused_rows(mode):
    """The lean step's fused QKV is built from the model's quantized rows; per-row formats make that exact."""
    from tinychat.engine.fused import qkv_rows
    m = make_model()
    a = m.blocks[0].attn
    fp32 = torch.nn.Linear(m.cfg.d_model, 1, bias=False)
    fp32.weight = torch.nn.Parameter(torch.cat([lin.weight.detach()[s:e] for lin, s, e in
                                                qkv_rows(a, m.cfg.n_kv_heads, m.cfg.head_dim)]))
    want = {"int8": Int8Linear, "bf16": BF16Linear}[mode](fp32)
    q = quantize_cpu(m, mode)
    got = _step(q).qkv[0]
    for name in ("qweight", "scale") if mode == "int8" else ("weight",):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_quantizing_an_already_quantized_model_to_another_mode_is_refused():
    if not int8_kernel_ok():
        pytest.skip("this torch build has no CPU int8 kernel (int8 means bf16 here)")
    q = quantize_cpu(make_model(), "bf16")
    assert quantize_cpu(q, "bf16") is q
    with pytest.raises(ValueError, match="already quantized"):
        quantize_cpu(q, "int8")


def test_native_engram_addresses_equal_the_tensor_ones():
    """The native step's Python-int Engram hashing gives _engram_addrs' addresses, at the sequence start (fewer
    previous tokens than the order) and later, and follows a cid_map changed after quantizing."""
    from tinychat.engine.append import _engram_addrs
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    q = quantize_cpu(make_model(), "int8")
    nat = _step(q).nat
    assert nat.engrams
    g = torch.Generator().manual_seed(5)
    for remap in (False, True):
        if remap:
            q.cid_map.copy_(torch.randperm(q.cfg.vocab_size, generator=g))
        tokens = torch.zeros(1, 40, dtype=torch.long)
        tokens[0, :30] = torch.randint(0, q.cfg.vocab_size, (30,), generator=g)
        for L in (0, 1, 2, 7, 29):
            tok = int(tokens[0, L])
            want = _engram_addrs(q, tokens, torch.tensor([L]), torch.tensor([[tok]]))
            prev = tokens[0, max(0, L - nat.n1):L].tolist()
            got = nat.engram_addrs([0] * (nat.n1 - len(prev)) + prev + [tok])
            assert want.keys() == got.keys()
            for k in want:
                assert torch.equal(want[k], got[k]), (L, k)


def test_native_engram_block_matches_its_pytorch_forward():
    """tc_engram (gather, int8 w_v / w_k with int8 block activations, the rms-normed gate) against Engram.forward on
    the same int8 model: the only difference is the activations' rounding."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    q = quantize_cpu(make_model(), "int8")
    nat = _step(q).nat
    (li,) = [i for i, e in nat.engram_native.items() if e is not None]
    en = q.blocks[li].engram
    table, vq, vs, kq, ks = nat.engram_native[li]
    g = torch.Generator().manual_seed(11)
    for trial in range(5):
        toks = torch.randint(0, q.cfg.vocab_size, (nat.n1 + 1,), generator=g).tolist()
        ad = nat.engram_addrs(toks)[li]
        x0 = torch.randn(q.cfg.d_model, generator=g) * (0.1 + trial)
        want = x0 + en(x0[None, None], ad)[0, 0]
        x = x0.clone()
        nat.lib.tc_engram(x.data_ptr(), table.data_ptr(), ad.data_ptr(), ad.size(-1), table.size(1), vq, vs, kq, ks,
                          q.cfg.d_model, nat.e.data_ptr(), nat.exq.data_ptr(), nat.ek.data_ptr(), nat.ev.data_ptr(), 1)
        delta, ref = x - x0, want - x0
        assert ((delta - ref).abs().max() / ref.abs().max()).item() < 1e-2, trial


def test_cache_host_views_follow_the_tensors_even_in_a_copy():
    """KVCache.host / length read through numpy views; a deep copy (or a replaced tensor) gets views of its own."""
    import copy
    q = quantize_cpu(make_model(), "int8")
    cache = KVCache(q, 1, 16, "cpu", dtype=torch.float32)
    toks, lpos, lens, lens_cpu = cache.host()
    lens_cpu[0] = 3
    assert cache.length() == 3 and int(cache.lens_cpu[0]) == 3
    other = copy.deepcopy(cache)
    other.lens_cpu[0] = 7
    other.host()[0][0, 2] = 5
    assert other.length() == 7 and cache.length() == 3
    assert int(other.tokens[0, 2]) == 5 and int(cache.tokens[0, 2]) == 0


def test_engine_options_defaults_come_from_the_environment():
    env = {"TINYCHAT_NATIVE": "0", "TINYCHAT_PREFILL_BF16": "1", "TINYCHAT_TUNE_THREADS": "off",
           "TINYCHAT_PAD_SHAPES": ""}
    o = EngineOptions.from_env(env)
    assert (o.native, o.step_in_c, o.prefill_bf16, o.pad_shapes, o.tune_threads) == (False, True, True, None, False)
    assert EngineOptions.from_env({}, step_in_c=False) == EngineOptions(step_in_c=False)
    q = quantize_cpu(make_model(), "bf16", options=o)
    assert q.blocks[0].mlp.up.prefill_bf16 is True


def _native_or_skip():
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    return native


def test_int8_prefill_picks_its_kernel_by_rows_options_and_kernels():
    _native_or_skip()
    from tinychat.engine import quant as Q
    lin = torch.nn.Linear(64, 96)
    fp, bf = Int8Linear(lin, prefill_bf16=False), Int8Linear(lin, prefill_bf16=True)
    off = Int8Linear(lin, prefill_bf16=False, native=False)
    assert [fp.prefill_kernel(r) for r in (1, Q.INT8_GEMM_ROWS, Q.INT8_GEMM_ROWS + 1, 1000)] == \
        ["int8-gemv", "int8-gemv", "native-gemm", "native-gemm"]
    assert [off.prefill_kernel(r) for r in (1, Q.INT8_GEMV_ROWS, Q.INT8_GEMV_ROWS + 1)] == \
        ["int8-gemv", "int8-gemv", "fp32-gemm"]
    assert [bf.prefill_kernel(r) for r in (Q.INT8_GEMV_ROWS_BF16, Q.INT8_GEMV_ROWS_BF16 + 1)] == \
        ["native-gemm", "bf16-gemm"]                      # asked for: bf16 GEMMs beyond their row threshold
    default = Int8Linear(lin)          # not asked: the native GEMM, bf16 dot products or not, but on AMX tiles
    assert default.prefill_kernel(1000) == ("bf16-gemm" if Q.cpu_has_amx() else "native-gemm")
    merged = Int8Linear.from_rows([(off, 0, 48), (off, 48, 96)])
    assert merged.native is False and merged.prefill_kernel(1000) == "fp32-gemm"


def test_int8_prefill_keeps_bf16_gemms_by_default_only_on_amx_machines(monkeypatch):
    _native_or_skip()
    from tinychat.engine import prefill_policy
    lin = torch.nn.Linear(64, 96)
    for amx, bf16_dot, want in ((True, True, "bf16-gemm"), (False, True, "native-gemm"), (False, False, "native-gemm")):
        monkeypatch.setattr(prefill_policy, "cpu_has_amx", lambda amx=amx: amx)
        monkeypatch.setattr(prefill_policy, "cpu_has_bf16_dot", lambda b=bf16_dot: b)
        assert Int8Linear(lin).prefill_kernel(200) == want
        assert Int8Linear(lin, prefill_bf16=False).prefill_kernel(200) == "native-gemm"
        assert Int8Linear(lin, prefill_bf16=True).prefill_kernel(200) == "bf16-gemm"


def test_int8_prefill_keeps_the_fp32_gemm_where_the_kernels_have_only_their_scalar_path(monkeypatch):
    native = _native_or_skip()
    lin = Int8Linear(torch.nn.Linear(64, 96), prefill_bf16=False)
    assert lin.prefill_kernel(200) == "native-gemm"

    class Scalar:
        def tc_kernel_path(self):
            return b"scalar"
    monkeypatch.setattr(native, "load", lambda: Scalar())
    assert native.gemm_lib() is None and lin.prefill_kernel(200) == "fp32-gemm"


@pytest.mark.parametrize("rows", [5, 37, 600])          # one tile, remainders, more than one GEMM chunk
def test_int8_prefill_on_the_native_gemm_keeps_the_bias_and_the_int8_rounding(rows):
    """Qwen-style q/k/v biases: the fused Linear of biased rows through the native GEMM equals float64 math on the
    rounded activations plus the bias (1e-5 of the largest output), and stays within the int8 activation step of
    the dequantized weights' fp32 product."""
    native = _native_or_skip()
    g = torch.Generator().manual_seed(rows)
    a, b = torch.nn.Linear(96, 64), torch.nn.Linear(96, 40)
    for lin in (a, b):
        lin.bias.data = torch.randn(lin.bias.shape, generator=g)
    qa, qb = Int8Linear(a, prefill_bf16=False), Int8Linear(b, prefill_bf16=False)
    fused = Int8Linear.from_rows([(qa, 0, 64), (qb, 0, 40)])
    x = torch.randn(1, rows, 96, generator=g)
    assert fused.prefill_kernel(rows) == "native-gemm"
    y = fused(x)
    assert y.shape == (1, rows, 104) and y.dtype == torch.float32
    ref = native.gemm_ref(x[0], fused.qweight, fused.scale.float(), fused.bias)
    assert ((y[0].double() - ref).abs().max() <= 1e-5 * ref.abs().max()).item()
    exact = x[0] @ fused.weight.t() + fused.bias
    assert 0 < ((y[0] - exact).abs().max() / exact.abs().max()).item() < 0.02
    assert torch.allclose(y[0, :, 64:], qb(x)[0], rtol=1e-5, atol=1e-5)      # the rows keep their own bias


def test_native_int8_prefill_logits_stay_within_the_int8_tolerance_of_the_fp32_gemm_prefill():
    """The whole prefill (append of 150 tokens) with the int8 Linears on the native GEMM against the dequantized
    fp32 GEMMs on the same int8 model: the activations' int8 rounding moves the logits by less than FAST_VS_ONE
    (2 % of the largest logit), never bit for bit."""
    _native_or_skip()
    q = quantize_cpu(make_model(), "int8", options=EngineOptions(prefill_bf16=False))
    tokens = torch.randint(0, 512, (1, 150), generator=torch.Generator().manual_seed(8))
    outs = {}
    for flag in (True, False):
        for m in q.modules():
            if isinstance(m, Int8Linear):
                m.native = flag
        assert q.blocks[0].mlp.up.prefill_kernel(150) == ("native-gemm" if flag else "fp32-gemm")
        cache = KVCache(q, 1, 160, "cpu", dtype=torch.float32)
        outs[flag] = append(q, cache, tokens, [150])
    assert 0 < _rel(outs[True], outs[False]) < FAST_VS_ONE["int8"]
