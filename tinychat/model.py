"""TinyAgentLM: the model the small-KV-cache decoder runs (what the user's `tiny_agent.model` provides).

Layers come in groups of `kv_group`: the first layer of a group is "full" and writes the group's global K/V
(attended causally over the whole context by every layer of the group); every layer also has its own local K/V
over a sliding window of `swa_window` positions. Each query runs ONE softmax over [global keys | local keys].
So the decode cache holds one global K/V per group plus one small ring per layer.

One layer body, `Block.forward(x, kv, addrs)`, runs C >= 1 new tokens through a layer for every path: kv is their
cache view (CacheView), where the paths differ (how q / k / v reach the cache and attention reads it). SeqView is
the full sequence's, without a cache; the engine's views feed its KVCache (append, append_chunked, the eager and
static decode steps). `TinyAgentLM.forward(idx)` is the plain full-sequence forward: the exact reference the
incremental decoder (tinychat.engine) is tested against. Training runs `trunk(idx, attn_chunk)` (the same function
with attention in query blocks) and its own fused head + loss (tinychat.training.loss).

The llama family (SmolLM2, Qwen2.5, Llama 3.2) is the same model with a few options set (see ModelConfig): every
layer global (`kv_group` 1, `swa_window` 0: no local K/V), no QK-norm, no softcap, a SwiGLU MLP, the checkpoint's
RoPE base / scaling and RMSNorm epsilon, q/k/v biases for Qwen. Learned RMSNorm gains are folded into the next
Linear when such a checkpoint is imported (W @ diag(g)), so every norm here stays weightless. Defaults are
TinyAgentLM's own behaviour.
"""
from __future__ import annotations

import contextvars
import json
import math
import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .choices import SIZES  # noqa: F401 (re-exported)
from .fsutil import atomic_write
from .mapped import MappedWeights
from .model_config import (CONFIG_FILE, MLP_KINDS, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError,  # noqa: F401 (re-exported)
                           ModelConfig, config_for, load_config)
from .rope import rope_inv_freq
from .weights_check import MAX_POSITIONS, check_shapes, first_nonfinite, state_count, state_shapes  # noqa: F401 (re-exported)

KEEP_MAPPED_BYTES = 1 << 20    # from_pretrained(stored_linears=True): tensors this big, already in the dtype wanted,
                               # stay views of the mapped file (an fp32 import's 113 MB embedding) instead of copies


