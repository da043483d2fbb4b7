"""The training loss: cross-entropy of the softcapped head on assistant targets only.

`masked_loss` is the fast path the trainer uses; `masked_loss_reference` is the plain one (the model's own
forward, then F.cross_entropy) it is tested against.

Why a fused head: the 8192-wide head is the biggest activation of a step. The plain path materializes the bf16
logits, an fp32 copy, tanh, the softcapped logits, log-softmax and their gradients, pass after pass over
(targets, V) arrays far bigger than the caches (~15 % of a step at 1 thread). `HeadCrossEntropy` works through
the rows in blocks that stay in cache: logits, tanh, log-sum-exp, the loss and dL/dlogits in one visit per
block, keeping only dL/dlogits (bf16, like autocast's gradient) for the two backward GEMMs. Measured on an AMD
EPYC (Zen 5), 1 thread, 6,400 targets x 8,192: 1,306 ms -> 540 ms forward + backward (runs/prof/loss_ab2.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tinychat.model import TinyAgentLM, rms_norm

BLOCK_ROWS = 256        # (256, 8192) fp32 = 8 MiB per block: one logits block plus its tanh
GPU_BLOCK_ROWS = 16384  # on a GPU the blocks are about launches, not caches: (16384, 8192) fp32 = 512 MiB


class HeadCrossEntropy(torch.autograd.Function):
    """sum_i CE(cap * tanh(h_i @ W.T / cap), t_i) (cap 0: no softcap). h (N, d) normed hidden states, w (V, d)
    the head's weight, tgt (N,) long. bf16: matmuls in bfloat16 (fp32 accumulation), the softmax in fp32."""

    @staticmethod
    def forward(ctx, h, w, tgt, cap: float, bf16: bool):
        dt = torch.bfloat16 if bf16 else h.dtype
        hb, wb = h.to(dt), w.to(dt)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad = torch.empty(h.size(0), w.size(0), dtype=dt, device=h.device) if need_grad else None  # (N, V) dL/dz
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        rows = BLOCK_ROWS if h.device.type == "cpu" else GPU_BLOCK_ROWS
        for s in range(0, h.size(0), rows):
            z = (hb[s:s + rows] @ wb.t()).float()                                   # (n, V) raw logits
            if cap:
                t = z.div_(cap).tanh_()                                              # t = tanh(z / cap), in place
                y = t * cap
            else:
                t, y = None, z
            lse = torch.logsumexp(y, dim=-1, keepdim=True)
            tc = tgt[s:s + rows, None]
            total += (lse.squeeze(1) - y.gather(1, tc).squeeze(1)).sum()
            if grad is None:
                continue
            p = y.sub_(lse).exp_()                                                   # softmax
            p.scatter_add_(1, tc, torch.full(tc.shape, -1.0, dtype=p.dtype, device=p.device))  # - one-hot
            if t is not None:
                p.mul_(t.square_().neg_().add_(1))                                   # d(cap tanh(z/cap))/dz
            grad[s:s + rows] = p
        ctx.save_for_backward(grad, hb, wb)
        ctx.dtypes = (h.dtype, w.dtype)
        return total

    @staticmethod
    def backward(ctx, g_out):
        grad, hb, wb = ctx.saved_tensors
        gh = (grad @ wb).to(ctx.dtypes[0]) * g_out if ctx.needs_input_grad[0] else None
        gw = (grad.t() @ hb).to(ctx.dtypes[1]) * g_out if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def masked_loss(model: TinyAgentLM, idx, tgt, msk, bf16: bool = True,
                attn_chunk: int = 256) -> tuple[torch.Tensor, int]:
    """(sum of cross-entropy over the masked targets, their count). idx, tgt, msk (B, T). The head runs on the
    masked positions only; attention in query blocks of attn_chunk (0: one dense call)."""
    sel = msk.reshape(-1).nonzero().squeeze(1)
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=bf16):
        x = model.trunk(idx, attn_chunk)
    h = rms_norm(x.reshape(-1, x.size(-1)).index_select(0, sel).float(), model.cfg.norm_eps)
    t = tgt.reshape(-1).index_select(0, sel)
    loss = HeadCrossEntropy.apply(h, model.head.weight, t, float(model.cfg.logit_softcap), bf16)
    return loss, int(sel.numel())


def masked_loss_reference(model: TinyAgentLM, idx, tgt, msk, bf16: bool = True) -> tuple[torch.Tensor, int]:
    """The plain form of masked_loss: the model's forward over every position, then F.cross_entropy."""
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(idx)
    m = msk.reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1))[m], tgt.reshape(-1)[m], reduction="sum")
    return loss, int(m.sum())
