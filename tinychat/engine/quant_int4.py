"""`--quant int4`'s Linear: quantize_int4 (w (N, K) -> native_q4_layout.h's packed layout: groups of 32 columns with
one fp16 scale, ~4.5 bits a weight, rows by groups of four: engine/int4_layout.py) and Int4Linear, which runs them on
the native kernels (its bf16 prefill GEMMs dequantize BF16_BLOCK bytes of rows at a time). Which Linears get it is
engine/int4_rules.py's rule, quantize_cpu (engine/quant.py) applies it."""
from __future__ import annotations

import torch

from ..mapped import MappedWeights
from .int4_layout import aligned, cat, grouped, rows
from .packed_linear import PackedLinear, _gained, _set_gain, _weight_blocks
from .prefill_policy import INT8_GEMM_CHUNK, _act_scratch, _grown, bf16_over_native

INT4_CANDIDATES = (-8.0, -8.5, -7.75, -7.5, -7.25, -7.0, -6.5, -6.0)   # d = (largest-magnitude value) / c


QUANT_ROWS = 256        # rows quantized at a time: the search's temporaries stay in cache (4.6x faster on 4096 x 4096)


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) -> (packed (N, Kp / 2) uint8, scales (N, Kp / 32) fp16), native_q4_layout.h's grouped layout (Kp: K
    rounded up to 64, zero columns past K). Per group of 32: Q4_0's form, q = clamp(round(w / d), -8, 7) with d = m / c
    for m the group's value of largest magnitude (the first such), d stored in fp16 and q rounded against the stored
    value; c is the first of INT4_CANDIDATES (-8: Q4_0's own) with the least squared error (a search llama.cpp's
    Q4_K does too; here it costs a few % of the loading time). Deterministic: the same bytes on every machine. Row
    blocks of QUANT_ROWS (each group's arithmetic is its own: the same bytes as the whole matrix at once)."""
    parts = [_quantize_int4(w[r:r + QUANT_ROWS]) for r in range(0, w.size(0), QUANT_ROWS)] or [_quantize_int4(w)]
    return grouped(torch.cat([p for p, _ in parts]), torch.cat([d for _, d in parts]))


def _q_of(g: torch.Tensor, df: torch.Tensor) -> torch.Tensor:
    """q = clamp(round(g / d), -8, 7) per group, 0 where d is 0 (a group of zeros, or an fp16 underflow): g (N, G, 32),
    df (N, G, 1) fp32 values of the stored fp16 scales."""
    zero = df == 0
    return (g / torch.where(zero, 1.0, df)).masked_fill_(zero, 0.0).round_().clamp_(-8, 7)


def _quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_int4 of w, in the plain layout (engine/int4_layout.py)."""
    from .native import pad64
    N, K = w.shape
    Kp = pad64(K)
    g = torch.nn.functional.pad(w.float(), (0, Kp - K)).view(N, Kp // 32, 32)
    m = g.gather(-1, g.abs().argmax(dim=-1, keepdim=True))
    best_d = best_e = None
    for c in INT4_CANDIDATES:              # each candidate's squared error; only the best scale is kept (small)
        d = (m / c).clamp_(-65504.0, 65504.0).to(torch.float16)
        df = d.float()
        e = (_q_of(g, df).mul_(df).sub_(g)).square_().sum(-1, keepdim=True)
        if best_e is None:
            best_d, best_e = d, e
        else:
            better = e < best_e            # strict: the first candidate wins a tie
            best_d = torch.where(better, d, best_d)
            best_e = torch.minimum(e, best_e)
    u = (_q_of(g, best_d.float()) + 8).to(torch.uint8).view(N, Kp // 64, 2, 32)   # the q of the scale kept
    packed = (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(N, Kp // 2)
    return packed.contiguous(), best_d.view(N, Kp // 32).contiguous()


class Int4Linear(PackedLinear):
    """Weight-only int4 Linear (`--quant int4`): rows quantized in groups of 32 columns with one fp16 scale each
    (quantize_int4; native_q4_layout.h's packed layout: ~4.5 bits a weight, half of int8's bytes a token). Runs on the
    native kernels: decode in the native steps (native_q4.h's GEMV on the int8 step's activation rounding), prefill on
    the int4 GEMM (tc_gemm4: the same rounding per token), or, as Int8Linear's (prefill_bf16 True, or None on AMX
    machines: tile multiplies beat any AVX-512 int4 GEMM), on oneDNN's bf16 GEMM, the rows dequantized to bf16
    block by block (tc_dequant4_bf16) for more than INT8_GEMV_ROWS_BF16 tokens. Without the kernels (or native off):
    the dequantized weights through fp32 GEMMs (prefill) and bf16 ones (mm, the lean PyTorch step): slow, a
    fallback."""

    def __init__(self, lin: torch.nn.Linear, prefill_bf16: bool | None = None, native: bool = True,
                 mapped: MappedWeights | None = None, in_gain: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        _set_gain(self, in_gain)
        parts, ss = [], []
        for buf in _weight_blocks(self, lin, mapped):
            p, s = _quantize_int4(buf)
            parts.append(p)
            ss.append(s)
        q, sc = grouped(torch.cat(parts), torch.cat(ss))
        self.register_buffer("qweight", q)
        self.register_buffer("scale", sc)
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().float(), requires_grad=False)
        self.prefill_bf16 = prefill_bf16
        self.native = bool(native)

    def views_ok(self, a: int, b: int) -> bool:
        """Rows [a, b) as views keep the grouped layout where they keep whole row groups (engine/int4_layout.py)."""
        return aligned(a, b, self.out_features)

    @staticmethod
    def _cat_rows(pieces) -> tuple[torch.Tensor, torch.Tensor]:
        """The pieces' rows in the grouped layout (engine/int4_layout.py: views where they keep whole row groups)."""
        return cat([rows(lin.qweight, lin.scale, a, b) for lin, a, b in pieces])

    @property
    def weight(self):   # dequantized fp32 copy (N, K), the input gain folded back in
        from .native import dequant4
        w = dequant4(self.qweight, self.scale, self.in_features)
        return w if self.in_gain is None else w * self.in_gain[None, :]

    def mm(self, xb):
        y = torch.nn.functional.linear(xb, self.weight.to(xb.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def gemm_lib(self):
        """The native kernels this layer runs on, or None (native off, or no kernels here)."""
        if not getattr(self, "native", True):
            return None
        from . import native
        return native.load()

    def prefill_kernel(self, rows: int, cpu: bool = True) -> str:
        """Where the kernels run, "bf16-gemm" for more than INT8_GEMV_ROWS_BF16 rows where asked for (prefill_bf16
        True, or None on an AMX machine), else "native-gemm" (tc_gemm4); without them "fp32-gemm" (the dequantized
        weights)."""
        if not cpu or self.gemm_lib() is None:
            return "fp32-gemm"
        return "bf16-gemm" if bf16_over_native(self.prefill_bf16, rows) else "native-gemm"

    def _forward(self, x):
        shape = x.shape
        kernel = self.prefill_kernel(x.numel() // shape[-1], x.device.type == "cpu")
        if kernel == "fp32-gemm":
            b = None if self.bias is None else self.bias.to(x.dtype)
            return torch.nn.functional.linear(x, self.weight.to(x.dtype), b)
        from . import native
        lib = self.gemm_lib()
        x2 = _gained(self, x.reshape(-1, shape[-1]).float()).contiguous()
        nt = torch.get_num_threads()
        if kernel == "bf16-gemm":
            return self._bf16_gemm(lib, x2, nt).view(*shape[:-1], self.out_features).to(x.dtype)
        scratch = _act_scratch(int(lib.tc_gemm4_act_bytes(min(x2.size(0), INT8_GEMM_CHUNK), x2.size(1), nt)))
        b = None if self.bias is None else self.bias.float().contiguous()
        y = torch.empty(x2.size(0), self.out_features)
        for i in range(0, x2.size(0), INT8_GEMM_CHUNK):
            native.gemm4(lib, x2[i:i + INT8_GEMM_CHUNK], self.qweight, self.scale, b, nt, scratch,
                         out=y[i:i + INT8_GEMM_CHUNK])
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def _bf16_gemm(self, lib, x2, nt):
        """x2 (rows, in) fp32, gained, through oneDNN's bf16 GEMM: the rows dequantized to bf16 a block of at most
        BF16_BLOCK bytes at a time (one reused buffer), each block's outputs rounded to bf16 as Int8Linear's are,
        then the bias added in fp32: (rows, out) fp32."""
        from . import native
        K, N = self.in_features, self.out_features
        xb = x2.to(torch.bfloat16)
        y = torch.empty(x2.size(0), N)
        rb = max(4, BF16_BLOCK // (2 * K) // 4 * 4)      # whole row groups: views of the grouped layout
        for r0 in range(0, N, rb):
            r1 = min(N, r0 + rb)
            q, sc = rows(self.qweight, self.scale, r0, r1)
            w = native.dequant4_bf16(lib, q, sc, K, nt, out=_bf16_rows(r1 - r0, K))
            y[:, r0:r1] = torch.nn.functional.linear(xb, w)
        return y if self.bias is None else y.add_(self.bias.float())


BF16_BLOCK = 8 << 20    # bytes of bf16 weights dequantized at a time for Int4Linear's bf16 GEMMs


def _bf16_rows(rows: int, cols: int) -> torch.Tensor:
    """Int4Linear's bf16 block buffer (rows, cols): one flat buffer per thread, grown to the largest block (at most
    BF16_BLOCK bytes, or one row), so a model's many shapes share it."""
    return _grown("bf16", rows * cols, torch.bfloat16).view(rows, cols)