def rms_norm(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """Weightless RMS norm over the last dimension (eps None: torch's default, finfo(x.dtype).eps)."""
    return F.rms_norm(x, (x.size(-1),), eps=eps)


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(logits / cap); cap 0: the logits unchanged (the llama family)."""
    return cap * torch.tanh(logits / cap) if cap else logits


_SKIP_INIT = contextvars.ContextVar("tinychat_skip_init", default=False)


class Linear(nn.Linear):
    """nn.Linear whose construction-time random init is skipped inside from_pretrained, which replaces every
    weight: the init would write every page of the fp32 weights (87 MB for `demo`) only for the file to replace
    them, and a model loaded for --quant int8 never needs fp32 Linear weights at all."""

    def reset_parameters(self) -> None:
        if not _SKIP_INIT.get():
            super().reset_parameters()


class Embedding(nn.Embedding):
    """nn.Embedding with the same skippable init (see Linear)."""

    def reset_parameters(self) -> None:
        if not _SKIP_INIT.get():
            super().reset_parameters()


class Rope(nn.Module):
    """Half-split rotary embedding; cos/sin (max_seq_len, head_dim/2) indexed by absolute position."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float, scaling: dict | None = None):
        super().__init__()
        inv = rope_inv_freq(head_dim, base, scaling)
        ang = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) at positions 0..T-1."""
        T = x.size(-2)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Engram(nn.Module):
    """Hashed n-gram memory with a context gate (position-local: no temporal convolution).

    For every order n and hash head h, the n canonical ids ending at a position hash (multiplicative-XOR) into a
    prime-sized table; the gathered embeddings are concatenated, projected to a value v and a key k, and
    gate = sigmoid(<rms_norm(x), rms_norm(k)> / sqrt(d)) scales v."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.orders, self.heads, self.size = cfg.engram_orders, cfg.engram_heads, cfg.engram_table_size
        self.n_max = max(self.orders)
        n_tables = len(self.orders) * self.heads
        self.table = Embedding(n_tables * self.size, cfg.engram_dim)
        self.w_k = Linear(n_tables * cfg.engram_dim, cfg.d_model, bias=False)
        self.w_v = Linear(n_tables * cfg.engram_dim, cfg.d_model, bias=False)
        # odd multipliers < 2^31 (so cid * mult fits in int64 without wrapping), fixed per layer; saved with weights
        g = torch.Generator().manual_seed(0x5EED + 7919 * layer)
        mult = torch.randint(1 << 20, 1 << 31, (n_tables, self.n_max), generator=g) | 1
        self.register_buffer("mult", mult)
        self.register_buffer("offset", torch.arange(n_tables) * self.size)

    def addresses(self, cids: torch.Tensor) -> torch.Tensor:
        """cids (B, T + n_max - 1), the n_max - 1 previous canonical ids first. Returns (B, T + n_max - 1,
        n_tables) table addresses; the first n_max - 1 positions see a shorter context and are sliced off by
        the callers ([:, n_max - 1:])."""
        B, S = cids.shape
        c = F.pad(cids, (self.n_max - 1, 0))                    # (B, S + n_max - 1)
        addrs = []
        t = 0
        for n in self.orders:
            for h in range(self.heads):
                acc = torch.zeros(B, S, dtype=torch.long, device=cids.device)
                for j in range(n):                               # token j places back from the position
                    tok = c[:, self.n_max - 1 - j:self.n_max - 1 - j + S]
                    acc = torch.bitwise_xor(acc, tok * self.mult[t, j])
                addrs.append(torch.remainder(acc, self.size) + self.offset[t])
                t += 1
        return torch.stack(addrs, dim=-1)

    def forward(self, x: torch.Tensor, addrs: torch.Tensor) -> torch.Tensor:
        """x (B, T, d), addrs (B, T, n_tables) -> (B, T, d)."""
        e = self.table(addrs).flatten(-2).to(x.dtype)           # (B, T, n_tables * engram_dim)
        v, k = self.w_v(e), self.w_k(e)
        gate = torch.sigmoid((rms_norm(x) * rms_norm(k)).sum(-1, keepdim=True) / math.sqrt(x.size(-1)))
        return gate * v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.group = layer, layer // cfg.kv_group    # the group whose global K/V this layer reads
        self.mode = "full" if layer % cfg.kv_group == 0 else "local"
        d, H, Hk, D, b = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.attn_bias
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hk, D
        self.qk_norm, self.eps = cfg.qk_norm, cfg.norm_eps
        self.w_q = Linear(d, H * D, bias=b)
        # K rows then V rows; no local K/V when swa_window is 0 (every layer global: the llama family)
        self.w_kv_local = Linear(d, 2 * Hk * D, bias=b) if cfg.has_local else None
        self.w_kv_global = Linear(d, 2 * Hk * D, bias=b) if self.mode == "full" else None
        self.w_o = Linear(H * D, d, bias=False)

    def qkn(self, t: torch.Tensor) -> torch.Tensor:
        """The q / k head norm: rms_norm over each head's D, or the identity without QK-norm (the llama family)."""
        return rms_norm(t, self.eps) if self.qk_norm else t

    def heads(self, h: torch.Tensor, rot):
        """h (B, C, d), the normed hidden states of C tokens -> q (B, H, C, D), then (k, v) of w_kv_global (None but
        on a "full" layer) and of w_kv_local (None without a local ring), each (B, Hk, C, D): q and the k's normed
        per head and rotated by rot (RoPE at the tokens' positions, (..., C, D) -> the same shape)."""
        B, C, _ = h.shape
        H, Hk, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = rot(self.qkn(self.w_q(h).view(B, C, H, D).transpose(1, 2)))
        kv = []
        for lin in (self.w_kv_global, self.w_kv_local):
            if lin is None:
                kv.append(None)
                continue
            k, v = lin(h).view(B, C, 2, Hk, D).permute(2, 0, 3, 1, 4)
            kv.append((rot(self.qkn(k)), v))
        return q, kv[0], kv[1]


class MLP(nn.Module):
    """relu2: down(relu(up(x))^2). swiglu: up holds [gate; up] rows (one weight stream), down(silu(g) * u)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind = cfg.mlp_kind
        self.up = Linear(cfg.d_model, cfg.mlp_hidden * (2 if self.kind == "swiglu" else 1), bias=False)
        self.down = Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        u = self.up(x)
        return self.down(mlp_act(self.kind, u) if u.requires_grad else mlp_act_(self.kind, u))


def mlp_act(kind: str, u: torch.Tensor) -> torch.Tensor:
    """The MLP's middle: relu(u)^2, or for swiglu u = [g | v] on the last dim -> silu(g) * v."""
    if kind == "swiglu":
        g, v = u.chunk(2, dim=-1)
        return F.silu(g) * v
    return F.relu(u).square()


