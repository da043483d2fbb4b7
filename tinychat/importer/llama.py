"""A llama-family checkpoint (a Hugging Face config dict + tensors under Hugging Face names, from a folder or a GGUF
file) -> a TinyAgentLM with the llama options: every layer global (kv_group 1, swa_window 0), no QK-norm, no softcap,
SwiGLU (up = [gate; up] rows), q/k/v biases when the checkpoint has them (Qwen2), RoPE base / scaling and the norm
epsilon as the checkpoint says. The learned RMSNorm gains fold exactly into the next Linear: rms(x) * g @ W^T ==
rms(x) @ (W diag(g))^T; the final norm's gain into the head (so a tied head is stored untied: head = embed diag(g)).
The layers' gains are also kept apart (model.in_gains, tinychat/norm_gains.py): quantized Linears apply them to their
activations instead of rounding the folded weights (issue #34)

What the engine cannot express is refused, naming what is missing: mixture-of-experts layers, sliding-window
attention, Qwen3-style learned QK-norm, biases elsewhere than q/k/v, activations other than SiLU, other RoPE
scalings (YaRN, dynamic NTK, longrope)."""
from __future__ import annotations

import math
import numbers

import torch

from ..model import _SKIP_INIT, CheckpointError, ModelConfig, TinyAgentLM, first_nonfinite, rope_inv_freq
from .errors import ImportRefused

ARCHITECTURES = ("llama", "qwen2", "mistral")
DEFAULT_CONTEXT = 4096      # positions the imported model's cache may hold (its max_seq_len), unless asked for more


