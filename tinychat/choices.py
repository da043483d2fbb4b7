"""The named choices the CLI, the loader and the engine share, without importing torch: model sizes (the
dimensions of each named config), weight modes and devices."""
from __future__ import annotations

# Named sizes. tiny: tests (< 1M params). demo: the shipped model. full: the size of the user's own model.
SIZES = {
    "tiny": dict(vocab_size=512, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, kv_group=2,
                 swa_window=8, mlp_hidden=192, logit_softcap=30.0, rope_base=10000.0, max_seq_len=512,
                 engram_orders=(2, 3), engram_layers=(1,), engram_heads=2, engram_table_size=1009,
                 engram_dim=16),
    "demo": dict(vocab_size=8192, d_model=384, n_layers=8, n_heads=6, n_kv_heads=2, head_dim=64, kv_group=4,
                 swa_window=128, mlp_hidden=1536, logit_softcap=30.0, rope_base=10000.0, max_seq_len=2048,
                 engram_orders=(2, 3), engram_layers=(1,), engram_heads=2, engram_table_size=20011,
                 engram_dim=32),
    "full": dict(vocab_size=32000, d_model=768, n_layers=16, n_heads=12, n_kv_heads=4, head_dim=64, kv_group=4,
                 swa_window=256, mlp_hidden=3328, logit_softcap=30.0, rope_base=10000.0, max_seq_len=4096,
                 engram_orders=(2, 3), engram_layers=(1, 9), engram_heads=4, engram_table_size=32749,
                 engram_dim=64),
}

QUANT_MODES = ("none", "int8", "int4", "bf16")   # --quant: full precision, weight-only int8, 4-bit weights in groups
                                                # of 32 (int8 head), bf16 weights (CPU modes)
QUANT_CHOICES = ("auto", *QUANT_MODES)      # a chat's --quant: auto (the default) picks one of QUANT_MODES
                                            # (loading.resolve_quant); sessions record the mode it picked
DEVICES = ("auto", "cpu", "cuda")           # --device

SMALL_INT4 = 300_000_000    # parameters below which 4-bit weights cost a model much of its quality (SmolLM2-135M:
                            # top-1 agreement with fp32 0.64 under int4, 0.92 under int8)
