"""Norm gains kept apart (issue #34): quantized Linears with an input gain (engine/quant.py's in_gain: W' = W diag(g)
quantized as W' / g, the activations multiplied by g) against their naive float64 references on every kernel the
forward can take; the importer keeps a llama's gains (norm_gains.py: beside a full-precision import, read back by a
load), quantize_cpu gives them to q/k/v and [gate; up], and --quant int4 then makes q/k/v int4 too."""
import sys
from pathlib import Path

import pytest
import torch

from tinychat.engine import int8_kernel_ok, native, quantize_cpu
from tinychat.engine.quant import Int4Linear, Int8Linear
from tinychat.importer import import_model
from tinychat.loading import load_folder
from tinychat.model import CheckpointError
from tinychat.norm_gains import GAINS_FILE

sys.path.insert(0, str(Path(__file__).parent))         # the import tests' tiny llama writers
from test_llama_import import VARIANTS, _weights, write_hf  # noqa: E402

pytestmark = pytest.mark.skipif(not int8_kernel_ok(), reason="this torch build has no CPU int8 kernel")


def _case(n=40, k=96, seed=0):
    """(a Linear holding W' = W diag(g), g): g spread with a few outlier columns, as real checkpoints' gains are."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    gain = torch.rand(k, generator=g) + 0.2
    gain[[3, 50, 77]] = torch.tensor([9.0, 14.0, 0.05])
    lin = torch.nn.Linear(k, n, bias=True)
    with torch.no_grad():
        lin.weight.copy_(w * gain[None, :])
        lin.bias.copy_(torch.randn(n, generator=g))
    return lin, gain


def _plain(cls, lin, gain):
    """The same class quantizing W' / g (no gain): the rows a gained Linear must hold."""
    ref = torch.nn.Linear(lin.in_features, lin.out_features)
    with torch.no_grad():
        ref.weight.copy_(lin.weight / gain[None, :])
        ref.bias.copy_(lin.bias)
    return cls(ref, native=False)


def _dequant(m):
    if type(m) is Int4Linear:
        return native.dequant4_ref(m.qweight, m.scale, m.in_features)
    return m.qweight.double() * m.scale.double()[:, None]


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_a_gained_linear_quantizes_the_weights_with_the_gain_divided_out(cls):
    lin, gain = _case()
    m = cls(lin, in_gain=gain)
    plain = _plain(cls, lin, gain)
    assert torch.equal(m.qweight, plain.qweight) and torch.equal(m.scale, plain.scale)
    assert torch.equal(m.in_gain, gain) and "in_gain" in m.state_dict()
    assert torch.allclose(m.weight.double(), _dequant(m) * gain.double()[None, :], rtol=1e-6, atol=1e-7)
    # closer to W' than the folded weights quantized (the outlier gains no longer set the scales)
    err_gained = (m.weight - lin.weight).square().sum()
    err_folded = (cls(lin).weight - lin.weight).square().sum()
    assert err_gained < err_folded


@pytest.mark.parametrize("native_on", [True, False], ids=["native", "pytorch"])
@pytest.mark.parametrize("rows", [1, 3, 9, 200])
@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_a_gained_linear_equals_its_naive_reference_on_every_kernel(cls, rows, native_on):
    lin, gain = _case()
    m = cls(lin, in_gain=gain, native=native_on)
    x = torch.randn(rows, lin.in_features, generator=torch.Generator().manual_seed(1))
    xg = x * gain                                          # the fp32 product every path feeds its kernel
    kernel = m.prefill_kernel(rows)
    y = m(x)
    if kernel == "native-gemm":                           # the kernels' rounding of x * g, in float64
        want = native.gemm4_ref(xg, m.qweight, m.scale, m.bias) if cls is Int4Linear else \
            native.gemm_ref(xg, m.qweight, m.scale.float(), m.bias)
        tol = 1e-5
    else:                                                 # fp32 / bf16 GEMMs on x * g
        want = xg.double() @ _dequant(m).t() + m.bias.double()
        tol = 2e-2 if kernel in ("int8-gemv", "bf16-gemm") else 1e-5
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < tol, kernel
    # mm (the lean step's bf16 call): the gain applied to its input too
    xb = x.to(torch.bfloat16)
    ref = (xb.float() * gain).to(torch.bfloat16).double() @ _dequant(m).t() + m.bias.double()
    assert ((m.mm(xb).double() - ref).abs().max() / ref.abs().max()).item() < 2e-2


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_a_zero_gain_zeroes_its_column_and_fused_rows_keep_one_shared_gain(cls):
    lin, gain = _case()
    gain[7] = 0.0
    with torch.no_grad():
        lin.weight[:, 7] = 0.0
    m = cls(lin, in_gain=gain)
    assert bool(torch.isfinite(m.weight).all()) and not m.weight[:, 7].any()
    f = cls.from_rows([(m, 0, 10), (m, 20, 40)])
    assert torch.equal(f.in_gain, gain) and torch.equal(f.weight, torch.cat([m.weight[:10], m.weight[20:]]))
    other = cls(lin, in_gain=gain * 2)
    with pytest.raises(ValueError, match="different input gains"):
        cls.from_rows([(m, 0, 10), (other, 0, 10)])


