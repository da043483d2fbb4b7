"""A tied embedding read from the int8 head rows (stored-quantized files of format version 2: quant_files.py).

A llama-family checkpoint with a tied embedding has head = embed diag(g) (the final norm's gain g folded in by the
importer); a stored int8 / int4 file keeps only the head's int8 rows and their per-row scales, and the final gain's
reciprocal `inv_gain` (d,) fp32. The model's embedding row of token t is then

    e[t, j] = (q[t, j] * s[t]) * inv_gain[j]        (fp32: q[t, j] * s[t] is exact, one rounding for the product)

with q the head's int8 rows and s its bf16 row scales (as fp32). `HeadRowsEmbedding` gathers the rows of the tokens
asked for from the head's own (mapped) tensors: no copy of the table is ever made, only the rows read are resident.
The native llama step computes the same expression in C (native_llama.h, tc_llama_step), the same bits.
`naive_rows` is the reference: the whole table dequantized in float64, rounded once to fp32."""
from __future__ import annotations

import torch


class HeadRowsEmbedding(torch.nn.Module):
    """The embedding of a tied stored-quantized model: token ids -> fp32 rows of the int8 head (an Int8Linear, held by
    reference, not as a submodule: the state dict holds its tensors once, under "head."), times inv_gain."""

    def __init__(self, head, inv_gain: torch.Tensor):
        super().__init__()
        object.__setattr__(self, "head", head)          # not registered: no "embed.head.*" in the state dict
        self.register_buffer("inv_gain", inv_gain)
        self.num_embeddings, self.embedding_dim = head.qweight.shape

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (...) int64 -> (..., d) fp32: the rows gathered, times their row scales, times inv_gain."""
        q = self.head.qweight[idx].float()                                   # int8 values: exact in fp32
        s = self.head.scale[idx].float().unsqueeze(-1)                       # bf16 -> fp32: exact
        return q.mul_(s).mul_(self.inv_gain)                                 # q * s exact; one rounding

    def naive_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """The reference for forward(): the whole table in float64 (q * s * inv_gain, exact: 8 + 8 + 24 bits), rows
        taken, rounded once to fp32. A test helper: it makes a float64 copy of the whole table."""
        table = self.head.qweight.double() * self.head.scale.double()[:, None] * self.inv_gain.double()[None, :]
        return table[idx].float()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows of the int8 head"


def embed_rows(emb, idx: torch.Tensor) -> torch.Tensor:
    """The embedding rows of the token ids idx (a copy, fp32 or the table's dtype): an nn.Embedding's weight rows, a
    HeadRowsEmbedding's dequantized head rows. What the lean decode steps read."""
    if isinstance(emb, HeadRowsEmbedding):
        return emb(idx)
    return emb.weight[idx]


def embed_dtype(emb) -> torch.dtype:
    """The dtype the embedding's rows come out in."""
    return torch.float32 if isinstance(emb, HeadRowsEmbedding) else emb.weight.dtype
