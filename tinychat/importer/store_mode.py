"""`--quant auto`, the default of `tinychat import` and `tinychat pull`: how an imported model's weights are stored,
read off the source.

A GGUF's layer weights already carry the bits its maker chose. Stored as float32 they took four bytes a weight on
disk (SmolLM2-135M: 623 MiB, 146 MiB stored int8) and were read and quantized again at every start by `--quant
auto`'s int8 (a one-shot 1.96 s against 1.81 s stored, AMD Zen 4; a 1B model's float32 folder is ~4.9 GB). So auto stores them packed (quant_files.py), in the mode
nearest to their own bits:

- 5 to 8 bits (Q8_0, Q6_K, Q5_K_M ...): int8.
- Q4_0: int4, whose quantizer meets a Q4_0 block exactly (its scale is the block's largest value over -8 or 7, in
  fp16): the file's own values (SmolLM2-135M's Q4_0 file, perplexity on tests/perf/data/held_text.txt: stored int4
  34.63, int8 34.74).
- Other 4-bit types and fewer (Q4_K_M, Q4_1, IQ4_XS, Q3_K ...): int4 (half int8's bytes a token: what a 4-bit file
  is pulled for), though rounding them again to int4's grid loses more than one rounding does; int8 for a model
  under SMALL_INT4 parameters, where that loss is largest (SmolLM2-135M: float32 25.8; its Q4_K_M file, mostly Q5_0 at
  that width, stored int8 30.4, int4 44.0; int4 from float32 28.5).
- Float weights (F32, F16, BF16 GGUFs) and Hugging Face folders (safetensors): full precision (--dtype), as exact as
  the source.

The type counted is the one holding most elements of the layers' 2-D tensors (`blk.*`: a Q4_K_M file's Q6_K rows
are its minority). Plain rules on names and counts: no tensors are read here."""
from __future__ import annotations

import re

from ..choices import SMALL_INT4

STORE_CHOICES = ("auto", "none", "int8", "int4")     # import / pull --quant
SAME_GRID = {"Q4_0": "int4"}      # a type whose blocks the mode's quantizer meets exactly (symmetric 4 bits in groups of
                                  # 32, fp16 scales): stored so whatever the model's size

# GGML tensor type name -> bits a weight (block scales aside)
GGML_BITS = {
    "F64": 64, "F32": 32, "F16": 16, "BF16": 16,
    "Q8_0": 8, "Q8_1": 8, "Q8_K": 8, "Q6_K": 6, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5,
    "Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "IQ4_NL": 4, "IQ4_XS": 4, "MXFP4": 4,
    "Q3_K": 3, "IQ3_XXS": 3, "IQ3_S": 3, "Q2_K": 2, "IQ2_XXS": 2, "IQ2_XS": 2, "IQ2_S": 2,
    "TQ1_0": 2, "TQ2_0": 2, "IQ1_S": 1, "IQ1_M": 1,
}


def label_bits(label: str) -> int | None:
    """The bits a weight of a GGUF file labelled `label` (a file name's quant: "Q4_K_M", "q8_0", "IQ4_XS", "F16",
    "BF16"), or None when the label names no known type."""
    up = label.upper()
    if up in GGML_BITS:
        return GGML_BITS[up]
    m = re.match(r"^(?:I?Q|TQ)(\d)(?:_|$)", up)
    return int(m.group(1)) if m else None


def mode_for_bits(bits: int | None, params: int | None = None) -> str:
    """The stored mode for weights of `bits` bits in a model of `params` parameters (None: not known)."""
    if bits is None or bits > 8:
        return "none"
    if bits >= 5 or (params is not None and params < SMALL_INT4):
        return "int8"
    return "int4"


def layer_weight_type(reader) -> tuple[str | None, int]:
    """(the GGML type name holding most elements of the layers' 2-D tensors, every tensor's elements) of an open
    gguf.GGUFReader; (None, n) for a file without `blk.*` matrices."""
    by_type: dict[str, int] = {}
    total = 0
    for t in reader.tensors:
        n = int(t.n_elements)
        total += n
        if t.name.startswith("blk.") and len(t.shape) == 2:
            name = getattr(t.tensor_type, "name", str(t.tensor_type))
            by_type[name] = by_type.get(name, 0) + n
    return (max(by_type, key=by_type.get) if by_type else None), total


def resolve_store(reader, quant: str, dtype: str = "float32") -> tuple[str, str | None]:
    """(mode, why) for import's --quant: a mode given by hand is kept (why None); auto reads the source's layer weight
    type off its gguf.GGUFReader (None: a Hugging Face folder) and says why."""
    if quant != "auto":
        return quant, None
    if dtype != "float32":
        return "none", f"--dtype {dtype}"
    if reader is None:
        return "none", "a Hugging Face checkpoint; --quant int8 or int4 stores it packed"
    kind, params = layer_weight_type(reader)
    bits = GGML_BITS.get(kind) if kind else None
    if kind in SAME_GRID:
        return SAME_GRID[kind], (f"the GGUF's weights are {kind}, {SAME_GRID[kind]}'s own grid: stored as they are; "
                                 "--quant none keeps full precision")
    mode = mode_for_bits(bits, params)
    if mode == "none":
        return "none", (f"the GGUF's weights are {kind}" if kind else "no layer weights of a known type")
    if bits is not None and bits <= 4 and mode == "int8":
        return mode, (f"the GGUF's weights are {kind}; int8, as 4 bits cost a model under {SMALL_INT4 // 10**6}M "
                      "parameters much of its quality")
    if mode == "int4":
        return mode, (f"the GGUF's weights are {kind}, rounded again to int4; --quant int8 keeps them closer, at "
                      "twice the bytes")
    return mode, f"the GGUF's weights are {kind}; --quant none keeps full precision"