def mlp_act_(kind: str, u: torch.Tensor) -> torch.Tensor:
    """mlp_act with its products in place (inference: no autograd graph to keep): the same values (square is
    u * u), fewer big buffers (relu2: none; swiglu: silu(g) only)."""
    if kind == "swiglu":
        g, v = u.chunk(2, dim=-1)
        return F.silu(g).mul_(v)
    torch.relu_(u)
    return u.mul_(u)


def grouped_attention(q, kg, vg, kl, vl, window: int, chunk: int = 0) -> torch.Tensor:
    """One softmax per query i over [global keys j <= i | local keys i - window < j <= i] (kl None: global only).
    q (B, H, T, D); kg, vg, kl, vl (B, Hk, T, D), query head h reads K/V head h // (H / Hk) -> (B, H, T, D).

    chunk <= 0 (or T <= chunk): one call with the dense (T, 2T) mask. chunk > 0: queries in blocks [s, e), each
    against only the keys it can see (global [0, e), local [s - window + 1, e)): the same function, ~1.6x less time
    forward + backward at T = 1024 (the dense mask makes the kernel compute every dead block too)."""
    T = q.size(2)
    i = torch.arange(T, device=q.device)
    step = chunk if 0 < chunk < T else T
    ys = []
    for s in range(0, T, step):
        e = min(T, s + step)
        qi = i[s:e, None]
        m = i[None, :e] <= qi                                                     # (e - s, e) causal, global
        K, V = kg[:, :, :e], vg[:, :, :e]
        if kl is not None:
            ls = max(0, s - window + 1)
            lj = i[None, ls:e]
            m = torch.cat([m, (lj <= qi) & (qi - lj < window)], dim=1)            # [global | local] keys
            K, V = torch.cat([K, kl[:, :, ls:e]], dim=2), torch.cat([V, vl[:, :, ls:e]], dim=2)
        ys.append(F.scaled_dot_product_attention(q[:, :, s:e], K, V, attn_mask=m, enable_gqa=True))
    return ys[0] if len(ys) == 1 else torch.cat(ys, dim=2)


