"""--quant int4's rules: which format each Linear of a model gets (quantize_cpu in engine/quant.py applies them, and
quant_files.py reads the same rules to lay out a stored int4 file). The names kept int8 (INT4_INT8_NAMES, with norm
gains kept apart INT4_INT8_NAMES_GAINED), the per-layer mix (llama.cpp's use_more_bits layers: int4_more_bits), the
norm gain each Linear's input is multiplied by (gain_key, linear_gain) and whether an int8 head gets the two-level
head's int4 copy (head4_eligible). Plain rules on module paths and configs: no tensors are made here, and this module
imports none of the quant Linears (quant.py imports it)."""
from __future__ import annotations

# --quant int4 keeps these Linears int8 (names' last parts): the head (a tied embedding's, the largest matrix; llama.cpp's
# Q4 files keep it at 6-8 bits), the Engram projections, and the attention's q/k/v projections (one fused matrix in the
# native steps: int8 or int4 as a whole). The q/k/v rows are the most sensitive to 4 bits when the norm gains are
# folded into them: SmolLM2-135M's perplexity on tests/perf/data/held_text.txt, fp32 25.8, int8 26.6, every layer
# Linear int4 49.1, q/k/v int8 38.1 (+12% bytes a token), q/k/v and down int8 34.3 (+32%); docs/benchmarks.md,
# "--quant int4". With the gains kept apart (in_gain, GAIN_OF) q/k/v go int4 too, INT4_INT8_NAMES_GAINED: SmolLM2's
# int4 30.98 with q/k/v int4, 31.63 with them int8 (docs/benchmarks.md, "Norm gains kept apart").
INT4_INT8_NAMES = ("head", "w_v", "w_k", "w_q", "w_kv_local", "w_kv_global")
# the two-level head's int4 copy (two_level_head.py): buffers of the int8 head named so (state dict / stored file:
# head.q4weight, head.q4scale; quant_files.H4_KEYS and identity.DERIVED spell them out, outside the engine)
Q4W, Q4S = "q4weight", "q4scale"
INT4_INT8_NAMES_GAINED = ("head", "w_v", "w_k")      # a model with input gains: q/k/v int4


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers) (src/llama-quant.cpp): the layers its Q4_K_M quantizes attn_v
    and ffn_down with more bits (Q6_K): the first and last eighth of the n layers and every third layer between
    (C integer division: SmolLM2's 30 layers -> 0-2, 5, 8, 11, 14, 17, 20, 23, 26-29, 14 of them)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# --quant int4 on a model with input gains: these Linears int8 on use_more_bits layers, Q4_K_M's per-layer mix (it
# gives attn_v and ffn_down more bits there) with our int8 as the "more bits" format. q/k/v are one fused matrix in
# the steps (one format a layer), so all three go int8. SmolLM2-135M on tests/perf/data/held_text.txt (ppl; bytes of
# weights a token): int4 30.98 (88.1 MB), q/k/v int8 there 28.51 (+3.9%), down int8 there 29.42 (+6.2%), both
# 27.97 (+10.0%); llama.cpp Q4_K_M 29.51 (103.7 MB). docs/benchmarks.md, "Per-layer mix".
INT4_MORE_BITS_NAMES = ("w_q", "w_kv_local", "w_kv_global")


def int4_more_bits(name: str, n_layers: int) -> bool:
    """Is the Linear at module path name (blocks.I.attn.w_q) one of INT4_MORE_BITS_NAMES on a use_more_bits layer I
    of a model of n_layers blocks?"""
    parts = name.split(".")
    return (len(parts) >= 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[-1] in INT4_MORE_BITS_NAMES
            and use_more_bits(int(parts[1]), n_layers))


def int4_keeps_int8(name: str, gained: bool = False, n_layers: int | None = None) -> bool:
    """Does --quant int4 keep the Linear at this module path int8 (INT4_INT8_NAMES; gained: a model whose norm gains
    are kept apart, INT4_INT8_NAMES_GAINED, and, given its n_layers, int4_more_bits: the per-layer mix)?"""
    if name.rsplit(".", 1)[-1] in (INT4_INT8_NAMES_GAINED if gained else INT4_INT8_NAMES):
        return True
    return bool(gained and n_layers and int4_more_bits(name, n_layers))


# The norm gain each Linear's input is multiplied by (a llama-family import keeps them apart: model.in_gains, {"blocks.
# {i}.attn": input_layernorm's gain, "blocks.{i}.mlp": post_attention_layernorm's}): the Linear's last name -> its key.
GAIN_OF = {"w_q": "attn", "w_kv_local": "attn", "w_kv_global": "attn", "up": "mlp"}


def gain_key(name: str) -> str | None:
    """The model.in_gains key of the Linear at module path name (blocks.3.attn.w_q -> blocks.3.attn), or None."""
    parent, _, leaf = name.rpartition(".")
    kind = GAIN_OF.get(leaf)
    return parent if kind is not None and parent.endswith("." + kind) else None


def linear_gain(model, name: str):
    """The (K,) input gain quantize_cpu gives the Linear at module path name: model.in_gains' entry, or None."""
    gains = getattr(model, "in_gains", None)
    key = gain_key(name)
    return None if not gains or key is None else gains.get(key)


def head4_eligible(model, head) -> bool:
    """Does --quant int4 give this head an int4 copy (engine/two_level_head.py's two-level head): a llama-family config
    (TinyAgentLM keeps its tuned int8 head) and a head without bias or input gain. The head must also be int8, which
    quantize_cpu checks (type Int8Linear: this module imports no quant Linear); save_quantized asks it of the
    unquantized head, before quantize_cpu, to lay out the stored copy."""
    return not model.cfg.is_tinyagent and head.bias is None and getattr(head, "in_gain", None) is None
