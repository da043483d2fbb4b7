"""The two-level int4 head (engine/two_level_head.py): an int8 or int4 llama-family model scans every logit with the head's
int4 copy and recomputes the best head4.RESCORE_K from the int8 rows. The native step against a float64 reference of its
rounding and against the PyTorch lean step, prefill's last logits, the rescoring against the int8 head's own top-k,
the stored file's copy, EngineOptions.head4 and the step name sessions record."""
import sys
from pathlib import Path

import pytest
import torch

from support import make_llama_model
from tinychat.chat.quant_steps import describe_step
from tinychat.engine import Decoder, KVCache, append, native, quantize_cpu
from tinychat.engine import two_level_head as head4
from tinychat.engine.append import rescore_top
from tinychat.engine.native_llama_step import _NativeLlama
from tinychat.engine.quant import Int4Linear, Int8Linear, quantize_int4
from tinychat.options import EngineOptions
from tinychat.plan import step_name
from tinychat.quant_files import H4_KEYS, load_quantized, save_quantized

V = 4096                     # a large-ish vocabulary: the scan's top 64 is a small part of it
TOKENS = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(7))


def _model(quant="int4", **kw):
    """A llama quantized as a stored file makes it: int8's copy too (quantize_cpu's int8_head4)."""
    return quantize_cpu(make_llama_model(vocab_size=V), quant, options=EngineOptions(**kw), int8_head4=True)


def _kernels():
    if native.load() is None:
        pytest.skip(f"native kernels off: {native.why_not}")


def _exact8(head, h):
    """The int8 head's logits in float64 (its rows times their scales against the fp32 hidden states)."""
    return h.double() @ (head.qweight.double() * head.scale.double()[:, None]).T


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_int8_and_int4_llama_models_get_the_copy_and_tinyagent_and_option_off_do_not(quant):
    m = _model(quant)
    head = m.head
    assert type(head) is Int8Linear and head4.active(head)
    w = make_llama_model(vocab_size=V).head.weight
    q, s = quantize_int4(w)                                 # the copy is quantize_int4 of the full-precision head
    assert torch.equal(head.q4weight, q) and torch.equal(head.q4scale, s)
    assert head4.nbytes(head) * 1.7 < head.qweight.numel()  # about half the int8 rows' bytes (plus fp16 scales)
    assert not head4.active(_model(quant, head4=False).head)
    # quantized at start, an int8 model keeps its int8 head (the copy's scale search would cost every start)
    assert head4.active(quantize_cpu(make_llama_model(vocab_size=V), quant).head) == (quant == "int4")
    from support import make_model
    assert not head4.active(quantize_cpu(make_model(), quant).head)      # TinyAgentLM keeps its int8 head
    assert not head4.active(quantize_cpu(make_llama_model(vocab_size=V), "bf16").head)


def test_rescoring_gives_the_int8_heads_exact_top_k_where_the_int4_scan_holds_it():
    head = _model().head
    g = torch.Generator().manual_seed(1)
    h = torch.randn(200, head.in_features, generator=g)
    scan = head4.scan(head, h)
    got = rescore_top(head, h, scan, head4.RESCORE_K)
    exact = _exact8(head, h)
    top8 = exact.topk(8, dim=-1).indices
    inside = (top8[:, :, None] == scan.topk(head4.RESCORE_K, dim=-1).indices[:, None, :]).any(-1).all(-1)
    assert inside.float().mean() > 0.9                     # the scan's top 64 holds the int8 top 8 almost always
    assert torch.equal(got[inside].topk(8, dim=-1).indices, top8[inside])
    vals = got.gather(1, top8)
    torch.testing.assert_close(vals[inside].double(), exact.gather(1, top8)[inside], rtol=1e-5, atol=1e-4)
    # without the rescoring the int4 values alone would not do: their top 8 differs from the int8 head's
    assert not torch.equal(scan.topk(8, dim=-1).indices, top8)


def test_the_scan_is_the_int4_copy_against_int8_rounded_activations():
    _kernels()
    head = _model().head
    h = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(2))
    want = torch.stack([native.dequant4_ref(head.q4weight, head.q4scale, head.in_features)
                        @ native.quant8_ref(r) for r in h])
    assert _rel(head4.scan(head, h), want) < 1e-5
    assert _rel(head4.naive_logits(head, h, 0), _exact8(head, h)) > 1e-3     # the copy is not the int8 head


