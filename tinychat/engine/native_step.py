"""The int8 decode step in native kernels (engine/native.c through engine/native.py): `_NativeStep`, the kernels'
view of an int8 model (raw weight pointers, fp32 / int8 buffers, the Engram hashing tables, tc_step's plan), and
`_decode_native`, the native path of the lean CPU step (cpu_step.py, the PyTorch step it must equal, builds it)."""
from __future__ import annotations

import ctypes
import time
import weakref

import torch

from .cache import KVCache
from . import page_drop
from .native import DROP_RANGES
from .native import act_scratch as native_act_scratch
from .quant import Int8Linear
from .quant_int4 import Int4Linear
from .threads import ThreadTuner


def _no_native():
    return None


def layer_formats(model, fs) -> list[int] | None:
    """The native formats of each layer's Linears, native_q4.h's TC_F_* masks (one per layer): per kind (the fused
    QKV, w_o, up, down) its bit set where the layer's is an Int4Linear, clear where it is an Int8Linear; None where
    some layer Linear is something else. The llama step reads them per layer (--quant int4's per-layer mix)."""
    masks = []
    for li, b in enumerate(model.blocks):
        mask = 0
        for bit, m in zip((1, 2, 4, 8), (fs.qkv[li], b.attn.w_o, b.mlp.up, b.mlp.down)):
            if type(m) is Int4Linear:
                mask |= bit
            elif type(m) is not Int8Linear:
                return None
        masks.append(mask)
    return masks


def layer_format(model, fs) -> int | None:
    """The one TC_F_* mask of a model whose layers all have the same formats (layer_formats), None where they differ
    (tc_step's plan has one mask for every layer: such a model runs the PyTorch step) or some Linear is neither."""
    masks = layer_formats(model, fs)
    return masks[0] if masks and len(set(masks)) == 1 else None


class _PointerView:
    """What the native steps share: raw pointers into a model's weights, so a deep copy or a pickle of one is None
    (a copy runs the PyTorch step), and _ptrs, an Int8Linear's pointers with its fp32 scales kept alive here."""

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return (_no_native, ())

    def _ptrs(self, lin) -> tuple[int, int, int]:
        """(int8 weights, fp32 scales, rows) of an Int8Linear (the fused QKV: out_features 1); of an Int4Linear
        (packed int4 weights, fp16 group scales, rows: native_q4_layout.h)."""
        if type(lin) is Int4Linear:
            return lin.qweight.data_ptr(), lin.scale.data_ptr(), lin.qweight.size(0)
        s = lin.scale.float().contiguous()
        self._keep.append(s)
        return lin.qweight.data_ptr(), s.data_ptr(), lin.qweight.size(0)


