"""A model folder's config: ModelConfig (the dimensions and the llama-family options, checked when made), config_for
(a named size: choices.SIZES), load_config (config.json, read and checked), the folder's file names and
CheckpointError (a folder that cannot be loaded: one line, fit for the user). The model itself is model.py."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .choices import SIZES
from .errors import TinychatError
from .rope import rope_inv_freq
from .weights_check import MAX_POSITIONS

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"


class CheckpointError(TinychatError, ValueError):
    """A model folder that cannot be loaded; the message is one line, fit for the user."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kv_group: int           # layers per group; layer i is "full" when i % kv_group == 0
    swa_window: int         # local attention window W (keys i-W < j <= i)
    mlp_hidden: int
    logit_softcap: float
    rope_base: float
    max_seq_len: int
    engram_orders: tuple[int, ...] = ()     # n-gram orders, e.g. (2, 3); () = no Engram
    engram_layers: tuple[int, ...] = ()     # blocks that get an Engram module
    engram_heads: int = 0                   # hash heads per order
    engram_table_size: int = 0              # slots per (order, head) table; a prime
    engram_dim: int = 0                     # embedding width per (order, head)
    # llama-family options (defaults: TinyAgentLM). swa_window 0 = no local K/V (needs kv_group 1);
    # logit_softcap 0 = no softcap.
    mlp_kind: str = "relu2"                 # "relu2": down(relu(up x)^2); "swiglu": up = [gate; up] rows
    qk_norm: bool = True                    # rms_norm of every q / k head before RoPE
    attn_bias: bool = False                 # biases on w_q / w_kv_* (Qwen2)
    norm_eps: float | None = None           # RMSNorm epsilon (None: torch's default, finfo(dtype).eps)
    rope_scaling: dict | None = None        # {"type": "linear" | "llama3", "factor": ..., ...}
    name: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "engram_orders", tuple(int(n) for n in self.engram_orders))
        object.__setattr__(self, "engram_layers", tuple(int(n) for n in self.engram_layers))
        problems = self.problems()
        if problems:
            raise CheckpointError("invalid model config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        p = []
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "kv_group",
                  "swa_window", "mlp_hidden", "max_seq_len"):
            v = getattr(self, f)
            low = 0 if f == "swa_window" else 1                 # swa_window 0: no local attention
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                p.append(f"{f} must be a {'non-negative' if low == 0 else 'positive'} integer (got {v!r})")
        if p:
            return p
        if self.max_seq_len > MAX_POSITIONS:
            p.append(f"max_seq_len must be at most {MAX_POSITIONS:,} (got {self.max_seq_len:,})")
        if self.swa_window == 0 and self.kv_group != 1:
            p.append("swa_window 0 (no local attention) needs kv_group 1 (every layer global)")
        if self.mlp_kind not in MLP_KINDS:
            p.append(f"mlp_kind must be one of {', '.join(MLP_KINDS)} (got {self.mlp_kind!r})")
        if self.norm_eps is not None and not self.norm_eps > 0:
            p.append(f"norm_eps must be positive (got {self.norm_eps!r})")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            p.append(f"rope_scaling must be an object or null (got {self.rope_scaling!r:.40})")
        elif self.rope_scaling is not None:
            try:
                rope_inv_freq(self.head_dim, self.rope_base, self.rope_scaling)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                p.append(f"rope_scaling: {e}")
        if self.n_heads % self.n_kv_heads:
            p.append(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            p.append(f"head_dim ({self.head_dim}) must be even (RoPE)")
        if not self.logit_softcap >= 0 or not self.rope_base > 0:
            p.append("logit_softcap must be >= 0 (0: off) and rope_base positive")
        if self.engram_orders:
            if min(self.engram_orders) < 2:
                p.append("engram_orders must be n-gram orders >= 2")
            if self.engram_heads <= 0 or self.engram_table_size <= 1 or self.engram_dim <= 0:
                p.append("engram_heads, engram_table_size and engram_dim must be positive with engram_orders")
            if any(not 0 <= i < self.n_layers for i in self.engram_layers):
                p.append(f"engram_layers {self.engram_layers} out of range for {self.n_layers} layers")
        return p

    @property
    def n_groups(self) -> int:
        return math.ceil(self.n_layers / self.kv_group)

    @property
    def has_local(self) -> bool:
        """Do layers have their own local (sliding-window) K/V? False for the llama family."""
        return self.swa_window > 0

    @property
    def is_tinyagent(self) -> bool:
        """Every llama-family option at TinyAgentLM's default (what the native int8 step expresses)."""
        return (self.swa_window > 0 and self.mlp_kind == "relu2" and self.qk_norm and not self.attn_bias
                and self.norm_eps is None and self.logit_softcap > 0)

    @property
    def has_engram(self) -> bool:
        return bool(self.engram_orders and self.engram_layers)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["engram_orders"], d["engram_layers"] = list(self.engram_orders), list(self.engram_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise CheckpointError("model config must be a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise CheckpointError(f"model config lacks {', '.join(missing)}")
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(f"model config has unknown fields {', '.join(unknown)}")
        try:
            return cls(**d)
        except CheckpointError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError) as e:   # a field of the wrong type or value
            raise CheckpointError(f"invalid model config: {' '.join(str(e).split())[:120]}") from None

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes the decode cache grows by per token: one global K/V per group (the local rings are fixed size)."""
        return self.n_groups * 2 * self.n_kv_heads * self.head_dim * dtype_bytes

    def gqa_kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """What a standard per-layer GQA cache of the same dims would store per token."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * dtype_bytes

    def ring_bytes(self, dtype_bytes: int = 2) -> int:
        """The fixed part: one ring of swa_window K/V slots per layer."""
        return self.n_layers * 2 * self.n_kv_heads * self.swa_window * self.head_dim * dtype_bytes


def config_for(size: str, **overrides) -> ModelConfig:
    if size not in SIZES:
        raise CheckpointError(f"unknown model size {size!r} (choose from {', '.join(SIZES)})")
    return ModelConfig(**{**SIZES[size], "name": size, **overrides})


MLP_KINDS = ("relu2", "swiglu")


def load_config(path) -> ModelConfig:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such model folder")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder (a model is a folder with {CONFIG_FILE} and {WEIGHTS_FILE})")
    cpath = path / CONFIG_FILE
    if not cpath.is_file():
        raise CheckpointError(f"{path}: no {CONFIG_FILE}")
    try:
        raw = json.loads(cpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cpath}: malformed JSON ({e})") from None
    try:
        return ModelConfig.from_dict(raw)
    except CheckpointError as e:
        raise CheckpointError(f"{cpath}: {e}") from None