def _import(tmp_path, variant="llama-tied"):
    cfg = VARIANTS[variant]
    w = _weights(cfg, qk_std=0.15)
    return cfg, w, import_model(write_hf(tmp_path / "hf", cfg, w), name="full")


def test_an_import_keeps_its_norm_gains_beside_the_folded_weights_and_a_load_reads_them(tmp_path):
    cfg, w, full = _import(tmp_path)
    assert (full / GAINS_FILE).is_file()
    m = load_folder(full, "int8")
    for i in range(cfg["num_hidden_layers"]):
        assert torch.equal(m.in_gains[f"blocks.{i}.attn"], w[f"model.layers.{i}.input_layernorm.weight"].float())
        assert torch.equal(m.in_gains[f"blocks.{i}.mlp"],
                           w[f"model.layers.{i}.post_attention_layernorm.weight"].float())
    (full / GAINS_FILE).unlink()                        # an older import: folded, as before
    assert getattr(load_folder(full, "int8"), "in_gains", None) is None


def test_a_damaged_norm_gains_file_is_refused_in_one_line(tmp_path):
    from safetensors.torch import load_file, save_file
    _, _, full = _import(tmp_path)
    sd = load_file(str(full / GAINS_FILE))
    sd["blocks.1.mlp.in_gain"] = sd["blocks.1.mlp.in_gain"][:-1].clone()
    save_file(sd, str(full / GAINS_FILE))
    with pytest.raises(CheckpointError, match="blocks.1.mlp.in_gain is float32"):
        load_folder(full, "int8")
    sd.pop("blocks.1.mlp.in_gain")
    save_file(sd, str(full / GAINS_FILE))
    with pytest.raises(CheckpointError, match="norm gains do not match"):
        load_folder(full, "int8")


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantize_cpu_gives_the_gains_to_q_k_v_and_gate_up_and_int4_makes_q_k_v_int4(tmp_path, mode):
    _, _, full = _import(tmp_path)
    m = quantize_cpu(load_folder(full, mode), mode)
    cls = Int4Linear if mode == "int4" else Int8Linear
    for i, (blk, f) in enumerate(zip(m.blocks, m.fused_qkv)):     # int4: q/k/v int8 on the mix's layer 2 of 3
        assert type(f) is (Int8Linear if i == 2 else cls) and type(blk.mlp.up) is cls and type(m.head) is Int8Linear
        assert torch.equal(f.in_gain, m.in_gains[f"blocks.{i}.attn"])
        assert torch.equal(blk.mlp.up.in_gain, m.in_gains[f"blocks.{i}.mlp"])
        assert blk.attn.w_o.in_gain is None and blk.mlp.down.in_gain is None
    assert m.head.in_gain is None
    folded = quantize_cpu(_folded(full), mode)
    assert type(folded.fused_qkv[0]) is Int8Linear and folded.fused_qkv[0].in_gain is None


def _folded(full):
    from tinychat.model import TinyAgentLM
    return TinyAgentLM.from_pretrained(full)            # no gains read: the folded model of older imports