class _NativeStep(_PointerView):
    """The native kernels' view of an int8 model: per layer the raw pointers of the int8 weights and their fp32
    scales (kept alive here), and the fp32 / int8 buffers the kernels read and write in place."""

    @classmethod
    def build(cls, model, fs):
        from . import native
        heads_int8 = isinstance(fs.head, Int8Linear)
        lins = [*fs.qkv, *(m for b in model.blocks for m in (b.attn.w_o, b.mlp.up, b.mlp.down))]
        if not (layer_format(model, fs) is not None and heads_int8 and isinstance(model.embed, torch.nn.Embedding)
                and all(m.bias is None and getattr(m, "in_gain", None) is None for m in lins)
                and fs.head.bias is None):
            return None
        lib = native.load()
        return None if lib is None else cls(model, fs, lib)

    def __init__(self, model, fs, lib):
        c = model.cfg
        self.lib = lib
        self._keep = []
        w = self._ptrs
        self.wfmt = layer_format(model, fs)     # the layers' formats (native_q4.h's TC_F_* mask); the head: int8
        self.qkv = [w(m) for m in fs.qkv]
        self.wo = [w(b.attn.w_o) for b in model.blocks]
        self.up = [w(b.mlp.up) for b in model.blocks]
        self.down = [w(b.mlp.down) for b in model.blocks]
        self.head = w(fs.head)
        self.has_engram = [b.engram is not None for b in model.blocks]
        d, hid, HD = c.d_model, c.mlp_hidden, c.n_heads * c.head_dim
        self.x = torch.empty(d)
        self.h = torch.empty(d)
        self.xq = native_act_scratch(lib, max(d, hid, HD))   # int8 activations, block scales (native_q8.h)
        self.u = torch.empty(hid)
        self.y = torch.empty(HD)
        self.qkvbuf = torch.empty(max(n for _, _, n in self.qkv))
        self.logits = torch.empty(1, c.vocab_size)
        self.sc = torch.empty(0)               # attention scores scratch (threads * H / Hk * (max_len + 1 + W))
        self.tuner = ThreadTuner()             # threads per step, by measurement (threads.py)
        self.p = {k: getattr(self, k).data_ptr() for k in ("x", "h", "xq", "u", "y", "qkvbuf", "logits")}
        rows, group = [], -1
        for li, b in enumerate(model.blocks):               # tc_layers' table (native.py: TAB_COLS per layer)
            full = b.attn.mode == "full"
            group += full
            rows.append([*self.qkv[li], int(full), group, *self.wo[li][:2], *self.up[li][:2], *self.down[li][:2]])
        self.tab = torch.tensor(rows, dtype=torch.int64)
        starts = [0] + [i for i, e in enumerate(self.has_engram) if e and i > 0]
        self.segments = list(zip(starts, starts[1:] + [len(model.blocks)]))   # [start, end): Engram only at a start
        self.engrams = [(i, b.engram.orders, b.engram.heads, b.engram.size, b.engram.mult.tolist(),
                         b.engram.offset.tolist()) for i, b in enumerate(model.blocks) if b.engram is not None]
        self.n1 = max(c.engram_orders) - 1 if self.engrams else 0
        # tc_engram per Engram block (fp32 table, int8 w_v / w_k), else None: the block's PyTorch forward
        self.engram_native = {}
        ne = 1                                              # the widest Engram input (tables x dim)
        for i, b in enumerate(model.blocks):
            en = b.engram
            if en is None:
                continue
            ne = max(ne, en.table.weight.size(1) * len(en.orders) * en.heads)
            ok = (en.table.weight.dtype == torch.float32 and en.table.weight.is_contiguous()
                  and type(en.w_v) is Int8Linear and type(en.w_k) is Int8Linear
                  and en.w_v.bias is None and en.w_k.bias is None)
            self.engram_native[i] = (en.table.weight, *w(en.w_v)[:2], *w(en.w_k)[:2]) if ok else None
        self.e, self.ek, self.ev = torch.empty(ne), torch.empty(d), torch.empty(d)
        self.exq = native_act_scratch(lib, ne)
        self._cid_map = model.cid_map
        self._cid: list[int] = []
        self._cid_version = -1
        # per Engram block: its addresses' buffer (1, 1, n) and a numpy view of it (filled without a tensor op)
        self._addr_buf = {}
        for li, orders, heads, *_ in self.engrams:
            t = torch.zeros(1, 1, len(orders) * heads, dtype=torch.int64)
            self._addr_buf[li] = (t, t.numpy().reshape(-1))
        self.x_np = self.x.numpy()
        self._embed = (None, None)             # (the embedding weight, its numpy view when fp32 on the CPU)
        self._attn_ok = (lambda: None, False)  # (a weak reference to the cache, whether tc_attn can read it)
        self._plan = (lambda: None, None, None)   # (a weak reference to the cache, its key, tc_step's plan)
        self.drops = page_drop.step_table(model, fs)      # (table, what it keeps alive) or None: no drops
        self.drop_p = 0 if self.drops is None else self.drops[0].data_ptr()

    def drop_row(self, row: int) -> None:
        """Hand back the pages of the drop table's row (a layer, or the head: row n_layers) when there is one."""
        if self.drops is not None:
            self.lib.tc_drop(self.drops[0][row].data_ptr(), DROP_RANGES)

    def embed_row(self, model, tok: int) -> None:
        """x = the token's embedding row (a numpy copy for an fp32 table: no tensor op)."""
        wt = model.embed.weight
        if self._embed[0] is not wt:
            ok = wt.dtype == torch.float32 and wt.device.type == "cpu" and wt.is_contiguous()
            self._embed = (wt, wt.detach().numpy() if ok else None)
        e = self._embed[1]
        if e is not None:
            self.x_np[:] = e[tok]
        else:
            self.x.copy_(wt[tok])

    def plan(self, model, cache) -> int | None:
        """The address of tc_step's plan for this cache (native.TcPlan; rebuilt when the cache or one of its tensors,
        the attention scratch, the Engram id map or the embedding is another tensor), or None where tc_step does not
        apply: a cache tc_attn cannot read, an Engram block without int8 weights, Engram orders past
        native.TC_MAXN, a non-fp32 embedding."""
        key = (self.sc.data_ptr(), model.cid_map.data_ptr(), model.embed.weight.data_ptr(),
               *(t.data_ptr() for t in (cache.lk, cache.lv, cache.gk, cache.gv, cache.lpos, cache.tokens, cache.lens,
                                        cache.lens_cpu)))   # raw pointers: a replaced tensor means a new plan
        ref, k, built = self._plan
        if ref() is cache and k == key:
            return built
        built = self._build_plan(model, cache)
        self._plan = (weakref.ref(cache), key, built)
        return built

    def _build_plan(self, model, cache) -> int | None:
        from .native import TC_MAXN, TcPlan, TcSeg
        c = model.cfg
        emb, cid = model.embed.weight, model.cid_map
        if not (self.attn_ok(cache, model) and emb.dtype == torch.float32 and emb.is_contiguous()
                and cid.dtype == torch.int64 and cid.is_contiguous() and self.n1 <= TC_MAXN
                and all(self.engram_native.get(li) is not None and max(orders) <= TC_MAXN
                        for li, orders, *_ in self.engrams)):
            return None
        keep = []                                             # what the plan points into
        eng = {li: (orders, heads, size, mult, offset) for li, orders, heads, size, mult, offset in self.engrams}
        segs = (TcSeg * len(self.segments))()
        for s, (a, b) in zip(segs, self.segments):
            qp, sp, nq = self.qkv[a]
            s.a, s.b, s.qkv_q, s.qkv_s, s.qkv_n = a, b, qp, sp, nq
            if a in eng:
                orders, heads, size, mult, offset = eng[a]
                rows, t = [], 0
                for n in orders:                              # as engram_addrs: per order, per head
                    for _ in range(heads):
                        rows.append([n, offset[t], *mult[t][:n], *[0] * (TC_MAXN - n)])
                        t += 1
                hash_ = torch.tensor(rows, dtype=torch.int64)
                table, vq, vs, kq, ks = self.engram_native[a]
                addrs = self._addr_buf[a][0]
                keep += [hash_, table]
                s.engram, s.table, s.edim, s.vq, s.vs, s.kq, s.ks = 1, table.data_ptr(), table.size(1), vq, vs, kq, ks
                s.n_tab, s.size, s.hash, s.addrs = len(rows), size, hash_.data_ptr(), addrs.data_ptr()
                s.e, s.exq, s.ek, s.ev = (t.data_ptr() for t in (self.e, self.exq, self.ek, self.ev))
        p = TcPlan(d=c.d_model, hidden=c.mlp_hidden, H=c.n_heads, Hk=c.n_kv_heads, D=c.head_dim, W=c.swa_window,
                   gstride=cache.max_len + 1, V=self.head[2], n_seg=len(self.segments), n1=self.n1, wfmt=self.wfmt)
        for name in ("x", "h", "xq", "y", "u", "logits", "sc"):
            setattr(p, name, getattr(self, name).data_ptr())
        p.tab, p.qkv, p.embed, p.cid = self.tab.data_ptr(), self.qkvbuf.data_ptr(), emb.data_ptr(), cid.data_ptr()
        p.cos_, p.sin_ = model.rope.cos.data_ptr(), model.rope.sin.data_ptr()
        for name in ("lk", "lv", "gk", "gv", "lpos", "tokens", "lens", "lens_cpu"):
            setattr(p, name, getattr(cache, name).data_ptr())
        p.head_q, p.head_s = self.head[0], self.head[1]
        p.segs = ctypes.addressof(segs)
        p.drop = self.drop_p
        self._plan_keep = (p, segs, keep)
        return ctypes.addressof(p)

    def attn_ok(self, cache, model) -> bool:
        """tc_attn reads this cache directly: fp32, batch 1, contiguous (as the RoPE tables). Asked once per cache."""
        if self._attn_ok[0]() is not cache:
            ok = cache.gk.dtype == torch.float32 and cache.B == 1 and all(t.is_contiguous() for t in (
                cache.lk, cache.lv, cache.gk, cache.gv, cache.lpos, model.rope.cos, model.rope.sin))
            self._attn_ok = (weakref.ref(cache), ok)
        return self._attn_ok[1]

    def engram_addrs(self, tokens: list[int]) -> dict[int, torch.Tensor]:
        """_engram_addrs for one new token in Python ints (a few dozen multiplies and XORs instead of ~30 tensor
        ops): tokens = the n_max - 1 previous ids (0 before position 0) then the new one. Same values: products of
        ids below 2^31 stay exact, addresses are non-negative, so % equals torch.remainder. The returned tensors
        are this step's buffers: valid until the next call."""
        cm = self._cid_map
        if cm._version != self._cid_version:             # set_token_strings after quantizing: re-read
            self._cid, self._cid_version = cm.tolist(), cm._version
        c = [self._cid[t] for t in tokens]
        out = {}
        for li, orders, heads, size, mult, offset in self.engrams:
            a, t = [], 0
            for n in orders:
                for _ in range(heads):
                    acc, m = 0, mult[t]
                    for j in range(n):
                        acc ^= c[-1 - j] * m[j]
                    a.append(acc % size + offset[t])
                    t += 1
            buf, view = self._addr_buf[li]
            view[:] = a
            out[li] = buf
        return out


