"""Feeding tokens into the cache: `append` (one pass over the chunk, the serving path), `append_chunked` (the
reference path: CHUNK-token pieces, every piece through all layers) and `_decode_one` (one token, bit-identical to
append_chunked: the eager decode step). All return softcapped logits at each row's last new token.

Each runs the model's one layer body (model.Block.forward) with a cache view of its own (model.CacheView): where the
new tokens sit, how their q / k / v reach the cache and how attention reads it. PrefillView: append's one pass
(query blocks on SDPA; the native kernels for an int8 model on the CPU). ChunkView: append_chunked's explicit
attention against the cache. DecodeView: the same ops for one token at a host-known position, with slices."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model import CacheView, rms_norm, softcap
from . import two_level_head as head4
from .cache import KVCache
from .fused import split_qkv

CHUNK = 64  # append_chunked: max new tokens per row processed at once (bounds the score tensor during prefill)

# Queries per attention block in append(): bounds the mask / key copies of a long prefill. Attention itself is fused
# (scaled_dot_product_attention), so this is about speed: CPU likes small blocks, GPUs fewer launches.
QUERY_BLOCK = {"cpu": 128}
QUERY_BLOCK_DEFAULT = 1024
KEY_ROUND = 256        # GPUs: global key ranges rounded up to this (stable shapes; the extra keys are masked)
EXPLICIT_ATTN_MAX = 256   # GPUs: chunks up to this many tokens use matmul + softmax attention (no per-shape kernels)


def _rope_cs(x, cos, sin):
    """_rope_pos with the cos/sin rows already gathered (and cast to x's dtype): same values, fewer kernels."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _rope_pos(rope, x, pos):
    """x: (B, H, C, D); pos: (B, C) per-row absolute positions."""
    return _rope_cs(x, rope.cos[pos][:, None].to(x.dtype), rope.sin[pos][:, None].to(x.dtype))


def _softcap(model, x):
    """Logits (fp32) at the hidden states x: final norm, head, softcap (none when the config has it off)."""
    h = rms_norm(x, model.cfg.norm_eps)
    if head4.active(model.head):            # the two-level head: the int4 copy's scan, its best rescored from int8
        return softcap(rescore_top(model.head, h, head4.scan(model.head, h), head4.RESCORE_K), model.cfg.logit_softcap)
    logits = model.head(h).float()
    if not model.cfg.is_tinyagent:
        logits = rescore_top(model.head, h, logits)
    return softcap(logits, model.cfg.logit_softcap)


RESCORE_K = 16   # head candidates recomputed in fp32 (rescore_top)


def rescore_top(head, h, logits, k: int = RESCORE_K):
    """A quantized head (int8 / bf16 weights) returns bf16 logits: steps of 0.125 near 25, coarser than the margin
    between a large vocabulary's top tokens (SmolLM2's first token for "the capital of France": 0.08). So the k best
    candidates are recomputed in fp32 from their weight rows against the fp32 hidden state h (B, d) and written
    back into logits (B, V): greedy and the sampler's head then see the quantized weights' exact logits. Only the
    llama family's configs (TinyAgentLM's softcapped logits keep the step they were tuned with). A full-precision
    head returns logits unchanged."""
    w = getattr(head, "qweight", None)
    if w is None and (getattr(head, "weight", None) is None or head.weight.dtype == torch.float32):
        return logits
    h2 = h.reshape(-1, h.size(-1)).float()
    lg = logits.view(h2.size(0), -1)
    ids = lg.topk(min(k, lg.size(-1)), dim=-1).indices                          # (B, k)
    rows = (w[ids].float() * head.scale[ids].float()[..., None]) if w is not None else head.weight[ids].float()
    exact = torch.bmm(rows, h2[:, :, None])[..., 0]                              # (B, k, d) @ (B, d, 1)
    if getattr(head, "bias", None) is not None:
        exact = exact + head.bias.float()[ids]
    return lg.scatter(1, ids, exact).view_as(logits)


def _heads(qkn, t):
    """qkn over a projection's rows t (B, C, n, D), as heads (B, n, C, D): the bits of qkn on the transposed view (the
    norm is per row of D), which torch would first copy to norm (2x the time for a full-config q at 200 tokens)."""
    return qkn(t).transpose(1, 2)


def _engram_addrs(model, tokens, lens, idx):
    """{block: (B, C, n_tables)} for the chunk idx (B, C) starting at per-row positions lens (B,), reading the
    n_max - 1 previous tokens from tokens (B, max_len + 1) (token id 0 before position 0)."""
    if not model.engram_modules():
        return {}
    n1 = max(model.cfg.engram_orders) - 1
    prev_pos = lens[:, None] + torch.arange(-n1, 0, device=idx.device)[None, :]
    prev = torch.where(prev_pos >= 0, tokens.gather(1, prev_pos.clamp_min(0)), torch.zeros_like(prev_pos))
    return model.engram_addresses(idx, prev)


def _check_room(cache: KVCache, n_cpu, rows):
    lens_cpu = cache.lens_cpu if rows is None else cache.lens_cpu[rows]
    if int((lens_cpu + n_cpu).max()) > cache.max_len:
        raise RuntimeError(f"KV cache full: {int(lens_cpu.max())} + {int(n_cpu.max())} tokens exceed its "
                           f"{cache.max_len} positions")


def _rows(cache: KVCache, B: int, dev, rows):
    """(rows on the device, a selector for cache tensors, lens, lens_cpu): views for the full batch, gathered copies
    of just those rows for a sub-batch."""
    if rows is None:
        return torch.arange(B, device=dev), (lambda t: t), cache.lens, cache.lens_cpu
    rdev = rows.to(dev, non_blocking=True)
    return rdev, (lambda t: t[rdev]), cache.lens[rdev], cache.lens_cpu[rows]


class _Layout:
    """Where a right-padded chunk's tokens go. Row b's real tokens are the first n[b] of C; padding writes land in
    the scratch slots (global position max_len, ring slot W), so no boolean filtering is needed."""

    def __init__(self, cache: KVCache, n, n_cpu, lens, lens_cpu, rdev, C: int):
        W = cache.cfg.swa_window
        ar = torch.arange(C, device=n.device)
        self.valid = ar[None, :] < n[:, None]                                    # (B, C)
        self.pos = lens[:, None] + ar[None, :]                                   # (B, C) absolute positions
        self.new_lens, self.new_lens_cpu = lens + n, lens_cpu + n_cpu
        self.bidx = rdev[:, None].expand(-1, C)
        self.gpos = torch.where(self.valid, self.pos, torch.full_like(self.pos, cache.max_len))
        self.keep = self.valid & (self.pos >= (self.new_lens[:, None] - W))      # the last W real tokens
        self.slot = torch.where(self.keep, self.pos % max(W, 1), torch.full_like(self.pos, W))   # W 0: none kept


def _commit(cache: KVCache, lay: _Layout, rows, rdev) -> None:
    """Record the chunk's ring positions and the new lengths (in place: a captured decode graph holds these)."""
    cache.lpos[lay.bidx, lay.slot] = torch.where(lay.keep, lay.pos, torch.full_like(lay.pos, -1))
    if rows is None:
        cache.lens.copy_(lay.new_lens)
        cache.lens_cpu.copy_(lay.new_lens_cpu)
    else:
        cache.lens[rdev] = lay.new_lens
        cache.lens_cpu[rows] = lay.new_lens_cpu


def _attn_explicit(q, K, V, m, Hk):
    """scaled_dot_product_attention(q, K, V, attn_mask=m, enable_gqa=True) as matmul + softmax (fp32 softmax).
    q (B, H, n, D), K/V (B, Hk, L, D), m (B, 1, n, L) bool."""
    B, H, n, D = q.shape
    rep = H // Hk
    s = (q.reshape(B, Hk, rep * n, D) @ K.transpose(-1, -2)).float().view(B, Hk, rep, n, -1)
    s = (s * (1.0 / math.sqrt(D))).masked_fill_(~m[:, :, None], float("-inf"))
    p = torch.softmax(s, dim=-1).to(V.dtype).view(B, Hk, rep * n, -1)
    return (p @ V).view(B, H, n, D)


def _block_size(dev, C: int, block=None) -> int:
    qb = int(block) if block else QUERY_BLOCK.get(torch.device(dev).type, QUERY_BLOCK_DEFAULT)
    return max(1, min(qb, C))


@torch.no_grad()
def append(model, cache: KVCache, idx: torch.Tensor, n_new, rows=None, block=None,
           pad_shapes: bool | None = None) -> torch.Tensor:
    """Feed a right-padded chunk idx (B, C); row b has n_new[b] real tokens (0 = untouched).
    n_new may be a CPU tensor/list (preferred: avoids a device sync). Returns logits (B, V) at
    each row's last real token (unchanged garbage for rows with n_new == 0).
    rows: optional cache rows that idx refers to (a sub-batch, e.g. only rows that need prefill);
    by default idx covers all cache rows in order.

    One pass over all new tokens, like the training forward: every projection and MLP runs once over the whole
    chunk; attention is fused (scaled_dot_product_attention) and split into query blocks (block: queries per block,
    default QUERY_BLOCK), each attending to just the keys it can see: global keys up to its last position and the
    band of local keys of its windows. Same results as append_chunked up to float rounding (softmax/reduction
    order); same cache contents and layout.
    pad_shapes (EngineOptions.pad_shapes): pad the chunk to stable shapes; None: on GPUs only."""
    n_cpu = torch.as_tensor(n_new, dtype=torch.long).cpu()
    B, C = idx.shape
    if rows is not None:
        rows = torch.as_tensor(rows, dtype=torch.long).cpu()
    _check_room(cache, n_cpu, rows)
    width = int(n_cpu.max()) if n_cpu.numel() else 0
    if width == 0:
        return None
    idx = idx[:, :width]
    sf = cache.static_feed
    if sf is not None and rows is None and B == 1 and width <= sf.max_c:
        return sf.feed(idx, width)
    key_round = 1
    if pad_shapes if pad_shapes is not None else idx.device.type != "cpu":
        # GPUs: pad the chunk to a power of two and round the global key range up, so attention / GEMM shapes repeat.
        # Padding is masked out and written to the scratch slots, like any right padding.
        Cp = max(16, 1 << (width - 1).bit_length())
        if Cp > width:
            idx = torch.cat([idx, idx.new_zeros(B, Cp - width)], dim=1)
        key_round = KEY_ROUND
    view = PrefillView(model, cache, idx, n_cpu, rows, block, key_round)
    x = model.run_blocks(model.embed(idx), view, view.addrs)
    _commit(cache, view.lay, rows, view.rdev)
    return _softcap(model, x[torch.arange(B, device=idx.device), (view.n - 1).clamp_min(0)])


class PrefillView(CacheView):
    """append's view of a right-padded chunk idx (B, C): every row's new tokens in one pass. The chunk's tokens, and
    its K/V as each layer makes them, go into the cache; attention runs in query blocks (SDPA, or matmul + softmax
    for short chunks on GPUs), each against the global keys up to its last position and the band of local keys of
    its windows (the ring's last W entries, then the chunk's), or, for an int8 model prefilling one row of an fp32
    cache on native kernels, in tc_prefill_attn (each query against only its keys, q / K / V rotated by
    tc_rope_heads). A model with fused q/k/v projections on the native int8 GEMM runs them as one GEMM."""

    def __init__(self, model, cache: KVCache, idx, n_cpu, rows=None, block=None, key_round=1):
        c = model.cfg
        B, C = idx.shape
        dev = idx.device
        Hk, D, W = c.n_kv_heads, c.head_dim, c.swa_window
        self.cache, self.rows, self.W, self.dt = cache, rows, W, cache.attn_dtype      # fp16 cache: fp32 attention
        n = self.n = n_cpu.to(dev, non_blocking=True)
        rdev, sel, lens, lens_cpu = _rows(cache, B, dev, rows)
        self.rdev, self.sel = rdev, sel
        lay = self.lay = _Layout(cache, n, n_cpu, lens, lens_cpu, rdev, C)
        valid, pos, new_lens = lay.valid, lay.pos, lay.new_lens
        L0, Lg = int(lens_cpu.max()), int(lay.new_lens_cpu.max())
        self.L0 = L0
        self.addrs = _engram_addrs(model, sel(cache.tokens), lens, idx)
        cache.tokens[lay.bidx, lay.gpos] = idx

        # Local keys in position order: seq[j] = position lens - W + j, i.e. the ring's last W entries (j < W) then
        # the new tokens (j >= W). Query i (position lens + i) sees seq[i+1 .. i+W]: a band, so each query block only
        # needs a slice of it. Masks are the same in every layer: built once.
        qb = _block_size(dev, C, block)
        wpos = lens[:, None] - W + torch.arange(W, device=dev)[None, :]       # (B, W) positions of the ring part
        ring_idx = self.ring_idx = wpos % W
        ring_ok = (wpos >= 0) & (sel(cache.lpos).gather(1, ring_idx) == wpos)  # slot really holds that position
        key_ok = torch.cat([ring_ok, valid], dim=1)                             # (B, W + C)
        self.ring_gather = ring_idx[:, None, :, None].expand(B, Hk, W, D)
        nat = self.nat = _native_attn(model, cache, dev, rows, n_cpu, C)   # the native attention needs no masks
        blocks = []
        for s in range(0, C, qb) if nat is None else ():
            e = min(C, s + qb)
            lg = min(Lg, L0 + e)              # the last global key any query of this block can see
            lg = min(-(-lg // key_round) * key_round, cache.max_len)   # masked beyond the length
            pq = pos[:, s:e, None]
            kpos = torch.arange(lg, device=dev)
            gm = (kpos[None, None, :] <= pq) & (kpos[None, None, :] < new_lens[:, None, None])
            qi = torch.arange(s, e, device=dev)[:, None]
            j = torch.arange(s + 1, e + W, device=dev)[None, :]
            lm = ((j > qi) & (j <= qi + W))[None] & key_ok[:, None, s + 1:e + W]
            m = torch.cat([gm, lm], dim=2)
            m[:, :, 0] |= ~valid[:, s:e]       # padding queries: never an empty row (SDPA would return NaN)
            blocks.append((s, e, lg, m[:, None]))                               # (B, 1, nq, L)
        if not c.has_local:   # no local keys: the masks are the global part alone
            blocks = [(s, e, lg, m[..., :lg]) for s, e, lg, m in blocks]
        self.blocks = blocks
        # short chunks on GPUs (a new turn, a tool result): explicit attention, no SDPA kernel per shape
        self.manual = dev.type != "cpu" and C <= EXPLICIT_ATTN_MAX
        self.fused = _fused_prefill(model, B * C, dev)
        rope, cs = model.rope, {}

        def rot(t):                  # _rope_pos(rope, t, pos), the cos/sin rows gathered once per dtype, not per call
            if t.dtype not in cs:
                cs[t.dtype] = rope.cos[pos][:, None].to(t.dtype), rope.sin[pos][:, None].to(t.dtype)
            return _rope_cs(t, *cs[t.dtype])
        self.rot = rot
        if nat is not None:     # one row, one contiguous run of positions: q, K and V rotated and written by a kernel
            self.spos = torch.where(key_ok, torch.cat([wpos, pos], dim=1), -1)[0].contiguous()   # (W + C): -1 no key
            self.at = slice(L0, L0 + C)
            self.csn = rope.cos[pos][0].contiguous(), rope.sin[pos][0].contiguous()            # (C, D/2) each

    def attend(self, attn, h):
        from . import native
        B, C, _ = h.shape
        li, H, Hk, D, W = attn.layer, attn.n_heads, attn.n_kv_heads, attn.head_dim, self.W
        cache, nat, dt, lay, sel = self.cache, self.nat, self.dt, self.lay, self.sel
        if self.fused is not None:     # one GEMM for q, K and V: the same bits as three (its rows never mix)
            qp, kvp = split_qkv(self.fused[li](h), attn, H, Hk, D)
        else:
            qp, kvp = attn.w_q(h).view(B, C, H, D), None
        q = _heads(attn.qkn, qp)
        # native: rotated and scaled by 1/sqrt(D) in one pass (rope_heads: _rope_cs's bits, then the scaling's)
        q = native.rope_heads(nat, q[0], self.csn, D ** -0.5)[None] if nat is not None else self.rot(q).to(dt)
        if attn.mode == "full":
            group = attn.group
            k, v = kvp["w_kv_global"] if kvp is not None else attn.w_kv_global(h).view(B, C, 2, Hk, D).unbind(2)
            k, v = _heads(attn.qkn, k), v.transpose(1, 2)                           # (B, Hk, C, D) each
            if nat is not None and cache.gk.dtype == dt:
                native.rope_heads(nat, k[0], self.csn, out=cache.gk[group][0, :, self.at])
                native.rope_heads(nat, v[0], None, out=cache.gv[group][0, :, self.at])
            elif nat is not None:          # fp16 cache: rotated as above, rounded to fp16 as the decode step rounds
                cache.gk[group][0, :, self.at] = native.rope_heads(nat, k[0], self.csn)
                cache.gv[group][0, :, self.at] = v[0]
            else:
                k = self.rot(k)
                cache.gk[group][lay.bidx, :, lay.gpos] = k.transpose(1, 2).to(cache.gk.dtype)
                cache.gv[group][lay.bidx, :, lay.gpos] = v.transpose(1, 2).to(cache.gv.dtype)
            lgmax = self.L0 + C if nat is not None else self.blocks[-1][2]
            if self.rows is None:
                self.Kg_all, self.Vg_all = cache.gk[group], cache.gv[group]
            else:
                self.Kg_all = cache.gk[group][self.rdev, :, :lgmax]
                self.Vg_all = cache.gv[group][self.rdev, :, :lgmax]
            if cache.gk.dtype != dt and nat is None:   # fp16: every key so far (the chunk's too) read back rounded
                self.Kg_all, self.Vg_all = self.Kg_all[:, :, :lgmax].to(dt), self.Vg_all[:, :, :lgmax].to(dt)
        Kg_all, Vg_all = self.Kg_all, self.Vg_all
        local = attn.w_kv_local is not None
        if local:
            kl, vl = kvp["w_kv_local"] if kvp is not None else attn.w_kv_local(h).view(B, C, 2, Hk, D).unbind(2)
            kl, vl = _heads(attn.qkn, kl), vl.transpose(1, 2)
            if nat is not None:            # the ring's last W entries, then the chunk's, rotated in place
                seq_k, seq_v = torch.empty(B, Hk, W + C, D), torch.empty(B, Hk, W + C, D)
                seq_k[:, :, :W] = cache.lk[li].index_select(2, self.ring_idx[0])     # one row: its ring slots
                seq_v[:, :, :W] = cache.lv[li].index_select(2, self.ring_idx[0])
                native.rope_heads(nat, kl[0], self.csn, out=seq_k[0, :, W:])
                native.rope_heads(nat, vl[0], None, out=seq_v[0, :, W:])
                kl, vl = seq_k[:, :, W:].to(cache.lk.dtype), seq_v[:, :, W:].to(cache.lv.dtype)
            else:
                kl = self.rot(kl).to(cache.lk.dtype)
                vl = vl.to(cache.lv.dtype)
                seq_k = torch.cat([sel(cache.lk[li]).gather(2, self.ring_gather), kl], dim=2).to(dt)   # (B, Hk,
                seq_v = torch.cat([sel(cache.lv[li]).gather(2, self.ring_gather), vl], dim=2).to(dt)   # W + C, D)
        if nat is not None and Kg_all.dtype != dt and not local:   # an fp16 cache: its rows widened as read (the
            y = native.prefill_attn_h(nat, q[0], Kg_all[0], Vg_all[0], self.L0)[None]   # decode step's reading)
        elif nat is not None:              # int8 with the native kernels: each query against only its keys
            seq = (seq_k[0], seq_v[0], self.spos) if local else None
            if Kg_all.dtype != dt:         # fp16 with a local band (not a default): the rows widened first
                Kg_all, Vg_all = Kg_all[:, :, :self.L0 + C].to(dt), Vg_all[:, :, :self.L0 + C].to(dt)
            y = native.prefill_attn(nat, q[0], Kg_all[0], Vg_all[0], seq, self.L0, W if seq else 0)[None]
        else:
            ys = []
            for s, e, lg, m in self.blocks:
                if not local:
                    Kb, Vb = Kg_all[:, :, :lg], Vg_all[:, :, :lg]
                else:
                    Kb = torch.cat([Kg_all[:, :, :lg], seq_k[:, :, s + 1:e + W]], dim=2)
                    Vb = torch.cat([Vg_all[:, :, :lg], seq_v[:, :, s + 1:e + W]], dim=2)
                if self.manual:
                    ys.append(_attn_explicit(q[:, :, s:e], Kb, Vb, m, Hk))
                else:
                    ys.append(F.scaled_dot_product_attention(q[:, :, s:e], Kb, Vb, attn_mask=m, enable_gqa=True))
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=2)
        if local:
            cache.lk[li][lay.bidx, :, lay.slot] = kl.transpose(1, 2)
            cache.lv[li][lay.bidx, :, lay.slot] = vl.transpose(1, 2)
        return y.transpose(1, 2).reshape(B, C, H * D).to(h.dtype)


def _fused_prefill(model, rows: int, dev):
    """The model's fused q/k/v projections (quantize_cpu's model.fused_qkv) where prefill runs them on the native
    int8 GEMM: each output is fixed by its row of weights and its token alone, so one fused GEMM gives the three
    Linears' bits with one activation rounding and one call. None elsewhere (other GEMMs may block by shape)."""
    fused = getattr(model, "fused_qkv", None)
    if not fused or not hasattr(fused[0], "prefill_kernel"):
        return None
    return fused if fused[0].prefill_kernel(rows, dev.type == "cpu") == "native-gemm" else None


def _native_attn(model, cache: KVCache, dev, rows, n_cpu, C: int):
    """The native kernels for this prefill's attention (native.prefill_attn), or None for SDPA: only an int8 model
    whose prefill runs on the native kernels (its rounding is the int8 step's, recorded with the step's version and
    the kernel path), one row of fp32 (or fp16: read back as fp32) cache on the CPU, every token of the chunk valid, a kernel path whose
    KERNEL_PATHS entry takes prefill's attention (the x86 levels)."""
    from .quant import native_prefill
    if dev.type != "cpu" or cache.gk.dtype not in (torch.float32, torch.float16) or cache.B != 1 or rows is not None \
            or int(n_cpu[0]) != C:
        return None
    if not native_prefill(model):            # False unless its Linears are int8 / int4 (and on the native GEMM)
        return None
    from . import native
    lib = native.load()
    return lib if lib is not None and native.kernel_info().prefill_attn else None


@torch.no_grad()
def append_chunked(model, cache: KVCache, idx: torch.Tensor, n_new, rows=None) -> torch.Tensor:
    """Reference implementation (the earlier serving path, kept for equivalence tests and benches): processes the
    new tokens in CHUNK-token pieces, every piece through all layers. Same arguments and result as append."""
    n_cpu = torch.as_tensor(n_new, dtype=torch.long).cpu()
    B, C = idx.shape
    if rows is not None:
        rows = torch.as_tensor(rows, dtype=torch.long).cpu()
    _check_room(cache, n_cpu, rows)
    out = None
    for s in range(0, C, CHUNK):
        n_sub = (n_cpu - s).clamp(0, CHUNK)
        if int(n_sub.max()) == 0:
            break
        width = int(n_sub.max())
        piece = idx[:, s:s + width]
        view = ChunkView(model, cache, piece, n_sub, rows)
        x = model.run_blocks(model.embed(piece), view, view.addrs)
        _commit(cache, view.lay, rows, view.rdev)
        logits = _softcap(model, x[torch.arange(B, device=idx.device), (view.n - 1).clamp_min(0)])
        out = logits if out is None else torch.where((n_sub > 0).to(out.device)[:, None], logits, out)
    return out


class ChunkView(CacheView):
    """append_chunked's view of one right-padded piece idx (B, C): q / k / v by the model's own Linears
    (Attention.heads), the new K/V scattered into the cache, then grouped-query attention straight against it as
    matmuls: scores over [global keys 0..Lg | the ring's W + 1 slots and the piece's keys], masked, one fp32
    softmax, p @ V."""

    def __init__(self, model, cache: KVCache, idx, n_cpu, rows=None):
        c = model.cfg
        B, C = idx.shape
        dev = idx.device
        W = c.swa_window
        self.cache, self.rows = cache, rows
        n = self.n = n_cpu.to(dev, non_blocking=True)
        rdev, sel, lens, lens_cpu = _rows(cache, B, dev, rows)
        self.rdev, self.sel = rdev, sel
        lay = self.lay = _Layout(cache, n, n_cpu, lens, lens_cpu, rdev, C)
        valid, pos, new_lens = lay.valid, lay.pos, lay.new_lens
        Lg = self.Lg = int(lay.new_lens_cpu.max())
        self.addrs = _engram_addrs(model, sel(cache.tokens), lens, idx)
        cache.tokens[lay.bidx, lay.gpos] = idx
        kpos = torch.arange(Lg, device=dev)
        gmask = (kpos[None, None, :] <= pos[:, :, None]) & (kpos[None, None, :] < new_lens[:, None, None])  # (B,C,Lg)
        lpos_all = torch.cat([sel(cache.lpos), torch.where(valid, pos, torch.full_like(pos, -1))], dim=1)  # (B,W+1+C)
        lmask = (lpos_all[:, None, :] >= 0) & (lpos_all[:, None, :] <= pos[:, :, None]) & \
                (pos[:, :, None] - lpos_all[:, None, :] < W)
        mask = torch.cat([gmask, lmask], dim=2) if c.has_local else gmask
        self.mask = mask[:, None, None]                                          # (B, 1, 1, C, L)
        self.neg = torch.finfo(torch.float32).min / 2
        self.scale = 1.0 / math.sqrt(c.head_dim)
        rope = model.rope
        self.rot = lambda t: _rope_pos(rope, t, pos)

    def attend(self, attn, h):
        B, C, _ = h.shape
        cache, lay, sel, Lg = self.cache, self.lay, self.sel, self.Lg
        li, group, H, Hk, D = attn.layer, attn.group, attn.n_heads, attn.n_kv_heads, attn.head_dim
        rep = H // Hk
        q, glob, loc = attn.heads(h, self.rot)
        if glob is not None:
            k, v = glob
            cache.gk[group][lay.bidx, :, lay.gpos] = k.transpose(1, 2).to(cache.gk.dtype)
            cache.gv[group][lay.bidx, :, lay.gpos] = v.transpose(1, 2).to(cache.gv.dtype)
        if loc is not None:
            kl, vl = loc[0].to(cache.lk.dtype), loc[1].to(cache.lv.dtype)
        # grouped-query attention straight against the cache: queries (B, Hk, rep*C, D)
        adt = cache.attn_dtype                                                  # fp16 cache: read back as fp32
        q2 = q.to(adt).reshape(B, Hk, rep * C, D)
        if self.rows is None:
            Kg, Vg = cache.gk[group][:, :, :Lg].to(adt), cache.gv[group][:, :, :Lg].to(adt)
        else:
            Kg, Vg = cache.gk[group][self.rdev, :, :Lg].to(adt), cache.gv[group][self.rdev, :, :Lg].to(adt)
        s = q2 @ Kg.transpose(-1, -2)
        if loc is not None:
            Kl = torch.cat([sel(cache.lk[li]), kl], dim=2).to(adt)              # (B, Hk, W+1+C, D) (small)
            Vl = torch.cat([sel(cache.lv[li]), vl], dim=2).to(adt)
            s = torch.cat([s, q2 @ Kl.transpose(-1, -2)], dim=-1)
        s = s.float() * self.scale
        s = s.view(B, Hk, rep, C, -1).masked_fill(~self.mask, self.neg)
        p = torch.softmax(s, dim=-1).to(Vg.dtype).view(B, Hk, rep * C, -1)
        y = p[..., :Lg] @ Vg + p[..., Lg:] @ Vl if loc is not None else p @ Vg   # (B, Hk, rep*C, D)
        if loc is not None:
            cache.lk[li][lay.bidx, :, lay.slot] = kl.transpose(1, 2)
            cache.lv[li][lay.bidx, :, lay.slot] = vl.transpose(1, 2)
        return y.view(B, H, C, D).transpose(1, 2).reshape(B, C, H * D).to(h.dtype)


def _decode_one(model, cache: KVCache, idx, L: int):
    """Append one token (idx (1, 1), device) to row 0 at host-known position L; returns softcapped logits (1, V).
    Exactly the ops and shapes append_chunked runs for a single token (bit-identical logits), minus its general
    batching/masking work (DecodeView: slices instead of scatter writes, the step mask built once). The eager decode
    step, and the reference every other step is tested against (engine/steps.py)."""
    view = DecodeView(model, cache, idx, L)
    x = model.run_blocks(model.embed(idx), view, view.addrs)
    if model.cfg.swa_window:
        cache.lpos[0, view.slot] = L
    cache.lens[0] += 1
    cache.lens_cpu[0] += 1
    return _softcap(model, x[:, 0])


class DecodeView(CacheView):
    """_decode_one's view of one token at position L of row 0: ChunkView's ops and shapes for C = 1, the cache read
    and written by slices."""

    def __init__(self, model, cache: KVCache, idx, L: int):
        c = model.cfg
        dev = idx.device
        W = c.swa_window
        self.cache, self.L, self.dt = cache, L, cache.attn_dtype          # fp16 cache: fp32 attention
        p2 = torch.full((1, 1), L, device=dev, dtype=torch.long)
        self.addrs = _engram_addrs(model, cache.tokens[:1], p2[0], idx)
        cache.tokens[0, L] = idx[0, 0]
        self.slot = L % W if W else 0
        lp = torch.cat([cache.lpos[0], p2[0]])                                 # (W+2,)
        mask = torch.ones(L + 1, dtype=torch.bool, device=dev)
        if c.has_local:
            mask = torch.cat([mask, (lp >= 0) & (lp <= L) & (L - lp < W)])
        self.inv = ~mask.view(1, 1, 1, 1, -1)
        self.neg = torch.finfo(torch.float32).min / 2
        self.scale = 1.0 / math.sqrt(c.head_dim)
        rope = model.rope
        self.rot = lambda t: _rope_pos(rope, t, p2)

    def attend(self, attn, h):
        cache, L, dt, slot = self.cache, self.L, self.dt, self.slot
        li, group, H, Hk, D = attn.layer, attn.group, attn.n_heads, attn.n_kv_heads, attn.head_dim
        rep = H // Hk
        q, glob, loc = attn.heads(h, self.rot)
        if glob is not None:
            k, v = glob
            cache.gk[group][:, :, L] = k[:, :, 0].to(cache.gk.dtype)
            cache.gv[group][:, :, L] = v[:, :, 0].to(cache.gv.dtype)
            self.Kg, self.Vg = cache.gk[group][:, :, :L + 1].to(dt), cache.gv[group][:, :, :L + 1].to(dt)
        Kg, Vg = self.Kg, self.Vg
        q2 = q.to(dt).reshape(1, Hk, rep, D)
        s = q2 @ Kg.transpose(-1, -2)
        if loc is not None:
            kl, vl = loc[0].to(cache.lk.dtype), loc[1].to(cache.lv.dtype)
            Kl = torch.cat([cache.lk[li][:1], kl], dim=2).to(dt)
            Vl = torch.cat([cache.lv[li][:1], vl], dim=2).to(dt)
            s = torch.cat([s, q2 @ Kl.transpose(-1, -2)], dim=-1)
        s = s.float() * self.scale
        s = s.view(1, Hk, rep, 1, -1).masked_fill(self.inv, self.neg)
        p = torch.softmax(s, dim=-1).to(Vg.dtype).view(1, Hk, rep, -1)
        y = p[..., :L + 1] @ Vg + p[..., L + 1:] @ Vl if loc is not None else p @ Vg
        if loc is not None:
            cache.lk[li][:1, :, slot] = kl[:, :, 0]
            cache.lv[li][:1, :, slot] = vl[:, :, 0]
        return y.view(1, H, 1, D).transpose(1, 2).reshape(1, 1, H * D).to(h.dtype)
