"""RoPE's inverse frequencies (head_dim/2,) float64, with Hugging Face's rope_scaling kinds: what the model's Rope
tables are made of (model.py) and what ModelConfig checks a config's rope_scaling with (model_config.py)."""
from __future__ import annotations

import math

import torch


def rope_inv_freq(head_dim: int, base: float, scaling: dict | None = None) -> torch.Tensor:
    """(head_dim/2,) float64 inverse frequencies; scaling as Hugging Face's rope_scaling: None / "default",
    "linear" (all divided by factor), "llama3" (long wavelengths divided by factor, short ones kept, a smooth
    blend between; Llama 3.1 / 3.2) or "factors" (one divisor per frequency). Anything else raises ValueError."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "factors":               # per-frequency divisors (a GGUF's rope_freqs tensor: Llama 3.x)
        f = torch.tensor([float(v) for v in scaling["factors"]], dtype=torch.float64)
        if f.shape != inv.shape or not bool((f > 0).all()):
            raise ValueError(f"factors must be {inv.numel()} positive numbers")
        return inv / f
    factor = float(scaling["factor"])
    if not factor > 0:
        raise ValueError(f"factor must be positive (got {factor})")
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        if not high > low:
            raise ValueError("llama3 scaling needs high_freq_factor > low_freq_factor")
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, blended, out)
    raise ValueError(f"unsupported RoPE scaling type {kind!r} (supported: linear, llama3, factors)")