def _decode_native(model, cache: KVCache, tok: int, L: int, fs, nat: _NativeStep, step_in_c: bool = True):
    """_decode_fast in native kernels (engine/native.py). With an fp32 cache, one tc_layers call per run of layers
    between Engram blocks (per layer: tc_attn = q/k norms, RoPE, the cache writes, one softmax over [global | local]
    keys; tc_tail = w_o + residual, norm, MLP + residual, next norm, next fused QKV), tc_engram for an Engram block,
    the softcap in C; when every piece is native (nat.plan), all of that is one tc_step call (step_in_c), else the
    calls are made from here. Other caches (bf16): PyTorch attention ops between tc_tail calls. Same math as
    _decode_fast; the activations enter the int8 products as int8 in blocks of 32 with an fp32 scale each
    (native.quant8_ref) instead of bf16."""
    c = model.cfg
    H, Hk, D, W = c.n_heads, c.n_kv_heads, c.head_dim, c.swa_window
    rep = H // Hk
    d, hid = c.d_model, c.mlp_hidden
    vnorm = torch.linalg.vector_norm
    lib, P = nat.lib, nat.p
    ceiling = nat.tuner.ceiling()
    nt = nat.tuner.threads(ceiling)
    nat.tuner.sync_torch(nt, ceiling)                        # the sampler's torch ops at the step's count too
    t0 = time.perf_counter()
    inv = fs.inv_sqrt_d
    native_attn = nat.attn_ok(cache, model)
    if native_attn:                                          # attention scores scratch: per thread, all positions
        need = max(nt, ceiling) * (H // Hk) * (cache.max_len + 1 + W)      # a group's heads at once
        if nat.sc.numel() < need:
            nat.sc = torch.empty(need)
        plan = nat.plan(model, cache) if step_in_c else None
        if plan is not None:                                 # the whole step in one native call
            lib.tc_step(plan, tok, L, inv, c.logit_softcap, nt)
            nat.tuner.record(time.perf_counter() - t0, ceiling)
            return nat.logits.clone()
    # the bookkeeping through numpy views (cache.host): no tensor op, so the GIL stays with this thread
    toks_h, lpos_h, lens_h, lens_cpu_h = cache.host()
    addrs = {}
    if nat.engrams:
        n1 = nat.n1
        prev = toks_h[0, max(0, L - n1):L].tolist()
        addrs = nat.engram_addrs([0] * (n1 - len(prev)) + prev + [tok])
    toks_h[0, L] = tok
    slot = L % W
    lpos_h[0, slot] = L
    kdt = cache.gk.dtype
    if not native_attn:                                      # the PyTorch attention ops (e.g. a bf16 cache)
        lp = cache.lpos[0, :W]
        ok = (lp >= 0) & (L - lp < W)
        lbias = None if bool(ok.all()) else torch.zeros(W).masked_fill_(~ok, float("-inf"))
        cs, sn = model.rope.cos[L], model.rope.sin[L]
        R = fs.eye * torch.cat([cs, cs]) + fs.P * torch.cat([sn, sn])
        lk, lv, gk, gv = cache.lk[:, 0], cache.lv[:, 0], cache.gk[:, 0], cache.gv[:, 0]
        lk_new, lv_new, gk_new, gv_new = lk[:, :, slot], lv[:, :, slot], gk[:, :, L], gv[:, :, L]
        Vl, Vg_all = lv[:, :, :W], gv[:, :, :L + 1]
        KlT, KgT_all = lk[:, :, :W].transpose(-1, -2), gk[:, :, :L + 1].transpose(-1, -2)
        y3 = nat.y.view(Hk, rep, D)
    x = nat.x
    nat.embed_row(model, tok)
    if native_attn:
        half = D // 2
        cosp = model.rope.cos.data_ptr() + L * half * 4
        sinp = model.rope.sin.data_ptr() + L * half * 4
        lkp, lvp, gkp, gvp = (t.data_ptr() for t in (cache.lk, cache.lv, cache.gk, cache.gv))
        lposp, scp = cache.lpos.data_ptr(), nat.sc.data_ptr()
        for a, b in nat.segments:                            # one tc_layers call per run of layers
            blk = model.blocks[a]
            if blk.engram is not None:
                en = nat.engram_native[a]
                if en is None:
                    x.add_(blk.engram(x[None, None], addrs[a])[0, 0])
                else:
                    table, vq, vs, kq, ks = en
                    ad = addrs[a]
                    lib.tc_engram(P["x"], table.data_ptr(), ad.data_ptr(), ad.size(-1), table.size(1), vq, vs, kq,
                                  ks, d, nat.e.data_ptr(), nat.exq.data_ptr(), nat.ek.data_ptr(),
                                  nat.ev.data_ptr(), nt)
            qp, sp, nq = nat.qkv[a]
            lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, qp, sp, P["qkvbuf"], nq, d, nat.wfmt & 1, nt)
            lib.tc_layers(nat.tab.data_ptr(), a, b, P["x"], P["h"], P["xq"], inv, P["qkvbuf"], P["y"], P["u"], hid, d,
                          H, Hk, D, cosp, sinp, lkp, lvp, W, gkp, gvp, cache.max_len + 1, lposp, L, scp, nat.drop_p or None,
                          nat.wfmt, nt)
    group = -1
    n_layers = len(model.blocks)
    have_qkv = False
    for li, blk in enumerate(() if native_attn else model.blocks):     # other caches: PyTorch attention
        if not have_qkv:                                     # the first layer, or one after an Engram block
            if blk.engram is not None:
                x.add_(blk.engram(x[None, None], addrs[li])[0, 0])
            qp, sp, nq = nat.qkv[li]
            lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, qp, sp, P["qkvbuf"], nq, d, nat.wfmt & 1, nt)
        full = blk.attn.mode == "full"
        if full:
            group += 1
        heads = nat.qkvbuf[:nat.qkv[li][2]].view(-1, D)
        nqk = fs.nqk[li]
        qk = heads[:nqk]
        qk = (qk / vnorm(qk, dim=-1, keepdim=True).mul_(fs.ndiv[li])) @ R
        q = qk[:H].view(Hk, rep, D)
        lk_new[li].copy_(qk[H:H + Hk])
        lv_new[li].copy_(heads[nqk:nqk + Hk])
        if full:
            gk_new[group].copy_(qk[H + Hk:nqk])
            gv_new[group].copy_(heads[nqk + Hk:])
            KgT, Vg = KgT_all[group], Vg_all[group]
        if q.dtype != kdt:
            q = q.to(kdt)
        sl = torch.bmm(q, KlT[li])
        if lbias is not None:
            sl.add_(lbias)
        p = torch.softmax(torch.cat([torch.bmm(q, KgT), sl], dim=-1), dim=-1, dtype=torch.float32)
        if kdt == torch.float32:
            torch.bmm(p[..., :L + 1], Vg, out=y3).baddbmm_(p[..., L + 1:], Vl[li])
        else:
            p = p.to(kdt)
            y3.copy_(torch.bmm(p[..., :L + 1], Vg).baddbmm_(p[..., L + 1:], Vl[li]))
        nxt = li + 1
        have_qkv = nxt < n_layers and not nat.has_engram[nxt]
        wq, sq, nq = nat.qkv[nxt] if have_qkv else (None, None, 0)
        (op, os_, _), (up, us, _), (dp, ds, _) = nat.wo[li], nat.up[li], nat.down[li]
        lib.tc_tail(P["x"], P["h"], P["xq"], inv, P["y"], H * D, op, os_, up, us, dp, ds, P["u"], hid, d,
                    wq, sq, P["qkvbuf"], nq, nat.wfmt, nt)
        nat.drop_row(li)
    lens_h[0] += 1
    lens_cpu_h[0] += 1
    hp, hs, V = nat.head
    lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, hp, hs, P["logits"], V, d, 0, nt)
    lib.tc_softcap(P["logits"], V, c.logit_softcap)     # one thread: torch.tanh would start a parallel region
    nat.drop_row(n_layers)
    nat.tuner.record(time.perf_counter() - t0, ceiling)
    return nat.logits.clone()                           # callers keep logits across steps; the buffer is reused
