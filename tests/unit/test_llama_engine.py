"""The llama-family options of ModelConfig (every layer global, SwiGLU, no QK-norm, no softcap, norm epsilon, q/k/v
biases, RoPE scaling) through every decode path: append / append_chunked / _decode_one against the full forward,
the static step against the eager loop, the lean int8 / bf16 CPU step against _decode_one."""
import importlib
import json

import pytest
import torch

from support import LLAMA_OPTIONS, make_llama_model, make_model
from tinychat.engine import CHUNK, Decoder, KVCache, append, append_chunked, int8_kernel_ok, quantize_cpu
from tinychat.engine import lean_step as LS
from tinychat.engine import quant as Q
from tinychat.engine.cpu_step import CpuStep
from tinychat.model import CheckpointError, ModelConfig, TinyAgentLM, config_for, rope_inv_freq
from tinychat.options import EngineOptions

TOL = 1e-3   # max |Δlogit| in fp32 against the full forward (seen: ~2e-6)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _feed(model, fn, schedule, B, max_len=400, **kw):
    g = torch.Generator().manual_seed(1)
    cache = KVCache(model, B, max_len, "cpu", dtype=torch.float32)
    seqs = [[] for _ in range(B)]
    worst = 0.0
    for n_new, rows in schedule:
        idx = torch.randint(0, model.cfg.vocab_size, (len(n_new), max(n_new)), generator=g)
        out = fn(model, cache, idx, n_new, rows=rows, **kw)
        for j, r in enumerate(rows if rows is not None else range(B)):
            if n_new[j]:
                seqs[r] += idx[j, :n_new[j]].tolist()
                ref = model(torch.tensor([seqs[r]]))[0, -1]
                worst = max(worst, (out[j] - ref).abs().max().item())
    assert cache.lens_cpu.tolist() == [len(s) for s in seqs]
    return worst


SCHEDULE = [([37, 5, 0], None), ([1, 70, 3], None), ([20, 9], [2, 0]), ([0, 1, 1], None), ([130], [1])]


@pytest.mark.parametrize("bias", [True, False], ids=["qkv-bias", "no-bias"])
@pytest.mark.parametrize("fn", [append, append_chunked], ids=["append", "append_chunked"])
def test_llama_config_append_paths_match_the_full_forward(fn, bias):
    model = make_llama_model(bias=bias, rope_scaling=LLAMA3)
    assert model.blocks[0].attn.w_kv_local is None and all(b.attn.mode == "full" for b in model.blocks)
    assert _feed(model, fn, SCHEDULE, B=3) < TOL
    assert CHUNK < 130      # the long chunk really crossed append_chunked's pieces


def test_llama_config_append_with_small_query_blocks_matches_the_full_forward():
    assert _feed(make_llama_model(), append, SCHEDULE, B=3, block=16) < TOL


def test_llama_config_padded_shapes_match_the_full_forward(monkeypatch):
    # the GPU padding (power-of-two chunk, rounded key ranges) exercised on the CPU
    A = importlib.import_module("tinychat.engine.append")
    monkeypatch.setattr(A, "KEY_ROUND", 16)
    assert _feed(make_llama_model(), append, SCHEDULE, B=3, pad_shapes=True) < TOL


def _walk(model, tokens, graph=False, fast=True, options=None):
    cache = KVCache(model, 1, 128, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=graph, options=options)
    dec.fast = fast
    out = [append(model, cache, tokens[:, :10], [10])]
    for t in tokens[0, 10:].tolist():
        out.append(dec.step(t))
    return torch.cat(out), dec.mode


TOKENS = torch.randint(0, 512, (1, 60), generator=torch.Generator().manual_seed(2))


def test_llama_config_eager_and_static_steps_match_the_full_forward():
    model = make_llama_model(rope_scaling=LLAMA3)
    ref = model(TOKENS)[0, 9:]
    eager, m0 = _walk(model, TOKENS)
    static, m1 = _walk(model, TOKENS, graph="static")
    assert (m0, m1) == ("eager", "static")
    assert (eager - ref).abs().max() < TOL
    assert (static - ref).abs().max() < TOL
    assert eager.argmax(-1).tolist() == static.argmax(-1).tolist() == ref.argmax(-1).tolist()


