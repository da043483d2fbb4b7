"""Tiny llama-family checkpoints as the files of a Hub repo ({path: bytes}), for the pull tests: a Hugging Face
safetensors folder and GGUF files, with the test tokenizer (support.tokenizer) and a ChatML template. Built as
tests/unit/test_llama_import.py builds them (random weights, HF names; q/k rows permuted as llama.cpp does in GGUF)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save

from support import tokenizer

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a tiny test model<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def config(**over) -> dict:
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": tokenizer().vocab_size,
         "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "intermediate_size": 48, "hidden_act": "silu", "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
         "max_position_embeddings": 256, "tie_word_embeddings": True}
    return {**c, **over}


def weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=0.25: torch.randn(*s, generator=g) * std  # noqa: E731
    d, H, Hk, D, F = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                       "intermediate_size"))
    w = {"model.embed_tokens.weight": r(cfg["vocab_size"], d, std=1.0), "model.norm.weight": 1 + r(d, std=0.2)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + r(d, std=0.2), p + "post_attention_layernorm.weight": 1 + r(d, std=0.2),
              p + "self_attn.q_proj.weight": r(H * D, d), p + "self_attn.k_proj.weight": r(Hk * D, d),
              p + "self_attn.v_proj.weight": r(Hk * D, d), p + "self_attn.o_proj.weight": r(d, H * D),
              p + "mlp.gate_proj.weight": r(F, d), p + "mlp.up_proj.weight": r(F, d), p + "mlp.down_proj.weight": r(d, F)}
    return w


def safetensors_repo(cfg: dict | None = None, seed: int = 0, generation: dict | None = None,
                     shards: int = 1) -> dict[str, bytes]:
    """config.json, tokenizer.json, tokenizer_config.json (ChatML), the weights (model.safetensors, or `shards` files
    with model.safetensors.index.json), generation_config.json when given, and files a pull must leave alone."""
    cfg = cfg or config()
    w = {k: v.contiguous() for k, v in weights(cfg, seed).items()}
    files = {"config.json": json.dumps(cfg).encode(), "tokenizer.json": tokenizer().to_str().encode(),
             "tokenizer_config.json": json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}).encode(),
             "README.md": b"# tiny\n", "onnx/model.onnx": b"\0" * 1000, "pytorch_model.bin": b"\0" * 1000}
    if generation is not None:
        files["generation_config.json"] = json.dumps(generation).encode()
    if shards == 1:
        files["model.safetensors"] = save(w)
    else:
        names = sorted(w)
        per = -(-len(names) // shards)
        wmap = {}
        for i in range(shards):
            part = {k: w[k] for k in names[i * per:(i + 1) * per]}
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            files[fname] = save(part)
            wmap.update({k: fname for k in part})
        files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": wmap}).encode()
    return files


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:     # llama.cpp's convert_hf_to_gguf.py on q / k rows
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_bytes(cfg: dict | None = None, seed: int = 0, arch: str = "llama", sampling: dict | None = None,
               basename: str = "tiny", pad: int = 0, qtype: str | None = None) -> bytes:
    """A GGUF of the tiny llama (float32 tensors) with the test tokenizer and ChatML; arch: general.architecture
    (another name makes a model tinychat refuses); sampling: general.sampling.* keys; pad: an extra tensor of this
    many bytes after the model's (a big file whose header is small); qtype: the layers' 2-D weights quantized to
    this GGML type (e.g. "Q8_0", "Q4_0"; gguf.quants), the others float32."""
    import gguf
    cfg = cfg or config()
    tok = tokenizer()
    spec = json.loads(tok.to_str())
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    wr_path = Path(tempfile.mkdtemp()) / "m.gguf"
    wr = gguf.GGUFWriter(str(wr_path), arch)
    wr.add_basename(basename)
    for k, v in (sampling or {}).items():
        (wr.add_float32 if isinstance(v, float) else wr.add_int32)(f"general.sampling.{k}", v)
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt2")
    wr.add_token_list([tok.hf.id_to_token(i) for i in range(tok.vocab_size)])
    wr.add_token_merges(merges)
    wr.add_token_types([3 if i in tok.special_ids else 1 for i in range(tok.vocab_size)])
    wr.add_eos_token_id(tok.im_end)
    wr.add_chat_template(CHATML)
    from tinychat.importer.gguf_file import BLOCK_NAMES
    for k, v in weights(cfg, seed).items():
        if k.startswith("model.layers."):
            _, _, i, *rest = k.split(".")
            kind = next(g for g, h in BLOCK_NAMES.items() if h == ".".join(rest[:-1]))
            if kind in ("attn_q", "attn_k"):
                v = _permute(v, cfg["num_attention_heads" if kind == "attn_q" else "num_key_value_heads"])
            name = f"blk.{i}.{kind}.{rest[-1]}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[k]
        if qtype is not None and name.startswith("blk.") and v.dim() == 2:
            from gguf.quants import quantize
            kind = gguf.GGMLQuantizationType[qtype]
            wr.add_tensor(name, quantize(v.float().numpy(), kind), raw_dtype=kind)
        else:
            wr.add_tensor(name, v.float().numpy())
    if pad:
        import numpy as np
        wr.add_tensor("padding.weight", np.zeros(pad // 4, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    data = wr_path.read_bytes()
    wr_path.unlink()
    wr_path.parent.rmdir()
    return data
