"""`tinychat import` / `pull` store a GGUF packed as its own bits say (--quant auto, the default): 5 to 8 bits int8,
4 or fewer int4 (int8 for a model under 300M parameters), float weights and Hugging Face folders full precision; a
mode given by hand wins; the summary line and import.json say what was stored and why."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("gguf")

from hub_models import config, gguf_bytes  # noqa: E402
from support import run_main  # noqa: E402
from tinychat.importer import import_model  # noqa: E402
from tinychat.importer import store_mode  # noqa: E402
from tinychat.importer.store_mode import label_bits, layer_weight_type, mode_for_bits  # noqa: E402
from tinychat.quant_files import stored_mode  # noqa: E402

CFG = config(intermediate_size=64)          # every layer matrix's columns a whole number of 32-wide GGUF blocks


@pytest.mark.parametrize("label, bits, mode", [
    ("Q8_0", 8, "int8"), ("q6_k", 6, "int8"), ("Q5_K_M", 5, "int8"), ("Q4_K_M", 4, "int4"), ("Q4_0", 4, "int4"),
    ("IQ4_XS", 4, "int4"), ("Q3_K_L", 3, "int4"), ("IQ2_XXS", 2, "int4"), ("F16", 16, "none"), ("BF16", 16, "none"),
    ("F32", 32, "none"), ("fancy", None, "none")])
def test_a_quant_label_maps_to_the_nearest_stored_mode(label, bits, mode):
    assert label_bits(label) == bits
    assert mode_for_bits(bits, params=1_000_000_000) == mode


def test_four_bits_of_a_small_model_are_stored_int8():
    assert mode_for_bits(4, params=135_000_000) == "int8"
    assert mode_for_bits(4, params=500_000_000) == "int4"
    assert mode_for_bits(4) == "int4"                   # size not known (a pull's estimate before the download)
    assert mode_for_bits(8, params=135_000_000) == "int8"


def test_the_layer_type_is_the_one_holding_most_layer_elements():
    t = lambda name, kind, n, dims=2: SimpleNamespace(name=name, tensor_type=SimpleNamespace(name=kind),  # noqa: E731
                                                      n_elements=n, shape=[1] * dims)
    reader = SimpleNamespace(tensors=[t("token_embd.weight", "Q8_0", 10_000), t("blk.0.attn_v.weight", "Q6_K", 300),
                                      t("blk.0.ffn_up.weight", "Q4_K", 500), t("blk.0.ffn_down.weight", "Q6_K", 150),
                                      t("blk.0.attn_norm.weight", "F32", 900, dims=1)])
    assert layer_weight_type(reader) == ("Q4_K", 11_850)     # Q6_K's 450 are the minority; norms and embedding aside
    assert layer_weight_type(SimpleNamespace(tensors=[t("token_embd.weight", "F16", 8)])) == (None, 8)


def _gguf(tmp_path, qtype=None, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(gguf_bytes(CFG, qtype=qtype))
    return p


def _meta(dest):
    return json.loads((dest / "import.json").read_text(encoding="utf-8"))


def test_a_q8_0_gguf_is_stored_int8_by_default_and_none_keeps_full_precision(tmp_path):
    src = _gguf(tmp_path, "Q8_0")
    dest = import_model(src, name="auto")
    assert stored_mode(dest) == "int8"
    assert _meta(dest)["quant"] == "int8" and "Q8_0" in _meta(dest)["quant_why"]
    full = import_model(src, name="full", quant="none")
    assert stored_mode(full) is None and _meta(full)["quant"] == "none" and "quant_why" not in _meta(full)
    assert (dest / "model.safetensors").stat().st_size < (full / "model.safetensors").stat().st_size


def test_a_float_gguf_stays_full_precision_and_bf16_dtype_is_kept(tmp_path):
    src = _gguf(tmp_path)
    dest = import_model(src, name="f32")
    assert stored_mode(dest) is None and "F32" in _meta(dest)["quant_why"]
    bf = import_model(src, name="bf", dtype="bfloat16", quant="auto")
    assert stored_mode(bf) is None and _meta(bf)["dtype"] == "bfloat16"


def test_a_q4_0_gguf_is_int4_whatever_its_size_and_keeps_its_values(tmp_path):
    from safetensors.torch import load_file

    from tinychat.engine.native import dequant4
    from tinychat.quant_files import load_quantized
    src = _gguf(tmp_path, "Q4_0")
    dest = import_model(src, name="q40")
    assert stored_mode(dest) == "int4" and "int4's own grid" in _meta(dest)["quant_why"]
    # layer 0's down projection (no norm gain folded in; int4 there) holds the file's Q4_0 values exactly: the float32
    # import's weights, rounded again to the same grid
    full = load_file(str(import_model(src, name="full", quant="none") / "model.safetensors"))
    down = load_quantized(dest).blocks[0].mlp.down
    want = full["blocks.0.mlp.down.weight"]
    assert type(down).__name__ == "Int4Linear"
    assert torch.equal(dequant4(down.qweight, down.scale, down.in_features), want)


def test_a_4_bit_gguf_is_int8_when_small_and_int4_above_the_line(tmp_path, monkeypatch):
    src = _gguf(tmp_path, "Q4_1")
    small = import_model(src, name="small")
    assert stored_mode(small) == "int8" and "300M" in _meta(small)["quant_why"]
    monkeypatch.setattr(store_mode, "SMALL_INT4", 1000)          # the tiny model counted as a big one
    big = import_model(src, name="big")
    assert stored_mode(big) == "int4" and "Q4_1" in _meta(big)["quant_why"]
    monkeypatch.setattr(store_mode, "SMALL_INT4", 300_000_000)
    assert stored_mode(import_model(src, name="by-hand", quant="int4")) == "int4"      # a mode given by hand wins


def test_import_prints_what_it_stored_and_why(tmp_path, capsys):
    src = _gguf(tmp_path, "Q8_0")
    code, out, _ = run_main(["import", src, "--name", "q8"], capsys)
    assert code == 0 and "weights: int8, packed (the GGUF's weights are Q8_0; --quant none keeps full precision)" in out
    code, out, _ = run_main(["import", src, "--name", "full", "--quant", "none"], capsys)
    assert code == 0 and "weights: full precision, float32\n" in out
    code, _, err = run_main(["import", src, "--name", "x", "--quant", "int3"], capsys)
    assert code == 2 and err.count("\n") == 1 and "auto, none, int8, int4" in err
