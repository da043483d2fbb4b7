"""The llama family's native int8 decode step (engine/native_llama_step.py, native_llama.h) against a float64
reference of the same math on the same int8 weights and int8-rounded activations, and against the PyTorch lean
step it replaces."""
import math

import pytest
import torch

from support import make_llama_model
from tinychat.engine import Decoder, KVCache, append, quantize_cpu
from tinychat.engine import native
from tinychat.engine import two_level_head as head4
from tinychat.engine.append import RESCORE_K
from tinychat.engine.cpu_step import CpuStep
from tinychat.engine.native_llama_step import _NativeLlama
from tinychat.engine.quant import Int4Linear
from tinychat.options import EngineOptions

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels off: {native.why_not}")

TOKENS = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(5))


def _lin(m, v):
    """An int8 (int4) Linear as the kernels compute it: int8 rows (int4 rows times their group scales) times the
    int8-rounded activations (times the Linear's input gain first, where it has one), in float64."""
    if getattr(m, "in_gain", None) is not None:
        v = v.float() * m.in_gain
    if type(m) is Int4Linear:
        y = native.dequant4_ref(m.qweight, m.scale, m.in_features) @ native.quant8_ref(v.float())
        return y if m.bias is None else y + m.bias.double()
    y = (m.qweight.double() @ native.quant8_ref(v.float())) * m.scale.double()
    return y if m.bias is None else y + m.bias.double()


def _rms(x, eps):
    return x / torch.sqrt((x * x).mean() + eps)


def _rope(v, cs, sn):
    half = v.size(-1) // 2
    a, b = v[..., :half], v[..., half:]
    return torch.cat([a * cs - b * sn, b * cs + a * sn], dim=-1)


class RefStep:
    """tc_llama_step in float64 PyTorch: its own K/V lists, the same rounding of every int8 product's input; kv16:
    K/V rounded to fp16 as an fp16 cache stores them (the rest in float64)."""

    def __init__(self, model, fs, kv16=False):
        self.m, self.fs, self.c = model, fs, model.cfg
        self.r = (lambda t: t.float().half().double()) if kv16 else (lambda t: t)
        self.eps = model.cfg.norm_eps
        self.k = [[] for _ in model.blocks]
        self.v = [[] for _ in model.blocks]

    def __call__(self, tok, L, rescore=True):
        c, m = self.c, self.m
        H, Hk, D = c.n_heads, c.n_kv_heads, c.head_dim
        cs, sn = m.rope.cos[L].double(), m.rope.sin[L].double()
        x = m.embed.weight[tok].double()
        for li, blk in enumerate(m.blocks):
            heads = _lin(self.fs.qkv[li], _rms(x, self.eps)).view(-1, D)
            q = _rope(heads[:H], cs, sn) / math.sqrt(D)
            self.k[li].append(self.r(_rope(heads[H:H + Hk], cs, sn)))
            self.v[li].append(self.r(heads[H + Hk:H + 2 * Hk]))
            K, V = torch.stack(self.k[li], 1), torch.stack(self.v[li], 1)        # (Hk, L + 1, D)
            rep = H // Hk
            s = torch.einsum("hd,hld->hl", q, K.repeat_interleave(rep, 0))
            y = torch.einsum("hl,hld->hd", torch.softmax(s, -1), V.repeat_interleave(rep, 0))
            x = x + _lin(blk.attn.w_o, y.reshape(-1))
            u = _lin(blk.mlp.up, _rms(x, self.eps))
            g, v = u.chunk(2)
            x = x + _lin(blk.mlp.down, g * torch.sigmoid(g) * v)
        h = _rms(x, self.eps)
        head, k = self.fs.head, RESCORE_K
        if head4.active(head):                  # the two-level head: the int4 copy's scan, its best from int8 rows
            logits = native.dequant4_ref(head.q4weight, head.q4scale, head.in_features) @ native.quant8_ref(h.float())
            k = head4.RESCORE_K
        else:
            logits = _lin(head, h)
        if rescore:
            hd = h.float().double()
            ids = logits.topk(k).indices
            logits[ids] = (self.fs.head.qweight[ids].double() @ hd) * self.fs.head.scale[ids].double()
        return logits


