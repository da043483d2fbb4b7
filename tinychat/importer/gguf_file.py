"""Reading llama-family GGUF files with the `gguf` package: metadata fields, dequantized tensors under Hugging Face
names (with llama.cpp's q/k row permutation undone), a Hugging Face style config dict, and the byte-level BPE
tokenizer rebuilt from the metadata. Shared by `tinychat import` and the training teacher (training/teacher.py)."""
from __future__ import annotations

import numbers
from pathlib import Path

import torch

from .errors import ImportRefused

# GGUF per-block tensor kind -> Hugging Face module path inside model.layers.{i}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# tokenizer.ggml.pre -> the split regex of the Hugging Face tokenizer.json (None: GPT-2's, inside ByteLevel)
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"gpt2": None, "default": None, "smollm": "digits", "starcoder": "digits", "refact": "digits",
                  "llama-bpe": _LLAMA3_RE, "llama3": _LLAMA3_RE, "qwen2": _QWEN2_RE}


def field(reader, key, default=None):
    """A metadata value (None-safe)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except (UnicodeDecodeError, ValueError, IndexError, TypeError) as e:
        raise ImportRefused(f"GGUF metadata {key}: unreadable ({' '.join(str(e).split())[:80]})") from None


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (llama architecture only).

    HF checkpoints use "rotate-half" RoPE: within a head the pairs are (i, i + hd/2).
    convert_hf_to_gguf.py permutes the rows of wq/wk so that llama.cpp's interleaved RoPE (pairs
    (2i, 2i+1)) gives the same result: ``w.reshape(H, 2, hd/2, in).swapaxes(1, 2)``. We invert
    it (reshape(H, hd/2, 2, in).swapaxes(1, 2)) and use rotate-half, as HF does.
    w: [H * hd, in] (or a bias [H * hd]) -> the same shape.
    """
    shape = w.shape
    hd = shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, -1).transpose(1, 2).reshape(shape)


def dequantized(t) -> torch.Tensor:
    """One GGUF tensor as float32 in PyTorch layout ([out, in]: the GGUF shape reversed)."""
    from gguf.quants import dequantize
    arr = dequantize(t.data, t.tensor_type)
    shape = tuple(int(s) for s in reversed(t.shape.tolist()))
    return torch.from_numpy(arr.reshape(shape).astype("float32", copy=False).copy())


def open_reader(path):
    try:
        import gguf
    except ImportError:
        raise ImportRefused("reading GGUF files needs the `gguf` package (pip install gguf)") from None
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001  gguf raises ValueError / struct errors / OSError on bad files
        raise ImportRefused(f"{path}: not a readable GGUF file ({' '.join(str(e).split())[:120]})") from None


