"""What the packed quant Linears (Int8Linear: engine/quant.py, Int4Linear: engine/quant_int4.py) share: quantizing
in row blocks (QUANT_ROWS), the input gain (in_gain, (K,) fp32: W' = W diag(g), the weights quantized with g divided
out and the activations multiplied by it), building one from packed tensors or from other ones' rows, and handing a
mapped file's weight pages back after a forward: plain helpers on a module and its tensors, and PackedLinear, the
base that gives both their from_packed / from_rows constructors."""
from __future__ import annotations

import torch

from .prefill_policy import _quant_buffer

QUANT_ROWS = 1024     # rows quantized at a time (int8 from fp32/bf16 weights)


def _rows_bias(pieces) -> torch.nn.Parameter | None:
    """from_rows' bias: the pieces' bias rows concatenated, or None when no piece has a bias."""
    if all(lin.bias is None for lin, _, _ in pieces):
        return None
    if any(lin.bias is None for lin, _, _ in pieces):
        raise ValueError("from_rows: some pieces have a bias and some do not")
    return torch.nn.Parameter(torch.cat([lin.bias.detach()[a:b] for lin, a, b in pieces]), requires_grad=False)


def _weight_blocks(mod, lin: torch.nn.Linear, mapped=None):
    """lin's weight rows, QUANT_ROWS at a time, each copied into the one reused fp32 buffer (no temporaries for the
    heap to keep; malloc_trim runs last) with mod's input gain divided out: what the packed Linears quantize. A mapped
    file's (MappedWeights) pages go back block by block."""
    src = lin.weight.detach()
    for block in mapped.blocks(src) if mapped is not None else (src,):
        for w in block.split(QUANT_ROWS):
            yield _divide_gain(_quant_buffer(*w.shape).copy_(w), mod.in_gain)


def _divide_gain(w: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """w (rows, K) with its columns divided by the input gain g (K,) in place (a zero gain: the column zeroed), the
    weights an in_gain Linear quantizes: W' = W diag(g) -> W."""
    if g is not None:
        w.div_(torch.where(g != 0, g, 1.0)[None, :]).mul_((g != 0)[None, :])
    return w


def _set_gain(mod, in_gain) -> None:
    """mod.in_gain: the (K,) fp32 input gain, or None (a None buffer: not in the state dict)."""
    g = None if in_gain is None else in_gain.detach().float().contiguous()
    if g is not None and g.shape != (mod.in_features,):
        raise ValueError(f"in_gain of shape {tuple(g.shape)} for a Linear of {mod.in_features} inputs")
    mod.register_buffer("in_gain", g)


def _gained(mod, x: torch.Tensor) -> torch.Tensor:
    """x times the Linear's input gain (a new tensor), in x's dtype; x itself without one."""
    g = getattr(mod, "in_gain", None)
    if g is None:
        return x
    return (x.float() * g).to(x.dtype)


class PackedLinear(torch.nn.Module):
    """The base of Int8Linear and Int4Linear: a packed qweight, one scale row per output row (per channel for int8,
    per group of 32 for int4), bias or None, in_gain or None, prefill_bf16 and native as the subclass reads them."""

    def forward(self, x):
        y = self._forward(x)       # the subclass's kernels
        _drop_read_pages(self)
        return y

    @classmethod
    def from_packed(cls, qweight, scale, bias, in_features: int, prefill_bf16=None, native: bool = True,
                    in_gain=None):
        """The Linear holding these packed tensors as __init__ makes them (qweight, scale, bias or None, in_gain or
        None) as they are (a stored-quantized file's mapped tensors: quant_files.py), no quantization: the same
        module as quantizing the weights they were made from."""
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        out.in_features, out.out_features = int(in_features), qweight.size(0)
        out.register_buffer("qweight", qweight)
        out.register_buffer("scale", scale)
        out.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        out.prefill_bf16, out.native = prefill_bf16, bool(native)
        _set_gain(out, in_gain)
        return out

    @classmethod
    def from_rows(cls, pieces):
        """One Linear of the rows (lin, start, end) of Linears of this class, in order: qweight and scale rows (one
        row of either per output row) and bias rows concatenated (exact: rows are kept, the same as quantizing the
        concatenated fp32 rows). The pieces have biases all (the llama family's q/k/v biases) or none, and one
        input gain."""
        first = pieces[0][0]
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        q, s = cls._cat_rows(pieces)
        out.in_features, out.out_features, out.prefill_bf16 = first.in_features, q.size(0), first.prefill_bf16
        out.native = getattr(first, "native", True)
        out.register_buffer("qweight", q)
        out.register_buffer("scale", s)
        out.bias = _rows_bias(pieces)
        gains = [getattr(lin, "in_gain", None) for lin, _, _ in pieces]
        if any((g is None) != (gains[0] is None) or (g is not None and not torch.equal(g, gains[0])) for g in gains):
            raise ValueError("from_rows: the pieces have different input gains")
        _set_gain(out, gains[0])
        return out

    def views_ok(self, a: int, b: int) -> bool:
        """Whether rows [a, b) of qweight and scale, as views, are a matrix of this format (per-row formats: always;
        Int4Linear's grouped layout overrides it)."""
        return True

    @staticmethod
    def _cat_rows(pieces) -> tuple[torch.Tensor, torch.Tensor]:
        """The qweight and scale rows (lin, start, end) of the pieces, concatenated (one row of either per output
        row; Int4Linear's grouped layout overrides it)."""
        return (torch.cat([lin.qweight[a:b] for lin, a, b in pieces]).contiguous(),
                torch.cat([lin.scale[a:b] for lin, a, b in pieces]).contiguous())


def _drop_read_pages(lin) -> None:
    """After a quant Linear's forward: hand its mapped weight pages back (its page_drop, a page_drop.PageRanges set
    where EngineOptions.drop_pages is on for a stored model; None or absent: nothing)."""
    pd = lin.__dict__.get("page_drop")
    if pd is not None:
        pd.drop()