def _with_gains(m, seed=3):
    """m with norm gains kept apart (model.in_gains, as a llama import leaves them): spread gains with outliers."""
    g = torch.Generator().manual_seed(seed)
    d = m.cfg.d_model

    def gain():
        v = torch.rand(d, generator=g) + 0.3
        v[torch.randint(0, d, (3,), generator=g)] *= 12          # a few outlier columns, as real checkpoints have
        return v
    m.in_gains = {f"blocks.{i}.{k}": gain() for i in range(m.cfg.n_layers) for k in ("attn", "mlp")}
    return m


def _native_walk(model, nt=1, rescore=True, cache_dtype=torch.float32):
    cache = KVCache(model, 1, 64, "cpu", dtype=cache_dtype)
    dec = Decoder(model, cache, graph=False, options=EngineOptions(native=True, tune_threads=False))
    step = dec.cpu_step
    assert isinstance(step.nat, _NativeLlama) and dec.variant.name == "native-llama"
    if not rescore:
        step.nat.rescore_k = 0
    out = []
    prev = torch.get_num_threads()
    torch.set_num_threads(nt)
    try:
        for t in TOKENS[0].tolist():
            out.append(dec.step(t)[0])
    finally:
        torch.set_num_threads(prev)
    return torch.stack(out), step, cache


def _lean_walk(model, cache_dtype):
    """The PyTorch lean step (native kernels off) over TOKENS from an empty cache."""
    dec = Decoder(model, KVCache(model, 1, 64, "cpu", dtype=cache_dtype), graph=False,
                  options=EngineOptions(native=False))
    assert dec.cpu_step.nat is None and dec.variant.name == "lean-llama"
    return torch.stack([dec.step(t)[0] for t in TOKENS[0].tolist()])


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("gains", [False, True], ids=["folded", "in-gain"])
@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("bias", [True, False], ids=["qkv-bias", "no-bias"])
def test_native_llama_step_equals_the_float64_reference_of_its_rounding(bias, nt, quant, gains):
    m = make_llama_model(bias=bias)
    q = quantize_cpu(_with_gains(m) if gains else m, quant)
    assert (q.fused_qkv[0].in_gain is not None) == gains and (q.blocks[0].mlp.up.in_gain is not None) == gains
    got, step, cache = _native_walk(q, nt, rescore=False)
    ref = RefStep(q, step)
    want = torch.stack([ref(t, L, rescore=False) for L, t in enumerate(TOKENS[0].tolist())])
    assert _rel(got, want) < 1e-4
    assert cache.lens_cpu.tolist() == [TOKENS.size(1)] and cache.tokens[0, :TOKENS.size(1)].equal(TOKENS[0])
    # the cache holds the rotated K and the V of every position, as the reference computed them
    K = torch.stack(ref.k[1], 1)
    assert _rel(cache.gk[1, 0, :, :TOKENS.size(1)], K) < 1e-4