class CacheView:
    """What a Block's forward asks of the tokens it runs over and of the cache they go into: the reference layer
    body is Block.forward, and a view is where the paths differ. attend(attn, h) projects q / k / v from the normed
    hidden states h (B, C, d) (Attention.heads, or a fused GEMM), rotates them at the tokens' positions, writes the
    new K/V where this view keeps them and returns one softmax per query over [global keys | local keys] times the
    values, (B, C, H * D) in h's dtype. add_out / add_mlp are the residual adds; a view may fuse them (the static step
    runs addmm). Views: SeqView here (the training forward: positions 0..T-1, no cache), and the engine's over a
    KVCache (engine/append.py: append, append_chunked, the eager decode step; engine/static.py: the static step)."""

    def attend(self, attn: "Attention", h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_out(self, x: torch.Tensor, w_o: nn.Module, y: torch.Tensor) -> torch.Tensor:
        return x + w_o(y)

    def add_mlp(self, x: torch.Tensor, mlp: "MLP", h: torch.Tensor) -> torch.Tensor:
        return x + mlp(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.engram = Engram(cfg, layer) if cfg.has_engram and layer in cfg.engram_layers else None
        self.eps = cfg.norm_eps

    def forward(self, x: torch.Tensor, kv: CacheView, addrs: torch.Tensor | None = None) -> torch.Tensor:
        """The layer over C >= 1 new tokens: x (B, C, d) -> (B, C, d) (or (C, d), one row: the static step's view);
        kv: their cache view (CacheView), addrs: this block's Engram addresses (B, C, n_tables). Training, append, append_chunked, the eager and the static
        decode steps all run this body; the lean CPU steps and the native ones are its fused variants
        (engine/steps.py), tested against it."""
        if self.engram is not None:
            x = x + self.engram(x, addrs)
        x = kv.add_out(x, self.attn.w_o, kv.attend(self.attn, rms_norm(x, self.eps)))
        return kv.add_mlp(x, self.mlp, rms_norm(x, self.eps))


class SeqView(CacheView):
    """The training forward's view: tokens at positions 0..T-1 of each row, no cache; a full layer's global K/V are
    kept for the later layers of its group. attn_chunk > 0: attention in query blocks (grouped_attention)."""

    def __init__(self, rope: "Rope", window: int, attn_chunk: int = 0):
        self.rope, self.window, self.attn_chunk = rope, window, attn_chunk
        self.kg = self.vg = None

    def attend(self, attn, h):
        B, T, _ = h.shape
        q, glob, loc = attn.heads(h, self.rope)
        if glob is not None:
            self.kg, self.vg = glob
        kl, vl = loc if loc is not None else (None, None)
        y = grouped_attention(q, self.kg, self.vg, kl, vl, self.window, self.attn_chunk)
        return y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.head_dim)


def canonical_ids(token_strings: list[str]) -> torch.Tensor:
    """cid_map from each token's text: tokens equal after NFKC + lowercase + stripping a leading space share the
    smallest such id. (V,) long."""
    first: dict[str, int] = {}
    out = []
    for i, s in enumerate(token_strings):
        key = unicodedata.normalize("NFKC", s).lower()
        key = key[1:] if key.startswith(" ") else key
        out.append(first.setdefault(key, i))
    return torch.tensor(out, dtype=torch.long)


class TinyAgentLM(nn.Module):
    def __init__(self, cfg: ModelConfig, token_strings: list[str] | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rope = Rope(cfg.head_dim, cfg.max_seq_len, cfg.rope_base, cfg.rope_scaling)
        self.register_buffer("cid_map", torch.arange(cfg.vocab_size))
        if token_strings is not None:
            self.set_token_strings(token_strings)
        self._engrams = [b.engram for b in self.blocks if b.engram is not None]
        if not _SKIP_INIT.get():            # from_pretrained replaces every parameter
            self.reset_parameters()

    def set_token_strings(self, token_strings: list[str]) -> None:
        """Build cid_map from the tokenizer's token texts (ids past the tokenizer's vocabulary map to themselves)."""
        V = self.cfg.vocab_size
        if len(token_strings) > V:
            raise CheckpointError(f"tokenizer has {len(token_strings)} tokens, more than the model's {V}")
        cid = torch.arange(V)
        cid[:len(token_strings)] = canonical_ids(token_strings)
        self.cid_map.copy_(cid)

    def reset_parameters(self, seed: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("w_o.weight", "down.weight")) \
                    else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std if not name.endswith(".bias") else 0 * p)

    def engram_modules(self) -> list[Engram]:
        return self._engrams

    def engram_addresses(self, idx: torch.Tensor, prev: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        """{block index: (B, T, n_tables)} for tokens idx (B, T); prev (B, n_max - 1) the tokens before idx
        (token id 0 where the sequence starts)."""
        if not self._engrams:
            return {}
        n1 = max(self.cfg.engram_orders) - 1
        if prev is None:
            prev = idx.new_zeros(idx.size(0), n1)
        cids = self.cid_map[torch.cat([prev, idx], dim=1)]
        return {i: b.engram.addresses(cids)[:, n1:] for i, b in enumerate(self.blocks) if b.engram is not None}

    def forward(self, idx: torch.Tensor, attn_chunk: int = 0) -> torch.Tensor:
        """idx (B, T) token ids at positions 0..T-1 -> softcapped logits (B, T, V). attn_chunk: see trunk()."""
        return self.logits(self.trunk(idx, attn_chunk))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (..., d) -> softcapped fp32 logits (..., V)."""
        return softcap(self.head(rms_norm(x, self.cfg.norm_eps)).float(), self.cfg.logit_softcap)

    def trunk(self, idx: torch.Tensor, attn_chunk: int = 0) -> torch.Tensor:
        """idx (B, T) -> (B, T, d) hidden states before the final norm and head. attn_chunk > 0: attention in
        query blocks of that many positions (grouped_attention): the same function, less work on long rows."""
        c = self.cfg
        if idx.size(1) > c.max_seq_len:
            raise ValueError(f"sequence of {idx.size(1)} tokens exceeds max_seq_len {c.max_seq_len}")
        return self.run_blocks(self.embed(idx), SeqView(self.rope, c.swa_window, attn_chunk),
                               self.engram_addresses(idx))

    def run_blocks(self, x: torch.Tensor, kv: CacheView, addrs: dict[int, torch.Tensor]) -> torch.Tensor:
        """Every block over x (B, C, d), the embedded new tokens, with their cache view and Engram addresses
        ({block: (B, C, n_tables)}) -> the final hidden states (B, C, d)."""
        for li, blk in enumerate(self.blocks):
            x = blk(x, kv, addrs.get(li))
        return x

    # --- reports -----------------------------------------------------------------------------------------------
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_linear_params(self) -> int:
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))

    # --- checkpoints (safetensors only, never pickle) ------------------------------------------------------------
    def save_pretrained(self, path, tokenizer_json: str | Path | None = None, dtype: torch.dtype | None = None):
        """Write config.json, model.safetensors (weights + cid_map + Engram multipliers) and tokenizer.json (copied
        from tokenizer_json when given). dtype: store floating weights in this dtype (e.g. bf16 for shipping).
        Each file is written to a temp name and renamed, so a crash never leaves a half-written checkpoint file."""
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = {}
        for k, v in self.state_dict().items():
            v = v.detach().cpu()
            if dtype is not None and v.is_floating_point():
                v = v.to(dtype)
            sd[k] = v.contiguous()
        atomic_write(path / WEIGHTS_FILE, lambda tmp: save_file(sd, str(tmp), metadata={"format": "pt"}))
        atomic_write(path / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(self.cfg.to_dict(), indent=2)))
        if tokenizer_json is not None and Path(tokenizer_json).resolve() != (path / TOKENIZER_FILE).resolve():
            data = Path(tokenizer_json).read_bytes()
            atomic_write(path / TOKENIZER_FILE, lambda tmp: tmp.write_bytes(data))

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, stored_linears: bool = False,
                        check_finite: bool = True) -> "TinyAgentLM":
        """The model in folder `path`, its tensors in `dtype`. stored_linears: keep the Linear weights in the file's
        own dtype (bf16 for the shipped model), for a model about to be quantized: no fp32 copy of them is ever
        made; a Chat with --quant none converts them (linears_to); tensors of KEEP_MAPPED_BYTES or more already in
        `dtype` stay where the file lies too. The file is memory-mapped, not read whole. Its tensors' names and shapes
        are compared with the config's (state_shapes) before anything is built; check_finite: refuse NaN / Inf weights
        (a chat's load checks them once per file version instead, with its identity: identity.py)."""
        cfg = load_config(path)
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        wpath = Path(path) / WEIGHTS_FILE
        if not wpath.is_file():
            raise CheckpointError(f"{path}: no {WEIGHTS_FILE}")
        try:
            check_shapes(wpath, cfg, "config.json", CheckpointError)   # before anything is built
            sd = load_file(str(wpath))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{wpath}: unreadable safetensors file ({str(e).splitlines()[0][:120]})") from None
        # the model itself, its random init skipped (not a meta-device copy: that imports ~800 modules, ~75 MB
        # resident for good); the storage torch.empty gave it is never written, and freed once replaced below
        token = _SKIP_INIT.set(True)
        try:
            model = cls(cfg)
        finally:
            _SKIP_INIT.reset(token)
        expected = {k: v for k, v in model.state_dict().items()}
        if set(expected) != set(sd):        # state_shapes and the model disagree: a bug here, not in the file
            raise CheckpointError(f"{wpath}: internal error: the model's tensors are not the ones state_shapes names")
        linears = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        mapped = MappedWeights()
        for k, v in sd.items():             # one tensor at a time: no second whole copy of the weights
            want = expected[k].dtype
            if v.is_floating_point() and want.is_floating_point:
                want = v.dtype if stored_linears and k in linears else dtype
            # stored Linear weights stay views of the mapped file (freed with it once quantized), and so do big
            # weight tables already in the dtype wanted (an fp32 import's embedding: only the rows read are
            # resident); a model loaded so is only quantized and run, its weights never written (a written page
            # of the private mapping would be lost to MappedWeights.drop; buffers such as cid_map are rebuilt in
            # place, so they are copied). Anything else is copied out, so no small buffer holds the whole mapping
            # alive, and the file's pages it was copied from are handed back
            keep = k in linears or (v.is_floating_point() and v.nbytes >= KEEP_MAPPED_BYTES)
            if want == v.dtype and stored_linears and keep:
                continue
            sd[k] = mapped.copy_out(v, want)    # block by block, each block's pages handed back
        model.load_state_dict(sd, strict=True, assign=True)   # parameters become the tensors above
        if check_finite and (bad := first_nonfinite(model)):
            raise CheckpointError(f"{wpath}: {bad} holds NaN or infinite values (a damaged or badly converted "
                                  f"checkpoint)")
        if dtype != torch.float32:          # buffers made by __init__ (RoPE tables) follow
            for name, buf in model.named_buffers():
                if buf.is_floating_point():
                    mod, _, leaf = name.rpartition(".")
                    setattr(model.get_submodule(mod) if mod else model, leaf, buf.to(dtype))
        return model.eval()

    def linears_to(self, dtype: torch.dtype = torch.float32) -> "TinyAgentLM":
        """Every plain Linear's weight and bias in dtype (after from_pretrained(stored_linears=True))."""
        mapped = MappedWeights()
        for m in self.modules():
            if type(m) in (nn.Linear, Linear) and m.weight.dtype != dtype:
                stored = m.weight.data
                m.to(dtype)
                mapped.drop(stored)             # the file's pages it was read from
        return self