def _walk(model, native_on: bool):
    cache = KVCache(model, 1, 64, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=False, options=EngineOptions(native=native_on, tune_threads=False))
    assert isinstance(dec.cpu_step.nat, _NativeLlama) == native_on
    out = torch.stack([dec.step(t)[0] for t in TOKENS[0].tolist()])
    return out, dec


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_the_native_step_scans_the_copy_and_rescores_its_best_from_the_int8_rows(quant):
    _kernels()
    sys.path.insert(0, str(Path(__file__).parent))
    from test_native_llama import RefStep
    m = _model(quant)
    got, dec = _walk(m, True)
    nat = dec.cpu_step.nat
    assert nat.rescore_k == head4.RESCORE_K and nat.head4[0] == m.head.q4weight.data_ptr()
    ref = RefStep(m, dec.cpu_step)
    want = torch.stack([ref(t, L) for L, t in enumerate(TOKENS[0].tolist())])
    assert _rel(got, want) < 1e-4
    for L in range(TOKENS.size(1)):
        top = want[L].topk(16).indices                      # the rescored: the int8 rows' exact values
        torch.testing.assert_close(got[L][top].double(), want[L][top], rtol=1e-5,
                                   atol=1e-5 * want[L].abs().max().item())
        tail = want[L].topk(V - 200, largest=False).indices  # the tail: the int4 copy's values
        assert _rel(got[L][tail], want[L][tail]) < 1e-4
    # the int8 head alone (head4 off) gives other tail values: the test sees which head ran
    off, _ = _walk(_model(quant, head4=False), True)
    assert _rel(got[:, tail], off[:, tail]) > 1e-3


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_the_native_step_stays_close_to_the_pytorch_lean_step_and_prefill_on_the_two_level_head(quant):
    _kernels()
    m = _model(quant)
    fast, _ = _walk(m, True)
    slow, _ = _walk(m, False)
    top = fast.topk(16, dim=-1).indices                      # both rescored there: the int8 rows' values
    assert _rel(fast.gather(1, top), slow.gather(1, top)) < 0.02
    assert _rel(fast, slow) < 0.1                            # a candidate rescored by one step only: int4 vs int8
    assert (fast.argmax(-1) == slow.argmax(-1)).float().mean() >= 0.9
    for L in (5, 15):                                        # prefill's last logits: the same head
        cache = KVCache(m, 1, 64, "cpu", dtype=torch.float32)
        pre = append(m, cache, TOKENS[:, :L + 1], [L + 1])[0]
        assert _rel(pre, fast[L]) < 0.02 and pre.argmax() == fast[L].argmax()


def test_prefill_last_logits_rescore_the_int4_scan_with_the_int8_rows():
    m = _model()
    cache = KVCache(m, 1, 64, "cpu", dtype=torch.float32)
    seen = {}

    def grab(mod, inp, out):
        seen["h"] = inp[0].detach().clone()
    hk = head4.view(m.head).register_forward_hook(grab)
    try:
        pre = append(m, cache, TOKENS[:, :10], [10])[0]
    finally:
        hk.remove()
    h = seen["h"].reshape(-1, m.cfg.d_model)[-1:]
    exact, scan = _exact8(m.head, h)[0], head4.scan(m.head, h)[0]
    top = scan.topk(head4.RESCORE_K).indices                 # the scan's best: the int8 rows' values
    torch.testing.assert_close(pre[top].double(), exact[top], rtol=1e-5, atol=1e-4)
    tail = torch.ones(V, dtype=torch.bool).index_fill_(0, top, False)
    assert torch.equal(pre[tail], scan[tail])                # the rest: the int4 copy's
    assert _rel(scan[top], exact[top]) > 1e-3


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_stored_file_holds_the_copy_and_an_older_file_without_it_runs_the_int8_head(tmp_path, quant):
    from safetensors.torch import load_file, save_file
    from tinychat.quant_files import WEIGHTS_FILE, read_header
    ref = _model(quant)
    save_quantized(make_llama_model(vocab_size=V), tmp_path / "m", quant)
    sd = load_file(str(tmp_path / "m" / WEIGHTS_FILE))
    assert torch.equal(sd[H4_KEYS[0]], ref.head.q4weight) and torch.equal(sd[H4_KEYS[1]], ref.head.q4scale)
    m = load_quantized(tmp_path / "m")
    assert head4.active(m.head) and torch.equal(m.head.q4weight, ref.head.q4weight)
    assert m.head.q4weight.data_ptr() != ref.head.q4weight.data_ptr()
    x = torch.randn(2, m.cfg.d_model, generator=torch.Generator().manual_seed(4))
    assert torch.equal(head4.scan(m.head, x), head4.scan(ref.head, x))
    meta = read_header(tmp_path / "m" / WEIGHTS_FILE)["__metadata__"]
    old = {k: v for k, v in sd.items() if k not in H4_KEYS}
    (tmp_path / "old").mkdir()
    save_file(old, str(tmp_path / "old" / WEIGHTS_FILE), metadata=meta)
    (tmp_path / "old" / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    m_old = load_quantized(tmp_path / "old")
    assert not head4.active(m_old.head) and torch.equal(m_old.head.qweight, ref.head.qweight)
    assert m_old.stored_quant == quant


def test_the_option_off_drops_a_stored_copy():
    from tinychat.quant_files import configure
    m = _model()
    configure(m, EngineOptions(head4=False))
    assert not head4.active(m.head) and "head.q4weight" not in m.state_dict()


def test_the_step_name_says_h4_and_describes_it():
    assert step_name(True, None, 2, "avx2", "int4", True, True) == "native-int4-v2+h4+kv16@avx2"
    assert step_name(False, "fp32-gemm", None, None, "int4", False, True) == "torch-int4+h4"
    assert "with the two-level int4 head" in describe_step("native-int4-v2+h4+kv16@avx2")
    assert "fp16 KV cache" in describe_step("native-int4-v2+h4+kv16@avx2")
    assert EngineOptions.from_env({"TINYCHAT_HEAD4": "0"}).head4 is False
    assert EngineOptions.from_env({}).head4 is True


def test_int4_linear_views_of_the_copy_share_its_tensors():
    head = _model().head
    q = head4.view(head)
    assert type(q) is Int4Linear and q.qweight is head.q4weight and head4.view(head) is q