def check_supported(cfg: dict) -> None:
    """ImportRefused naming the first feature of cfg that the engine cannot run."""
    mt = str(cfg.get("model_type", "")).lower()
    archs = [str(a) for a in cfg.get("architectures") or ()]
    if any(k in cfg and cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")) \
            or "moe" in mt or any("Moe" in a for a in archs):
        raise ImportRefused(f"{mt or 'this model'}: mixture-of-experts layers are not supported (the engine runs one "
                            "dense SwiGLU MLP per layer)")
    if mt not in ARCHITECTURES:
        raise ImportRefused(f"model_type {mt!r} is not a supported llama-family architecture "
                            f"(supported: {', '.join(ARCHITECTURES)})")
    window = cfg.get("sliding_window")
    if (mt == "qwen2" and cfg.get("use_sliding_window")) or (mt != "qwen2" and window) or \
            (mt == "llama" and cfg.get("use_sliding_window")):
        raise ImportRefused(f"{mt}: sliding-window attention (window {window}) is not supported: every layer must "
                            "attend to the whole context")
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act != "silu":
        raise ImportRefused(f"{mt}: MLP activation {act!r} is not supported (only SiLU, i.e. SwiGLU)")
    if cfg.get("mlp_bias"):
        raise ImportRefused(f"{mt}: MLP biases are not supported")
    scaling = cfg.get("rope_scaling")
    if scaling and not (isinstance(scaling, dict) and scaling.get("rope_type") == "factors"):   # factors: checked
        try:                                                                                   # with the head dim
            rope_inv_freq(8, 10000.0, scaling)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ImportRefused(f"{mt}: rope_scaling {e}") from None


def _int(cfg: dict, key: str, default=None) -> int:
    """A config field that must be a whole number (JSON 32, not "32", 32.7 or true); ImportRefused otherwise."""
    v = cfg.get(key, default) if default is not None else cfg[key]
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ImportRefused(f"config field {key} must be a whole number, got {v!r:.40}")
    return int(v)


def _float(cfg: dict, key: str, default: float) -> float:
    """A config field that must be a finite number (not a string or a boolean)."""
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ImportRefused(f"config field {key} must be a number, got {v!r:.40}")
    return float(v)


def build_config(cfg: dict, tensors: dict, context: int | None = None, name: str = "") -> ModelConfig:
    check_supported(cfg)
    try:
        d, H = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
        if H < 1:
            raise ImportRefused(f"config field num_attention_heads must be positive, got {H}")
        D = _int(cfg, "head_dim") if cfg.get("head_dim") else d // H
        n_ctx = _int(cfg, "max_position_embeddings", DEFAULT_CONTEXT)
        emb = tensors.get("model.embed_tokens.weight")
        if emb is None:
            raise ImportRefused("weights lack model.embed_tokens.weight")
        spec = dict(
            vocab_size=int(emb.shape[0]), d_model=d,
            n_layers=_int(cfg, "num_hidden_layers"), n_heads=H,
            n_kv_heads=_int(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") else H,
            head_dim=D, kv_group=1, swa_window=0, mlp_hidden=_int(cfg, "intermediate_size"), logit_softcap=0.0,
            rope_base=_float(cfg, "rope_theta", 10000.0),
            max_seq_len=min(n_ctx, int(context or DEFAULT_CONTEXT)),
            mlp_kind="swiglu", qk_norm=False, attn_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
            norm_eps=_float(cfg, "rms_norm_eps", 1e-6), rope_scaling=cfg.get("rope_scaling") or None, name=name)
    except KeyError as e:
        raise ImportRefused(f"config lacks {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ImportRefused):
            raise
        raise ImportRefused(f"config has a bad value ({e})") from None
    try:
        return ModelConfig(**spec)
    except CheckpointError as e:
        raise ImportRefused(str(e)) from None


def check_tensors(c: ModelConfig, cfg: dict, tensors: dict) -> None:
    """ImportRefused naming the first tensor the config implies that is missing, of another shape, or holding NaN /
    Inf, and any tensor left over: all before the model is built (a small file claiming 100,000 layers, or an MLP
    2^24 wide, is refused at once instead of allocating that model first)."""
    d, H, Hk, D, F = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_hidden
    want = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,)}
    if "lm_head.weight" in tensors or cfg.get("tie_word_embeddings") is False:
        if "lm_head.weight" not in tensors:
            raise ImportRefused("weights lack lm_head.weight (and the config says the head is not tied)")
        want["lm_head.weight"] = (c.vocab_size, d)
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        for k, shape in (("input_layernorm.weight", (d,)), ("post_attention_layernorm.weight", (d,)),
                         ("self_attn.q_proj.weight", (H * D, d)), ("self_attn.k_proj.weight", (Hk * D, d)),
                         ("self_attn.v_proj.weight", (Hk * D, d)), ("self_attn.o_proj.weight", (d, H * D)),
                         ("mlp.gate_proj.weight", (F, d)), ("mlp.up_proj.weight", (F, d)),
                         ("mlp.down_proj.weight", (d, F))):
            if p + k not in tensors:
                raise ImportRefused(f"weights lack {p + k} (the config says {c.n_layers} layers)")
            want[p + k] = shape
        if c.attn_bias:
            for n, rows in (("q", H * D), ("k", Hk * D), ("v", Hk * D)):
                want[p + f"self_attn.{n}_proj.bias"] = (rows,)
    for k, shape in want.items():
        t = tensors.get(k)
        if t is None:
            raise ImportRefused(f"weights lack {k}")
        if tuple(t.shape) != shape:
            raise ImportRefused(f"{k} has shape {tuple(t.shape)}, the config implies {shape}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ImportRefused(f"{k} holds NaN or infinite values (a damaged or badly converted checkpoint)")
    extra = sorted(k for k in tensors if k not in want and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        what = ("learned QK-norm (q_norm / k_norm)" if any("q_norm" in k or "k_norm" in k for k in extra) else
                "biases other than q/k/v" if any(k.endswith(".bias") for k in extra) else "unknown tensors")
        raise ImportRefused(f"{what} not supported: {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")


def _take(tensors: dict, name: str, shape: tuple) -> torch.Tensor:
    t = tensors.pop(name, None)
    if t is None:
        raise ImportRefused(f"weights lack {name}")
    if tuple(t.shape) != tuple(shape):
        raise ImportRefused(f"{name} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
    return t.float()


@torch.no_grad()
def build_model(cfg: dict, tensors: dict, context: int | None = None, name: str = "",
                checked: bool = False) -> TinyAgentLM:
    """The TinyAgentLM holding this checkpoint's weights (fp32), norm gains folded in. Consumes `tensors`. Every
    tensor is checked (check_tensors) before the model is built, and the model is built without the random init its
    weights would get only to be replaced. checked: check_tensors already ran on them."""
    c = build_config(cfg, tensors, context, name)
    if not checked:
        check_tensors(c, cfg, tensors)
    tensors = dict(tensors)
    d, H, Hk, D, F = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_hidden
    token = _SKIP_INIT.set(True)
    try:
        m = TinyAgentLM(c)
    finally:
        _SKIP_INIT.reset(token)
    emb = _take(tensors, "model.embed_tokens.weight", (c.vocab_size, d))
    m.embed.weight.copy_(emb)
    g_final = _take(tensors, "model.norm.weight", (d,))
    head = tensors.pop("lm_head.weight", None)
    if head is None:
        if cfg.get("tie_word_embeddings") is False:
            raise ImportRefused("weights lack lm_head.weight (and the config says the head is not tied)")
        head = emb
        m.tied_gain = g_final.clone()     # head = embed diag(g): a stored int8 / int4 file reads the embedding
                                          # back from the head rows (quant_files.py, layout version 2)
    if tuple(head.shape) != (c.vocab_size, d):
        raise ImportRefused(f"lm_head.weight has shape {tuple(head.shape)}, expected {(c.vocab_size, d)}")
    m.head.weight.copy_(head.float() * g_final[None, :])
    m.in_gains = {}                   # the gains folded into q/k/v and [gate; up], kept apart for quantize_cpu
    for i, blk in enumerate(m.blocks):
        p = f"model.layers.{i}."
        g1 = _take(tensors, p + "input_layernorm.weight", (d,))
        g2 = _take(tensors, p + "post_attention_layernorm.weight", (d,))
        m.in_gains[f"blocks.{i}.attn"], m.in_gains[f"blocks.{i}.mlp"] = g1.clone(), g2.clone()   # norm_gains.py
        q = _take(tensors, p + "self_attn.q_proj.weight", (H * D, d))
        k = _take(tensors, p + "self_attn.k_proj.weight", (Hk * D, d))
        v = _take(tensors, p + "self_attn.v_proj.weight", (Hk * D, d))
        a = blk.attn
        a.w_q.weight.copy_(q * g1[None, :])
        a.w_kv_global.weight.copy_(torch.cat([k, v]) * g1[None, :])      # K rows then V rows
        if c.attn_bias:
            a.w_q.bias.copy_(_take(tensors, p + "self_attn.q_proj.bias", (H * D,)))
            a.w_kv_global.bias.copy_(torch.cat([_take(tensors, p + "self_attn.k_proj.bias", (Hk * D,)),
                                                _take(tensors, p + "self_attn.v_proj.bias", (Hk * D,))]))
        a.w_o.weight.copy_(_take(tensors, p + "self_attn.o_proj.weight", (d, H * D)))
        gate = _take(tensors, p + "mlp.gate_proj.weight", (F, d))
        up = _take(tensors, p + "mlp.up_proj.weight", (F, d))
        blk.mlp.up.weight.copy_(torch.cat([gate, up]) * g2[None, :])     # [gate; up] rows
        blk.mlp.down.weight.copy_(_take(tensors, p + "mlp.down_proj.weight", (d, F)))
    bad = first_nonfinite(m)                          # a fold that overflowed (a huge gain times a weight)
    if bad:
        raise ImportRefused(f"{bad} holds NaN or infinite values after the norm gains were folded in")
    return m.eval()