def test_llama_config_static_greedy_turn_equals_eager():
    model = make_llama_model()
    turns = []
    for graph in (False, "static"):
        cache = KVCache(model, 1, 200, "cpu", dtype=torch.float32)
        dec = Decoder(model, cache, graph=graph)
        logits = append(model, cache, TOKENS[:, :20], [20])
        turns.append(dec.generate(logits, 40, stop=511, temperature=0))
    assert len(set(turns[0])) > 5 and turns[0] == turns[1]


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_llama_config_lean_cpu_step_without_native_kernels_matches_decode_one(mode, monkeypatch):
    if mode == "int8" and not int8_kernel_ok():
        pytest.skip("this torch build has no CPU int8 kernel")
    ref, _ = _walk(make_llama_model(), TOKENS)
    q = quantize_cpu(make_llama_model(), mode)
    # bf16 has no native step at all; int8's (native_llama_step.py) is off here: the PyTorch lean step runs
    off = EngineOptions(native=False)
    if mode == "bf16":
        assert CpuStep.build(q, EngineOptions(native=True)).nat is None
    calls = []
    St = importlib.import_module("tinychat.engine.steps")
    lean = St._decode_lean
    monkeypatch.setattr(St, "_decode_lean", lambda *a, **k: calls.append(1) or lean(*a, **k))
    fast, fmode = _walk(q, TOKENS, options=off)
    one, omode = _walk(q, TOKENS, fast=False, options=off)
    assert (fmode, omode) == (f"fast-{mode}", "eager") and len(calls) == TOKENS.size(1) - 10
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    assert rel(fast, one) < 0.02            # same quantized weights, different op order
    assert 0 < rel(fast, ref) < 0.08        # the quantization itself
    assert (fast.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_lean_step_also_runs_a_tinyagent_config_like_decode_one():
    # the generic lean step covers the default options too (rings, QK-norm, ReLU^2, softcap, Engram)
    q = quantize_cpu(make_model(), "bf16")
    cache = KVCache(q, 1, 128, "cpu", dtype=torch.float32)
    ref = append(q, cache, TOKENS[:, :10], [10])
    c2 = KVCache(q, 1, 128, "cpu", dtype=torch.float32)
    append(q, c2, TOKENS[:, :10], [10])
    step = CpuStep.build(q, EngineOptions(native=False))
    for t in TOKENS[0, 10:40].tolist():
        ref = Decoder(q, cache, graph=False).step(t)
        out = LS._decode_lean(q, c2, torch.full((1, 1), t, dtype=torch.long), c2.length(0), step)
        assert ((out - ref).abs().max() / ref.abs().max()) < 0.02


def test_default_config_is_tinyagent_and_old_config_files_load_unchanged(tmp_path):
    c = config_for("tiny")
    assert c.is_tinyagent and c.has_local and c.mlp_kind == "relu2" and c.qk_norm and c.rope_scaling is None
    old = {k: v for k, v in c.to_dict().items()
           if k not in ("mlp_kind", "qk_norm", "attn_bias", "norm_eps", "rope_scaling")}
    assert ModelConfig.from_dict(old) == c
    m = make_llama_model(rope_scaling=LLAMA3)
    m.save_pretrained(tmp_path)
    back = TinyAgentLM.from_pretrained(tmp_path)
    assert back.cfg == m.cfg and not back.cfg.is_tinyagent
    assert json.loads((tmp_path / "config.json").read_text())["rope_scaling"]["rope_type"] == "llama3"
    assert torch.equal(back(TOKENS), m(TOKENS))


@pytest.mark.parametrize("bad, words", [
    (dict(swa_window=0, kv_group=2), "needs kv_group 1"),
    (dict(mlp_kind="geglu"), "mlp_kind"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "unsupported RoPE scaling type 'yarn'"),
    (dict(logit_softcap=-1.0), "logit_softcap"),
])
def test_impossible_llama_options_are_refused_with_a_clear_message(bad, words):
    with pytest.raises(CheckpointError, match=words):
        config_for("tiny", **{**LLAMA_OPTIONS, **bad})


def test_llama3_rope_scaling_keeps_short_wavelengths_and_divides_long_ones():
    base = rope_inv_freq(64, 500000.0)
    scaled = rope_inv_freq(64, 500000.0, {**LLAMA3, "original_max_position_embeddings": 8192, "factor": 32.0})
    assert torch.equal(scaled[:4], base[:4])                     # high frequencies unchanged
    assert torch.allclose(scaled[-4:], base[-4:] / 32)           # low frequencies divided by the factor
    assert ((scaled <= base) & (scaled >= base / 32)).all()      # the blend stays between


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llama_config_captured_graph_greedy_equals_static_on_cuda():
    model = make_llama_model().cuda()
    outs = []
    for graph in ("static", True):
        cache = KVCache(model, 1, 256, "cuda", dtype=torch.float32)
        dec = Decoder(model, cache, graph=graph)
        logits = append(model, cache, TOKENS[:, :24].cuda(), [24])
        outs.append((dec.mode, dec.generate(logits, 50, stop=511, temperature=0)))
    assert outs[1][0] == "graph" and outs[0][1] == outs[1][1]



@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_rescore_top_writes_the_quantized_heads_fp32_logits_for_the_best_candidates(mode):
    from tinychat.engine.append import rescore_top
    g = torch.Generator().manual_seed(4)
    lin = torch.nn.Linear(64, 300, bias=False)
    lin.weight.data = torch.randn(300, 64, generator=g)
    head = Q.QUANT_CLASSES[mode](lin)
    W = head.qweight.float() * head.scale.float()[:, None] if mode == "int8" else head.weight.float()
    h = torch.randn(2, 64, generator=g)
    raw = torch.nn.functional.linear(h.to(torch.bfloat16), W.to(torch.bfloat16)).float()   # bf16-rounded logits
    out = rescore_top(head, h, raw.clone(), k=5)
    ids = raw.topk(5, dim=-1).indices
    exact = h @ W.t()
    assert torch.allclose(out.gather(1, ids), exact.gather(1, ids), atol=1e-4, rtol=0)
    rest = torch.ones_like(raw, dtype=torch.bool).scatter_(1, ids, False)
    assert torch.equal(out[rest], raw[rest])                  # everything else untouched
    assert not torch.equal(out.gather(1, ids), raw.gather(1, ids))


def test_quantized_llama_paths_rescore_their_head_and_tinyagent_paths_do_not(monkeypatch):
    A = importlib.import_module("tinychat.engine.append")       # the package attribute is the function
    LS = importlib.import_module("tinychat.engine.lean_step")
    calls = []
    real = A.rescore_top
    spy = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(A, "rescore_top", spy)
    monkeypatch.setattr(LS, "rescore_top", spy)
    for model, want in ((quantize_cpu(make_llama_model(), "bf16"), 5), (quantize_cpu(make_model(), "bf16"), 0)):
        calls.clear()
        cache = KVCache(model, 1, 64, "cpu", dtype=torch.float32)
        dec = Decoder(model, cache, graph=False)
        append(model, cache, TOKENS[:, :10], [10])
        for t in TOKENS[0, 10:14].tolist():
            dec.step(t)
        assert len(calls) == want


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_fused_qkv_of_biased_projections_equals_the_separate_projections(mode):
    # a llama layer (no local K/V) with q/k/v biases: CpuStep's fused weight is the rows of w_q / w_kv_global,
    # biases included, so its output is exactly theirs side by side
    if mode == "int8" and not int8_kernel_ok():
        pytest.skip("this torch build has no CPU int8 kernel")
    from tinychat.engine.fused import n_qk_heads, qkv_rows
    q = quantize_cpu(make_llama_model(bias=True), mode)
    c = q.cfg
    a = q.blocks[0].attn
    assert a.w_kv_local is None and a.w_q.bias is not None
    fused = Q.QUANT_CLASSES[mode].from_rows(qkv_rows(a, c.n_kv_heads, c.head_dim))
    xb = torch.randn(1, c.d_model, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    n = c.n_kv_heads * c.head_dim
    kv = a.w_kv_global.mm(xb)
    want = torch.cat([a.w_q.mm(xb), kv[:, :n], kv[:, n:]], dim=1)
    assert n_qk_heads(a, c.n_heads, c.n_kv_heads) == c.n_heads + c.n_kv_heads
    assert fused.bias is not None and torch.equal(fused.mm(xb), want)
