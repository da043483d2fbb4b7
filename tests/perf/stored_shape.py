"""A stored int4 / int8 model folder of random weights in a candidate's shape (llama_shapes.SHAPES), its embedding
tied to the head as the real checkpoint's (Llama-3.2-1B, Qwen2.5-0.5B, SmolLM2: tie_word_embeddings), so the file is
what `tinychat import --quant MODE` writes for it (layout 2: quant_files.py), without a 2.5-5 GB source checkpoint:
the model is built in bf16, filled with random values, quantized and saved. The tokenizer and chat files are copied
from a tinychat import (--like, e.g. SmolLM2's; its vocabulary may be smaller than the shape's).

    python tests/perf/stored_shape.py --shape llama3.2-1b --quant int4 --like HOME/models/s-int4 --out DIR
    /usr/bin/time -v tinychat -p hi --max-new 8 --model DIR

Random weights run the same work as real ones (peak RSS, speed); what they cannot tell is quality. Not a test."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--quant", default="int4", choices=["int8", "int4"])
    ap.add_argument("--like", type=Path, required=True, help="a tinychat model folder to copy the tokenizer from")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    import llama_shapes as L
    from tinychat.importer.llama import build_config
    from tinychat.model import _SKIP_INIT, TinyAgentLM
    from tinychat.quant_files import save_quantized
    torch.set_num_threads(a.threads)
    s = dict(L.SHAPES[a.shape])
    bias = s.pop("bias")
    s.pop("repo")
    cfg = {"model_type": "qwen2" if bias else "llama", "hidden_act": "silu", "rope_theta": 500000.0,
           "max_position_embeddings": 4096, "tie_word_embeddings": True, **s}
    fake = {"model.embed_tokens.weight": torch.empty(s["vocab_size"], 1)}
    if bias:
        fake["model.layers.0.self_attn.q_proj.bias"] = torch.empty(1)
    token = _SKIP_INIT.set(True)
    try:
        m = TinyAgentLM(build_config(cfg, fake, 4096, a.shape))     # fp32 storage never written: not resident
    finally:
        _SKIP_INIT.reset(token)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():                        # bf16, a tensor at a time
            p.data = torch.empty(p.shape, dtype=torch.bfloat16)
            for rows in p.data.view(p.shape[0], -1).split(4096):
                rows.normal_(0, 0.02, generator=g)
            if name.endswith(".bias"):
                p.data.zero_()
        gain = 1 + 0.1 * torch.randn(m.cfg.d_model, generator=g)
        for h, e in zip(m.head.weight.data.split(8192), m.embed.weight.data.split(8192)):
            h.copy_(e.float() * gain)                                   # head = embed diag(g), as imported
    m.tied_gain = gain
    a.out.mkdir(parents=True, exist_ok=True)
    save_quantized(m, a.out, a.quant)
    for f in a.like.iterdir():
        if f.name not in ("model.safetensors", "config.json", "import.json") and f.is_file():
            shutil.copy(f, a.out / f.name)
    size = (a.out / "model.safetensors").stat().st_size
    print(f"{a.out}: {a.shape} stored {a.quant}, model.safetensors {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