def test_native_llama_step_rescores_its_best_candidates_in_fp32():
    q = quantize_cpu(make_llama_model(), "int8")
    got, step, _ = _native_walk(q)
    ref = RefStep(q, step)
    for L, t in enumerate(TOKENS[0].tolist()):
        want = ref(t, L)
        top = want.topk(4).indices
        # the rescored candidates are the weights' exact fp32 logits (not the int8-activation GEMV's)
        assert torch.allclose(got[L][top].double(), want[top], rtol=1e-5, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("head_dim", [24, 32])
def test_native_llama_step_runs_any_even_head_dim_and_a_bf16_embedding(head_dim):
    m = make_llama_model(head_dim=head_dim)
    q = quantize_cpu(m, "int8")
    q.embed.weight.data = q.embed.weight.data.to(torch.bfloat16)
    got, step, _ = _native_walk(q, rescore=False)
    ref = RefStep(q, step)
    want = torch.stack([ref(t, L, rescore=False) for L, t in enumerate(TOKENS[0].tolist())])
    assert _rel(got, want) < 1e-4


@pytest.mark.parametrize("gains", [False, True], ids=["folded", "in-gain"])
def test_native_llama_step_stays_close_to_the_pytorch_lean_step_and_agrees_on_greedy_tokens(gains):
    m = make_llama_model()
    # the int8 head alone: the layers' arithmetic compared (test_two_level_head.py compares the two-level head's)
    q = quantize_cpu(_with_gains(m) if gains else m, "int8", options=EngineOptions(head4=False))
    fast, _, _ = _native_walk(q)
    slow = _lean_walk(q, torch.float32)
    assert _rel(fast, slow) < 0.02          # int8 activations vs bf16 ones, same int8 weights
    assert (fast.argmax(-1) == slow.argmax(-1)).float().mean() >= 0.9


def test_a_llama_decoder_on_a_cache_the_kernel_cannot_read_runs_the_pytorch_step():
    q = quantize_cpu(make_llama_model(), "int8")
    got, step, cache = _native_walk(q, cache_dtype=torch.bfloat16)
    assert step.nat.plan(q, cache) is None
    want = _lean_walk(q, torch.bfloat16)
    assert torch.equal(got, want)


def test_a_llama_decoder_greedy_turn_after_prefill_runs_native_and_matches_its_steps():
    q = quantize_cpu(make_llama_model(), "int8")
    cache = KVCache(q, 1, 128, "cpu", dtype=torch.float32)
    dec = Decoder(q, cache, graph=False)
    assert dec.cpu_step is not None and isinstance(dec.cpu_step.nat, _NativeLlama)
    logits = append(q, cache, TOKENS[:, :12], [12])
    turn = dec.generate(logits, 30, stop=511, temperature=0)
    assert len(set(turn)) > 3 and dec.mode == "fast-int8"


@pytest.mark.parametrize("change", ["qk_norm", "relu2"])
def test_llama_configs_the_kernel_does_not_express_get_no_native_step(change):
    kw = {"qk_norm": True} if change == "qk_norm" else {"mlp_kind": "relu2"}
    q = quantize_cpu(make_llama_model(**kw), "int8")
    assert CpuStep.build(q, EngineOptions(native=True)).nat is None


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("nt", [1, 2])
def test_native_llama_step_on_an_fp16_cache_equals_the_float64_reference_with_fp16_keys_and_values(nt, quant):
    q = quantize_cpu(make_llama_model(), quant)
    got, step, cache = _native_walk(q, nt, rescore=False, cache_dtype=torch.float16)
    assert step.nat.plan(q, cache) is not None                  # the kernel ran on the fp16 cache itself
    ref16, ref32 = RefStep(q, step, kv16=True), RefStep(q, step)
    want = torch.stack([ref16(t, L, rescore=False) for L, t in enumerate(TOKENS[0].tolist())])
    plain = torch.stack([ref32(t, L, rescore=False) for L, t in enumerate(TOKENS[0].tolist())])
    assert _rel(got, want) < 1e-4
    assert _rel(got, want) < _rel(got, plain) / 4               # it reads the rounded K/V, not fp32 ones
    K = torch.stack(ref16.k[1], 1)                              # the cache holds them rounded once
    assert cache.gk.dtype == torch.float16 and _rel(cache.gk[1, 0, :, :TOKENS.size(1)], K) < 2e-3


def test_an_fp16_cache_walk_replays_bit_exact_and_matches_the_pytorch_step_on_greedy_tokens():
    q = quantize_cpu(make_llama_model(), "int8", options=EngineOptions(head4=False))
    a, _, ca = _native_walk(q, cache_dtype=torch.float16)
    b, _, cb = _native_walk(q, cache_dtype=torch.float16)
    assert torch.equal(a, b) and torch.equal(ca.gk, cb.gk)
    slow = _lean_walk(q, torch.float16)                         # the PyTorch step on an fp16 cache (fp32 attention)
    assert _rel(a, slow) < 0.02
    assert (a.argmax(-1) == slow.argmax(-1)).float().mean() >= 0.9