def hf_config(reader) -> dict:
    """The GGUF metadata as a Hugging Face config.json dict (the keys llama.py reads). Each number must be one of the
    right kind (a count an integer, a base or epsilon a number): ImportRefused naming the key otherwise."""
    arch = field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ImportRefused("GGUF metadata general.architecture is missing or not text")

    def num(key: str, default=None, kind=int):
        v = field(reader, f"{arch}.{key}", default)
        ok = isinstance(v, numbers.Integral) if kind is int else isinstance(v, numbers.Real)
        if v is None or isinstance(v, bool) or not ok:
            raise ImportRefused(f"GGUF metadata {arch}.{key} is {'missing' if v is None else f'not a number ({v!r:.30})'}")
        return kind(v)

    heads, d = num("attention.head_count"), num("embedding_length")
    if heads < 1:
        raise ImportRefused(f"GGUF metadata {arch}.attention.head_count must be positive, got {heads}")
    cfg = {
        "model_type": {"llama": "llama", "qwen2": "qwen2"}.get(arch, arch),
        "hidden_size": d, "num_hidden_layers": num("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": num("attention.head_count_kv", heads),
        "head_dim": num("attention.key_length", d // heads),
        "intermediate_size": num("feed_forward_length"),
        "rope_theta": num("rope.freq_base", 10000.0, float),
        "rms_norm_eps": num("attention.layer_norm_rms_epsilon", 1e-5, float),
        "max_position_embeddings": num("context_length", 2048),
        "hidden_act": "silu",
    }
    if field(reader, f"{arch}.expert_count"):
        cfg["num_local_experts"] = num("expert_count")
    if field(reader, f"{arch}.attention.sliding_window"):
        cfg["sliding_window"], cfg["use_sliding_window"] = num("attention.sliding_window"), True
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind and kind != "none":
        cfg["rope_scaling"] = {"rope_type": kind, "factor": num("rope.scaling.factor", 1.0, float)}
    return cfg


def read_tensors(reader, cfg: dict) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32 under its Hugging Face name; q/k rows un-permuted for llama GGUFs.
    A `rope_freqs` tensor (Llama 3.x: per-frequency divisors) becomes cfg["rope_scaling"] = factors."""
    permuted = field(reader, "general.architecture") == "llama"
    out = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        try:
            w = dequantized(t)
        except Exception as e:  # noqa: BLE001  gguf / numpy on a tensor whose data is not what its header says
            raise ImportRefused(f"GGUF tensor {t.name!r:.60}: unreadable ({' '.join(str(e).split())[:100]})") \
                from None
        if t.name == "rope_freqs.weight":
            cfg["rope_scaling"] = {"rope_type": "factors", "factors": [float(v) for v in w.flatten()]}
            continue
        if parts[0] in TOP_NAMES and len(parts) == 2:
            out[f"{TOP_NAMES[parts[0]]}.{parts[1]}"] = w
        elif parts[0] == "blk" and len(parts) == 4 and parts[2] in BLOCK_NAMES:
            if permuted and parts[2] in ("attn_q", "attn_k"):
                w = unpermute_rope(w, cfg["num_attention_heads" if parts[2] == "attn_q" else "num_key_value_heads"])
            out[f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{parts[3]}"] = w
        else:
            out[t.name] = w      # unknown: llama.py refuses it by name
    return out


def tokenizer_from_gguf(reader):
    """HF ``tokenizers`` byte-level BPE from tokenizer.ggml.{tokens, merges, token_type}.

    tokenizer.ggml.pre names the pre-tokenizer: "smollm" (llama.cpp splits every digit on its own, then applies the
    GPT-2 regex; HF's SmolLM2 tokenizer.json does the same with Sequence[Digits(individual), ByteLevel]), "gpt2",
    "llama-bpe" (Llama 3) and "qwen2" (their split regexes, then byte-level). Control tokens (token_type 3:
    <|endoftext|>, <|im_start|>, <|im_end|>, ...) become special added tokens so that they are matched whole in text
    and skipped when decoding. Anything else raises ImportRefused.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ImportRefused(f"only byte-level BPE (gpt2) GGUF tokenizers are supported, got {model!r}")
    got = {k: field(reader, f"tokenizer.ggml.{k}") for k in ("tokens", "merges", "token_type")}
    for k, v in got.items():
        if not isinstance(v, (list, tuple)) or not v:
            raise ImportRefused(f"GGUF metadata tokenizer.ggml.{k} is missing or not a list")
    tokens, types = list(got["tokens"]), list(got["token_type"])
    if not all(isinstance(t, str) for t in tokens) or len(types) != len(tokens):
        raise ImportRefused("GGUF metadata tokenizer.ggml.tokens / token_type: not one string and one type per token")
    merges = []
    for m in got["merges"]:
        pair = tuple(m.split(" ", 1)) if isinstance(m, str) else ()
        if len(pair) != 2 or not all(pair):
            raise ImportRefused(f"GGUF metadata tokenizer.ggml.merges: {m!r:.40} is not two tokens and a space")
        merges.append(pair)
    pre = field(reader, "tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise ImportRefused(f"GGUF pre-tokenizer {pre!r:.40} is not supported (supported: "
                            f"{', '.join(PRE_TOKENIZERS)})")
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    except Exception as e:  # noqa: BLE001  the Rust side raises plain Exception (a merge of unknown tokens, ...)
        raise ImportRefused(f"GGUF tokenizer: not a usable BPE ({' '.join(str(e).split())[:100]})") from None
    split = PRE_TOKENIZERS[pre]
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if pre == "qwen2":
            tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def read_gguf(path: str | Path, reader=None):
    """(config dict, tensors, tokenizer.json text, chat template or None, stop token strings) of a GGUF file (reader:
    its open_reader, when the caller has it)."""
    reader = reader if reader is not None else open_reader(path)
    cfg = hf_config(reader)
    tok = tokenizer_from_gguf(reader)
    tensors = read_tensors(reader, cfg)
    if "lm_head.weight" not in tensors:
        cfg["tie_word_embeddings"] = True
    tokens = field(reader, "tokenizer.ggml.tokens")
    stops = [tokens[int(i)] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
             if (i := field(reader, k)) is not None and 0 <= int(i) < len(tokens)]
    return cfg, tensors, tok.to_str(), field(reader, "tokenizer.chat_template"), stops
