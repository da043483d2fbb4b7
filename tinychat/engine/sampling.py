"""Samplers: the host-side nucleus draw (`sample_top_p`, with a top-k shortcut for big CPU vocabularies), the
graph-capturable inverse-CDF draw (`_sample_icdf`) and the on-device phrase-ban mask (`_phrase_ban_mask`)."""
from __future__ import annotations

import torch

TOPK_SAMPLE_MIN = 4096   # CPU vocabularies above this: nucleus via topk (sorting 32k probs costs ~2 ms per token)


def sample(logits: torch.Tensor, temperature: float = 1.0, generator=None) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)


def apply_ban_and_penalty(logits: torch.Tensor, pen: float = 1.0, pen_mask=None, ban_mask=None,
                          pen_ix=None) -> torch.Tensor:
    """fp32 logits with ban_mask -> -inf and the repetition penalty on pen_mask (positive logits / pen, negative
    * pen). Never modifies its input. pen_ix: pen_mask's ids (sorted), when the caller has them (a turn's ids are
    fixed: no nonzero() per token)."""
    src = logits
    if logits.dtype != torch.float32:
        logits = logits.float()
    if ban_mask is not None:
        logits = logits.masked_fill(ban_mask, float("-inf"))
    if pen != 1.0 and pen_mask is not None:
        if logits.device.type == "cpu":   # only the penalised ids (a few hundred), not four passes over V
            ix = pen_mask.nonzero().squeeze(-1) if pen_ix is None else pen_ix
            if logits is src:
                logits = logits.clone()
            v = logits[..., ix]
            logits[..., ix] = torch.where(v > 0, v / pen, v * pen)
        else:
            logits = torch.where(pen_mask, torch.where(logits > 0, logits / pen, logits * pen), logits)
    return logits


def sample_top_p(logits: torch.Tensor, temperature: float, top_p: float, pen: float = 1.0, pen_mask=None,
                 ban_mask=None, generator=None, pen_ix=None) -> torch.Tensor:
    """On the logits' device, no host sync: ban_mask -> -inf, repetition penalty on pen_mask (positive logits / pen,
    negative * pen), temperature, nucleus top_p, one multinomial draw. logits (1, V); masks (V,) bool or None.
    Returns a (1,) token tensor. For vocabularies up to TOPK_SAMPLE_MIN the draws equal a plain sort + multinomial;
    bigger CPU vocabularies draw from the same distribution with a top-k nucleus (_nucleus_draw_topk).
    temperature <= 0: greedy (after the ban and the penalty). pen_ix: as apply_ban_and_penalty."""
    if temperature <= 0 and (pen == 1.0 or pen_mask is None):
        t = _greedy_cpu(logits, ban_mask)
        if t is not None:
            return t
    logits = apply_ban_and_penalty(logits, pen, pen_mask, ban_mask, pen_ix)
    if temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits / temperature, dim=-1)
    if p.device.type == "cpu" and p.size(-1) > TOPK_SAMPLE_MIN:
        r = _nucleus_draw_topk(p, top_p, generator)
        if r is not None:
            return r
    sp, si = p.sort(dim=-1, descending=True)
    keep = sp.cumsum(-1) - sp < top_p
    sp = sp * keep
    return si[0, torch.multinomial(sp[0] / sp[0].sum(), 1, generator=generator)]


def _greedy_cpu(logits, ban_mask):
    """The greedy token of fp32 CPU logits (1, V) without a masked copy: numpy's argmax (first maximum, as torch's;
    ~10x faster at V = 8192), then the ban only if it removes the winner. The masked argmax is the same index
    whenever the winner is allowed: it is the first maximum of the unmasked row, so no earlier index ties with it.
    None: not such logits, or the winner is banned (the caller masks)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2 or logits.size(0) != 1 \
            or logits.requires_grad:
        return None
    i = int(logits.numpy().argmax())
    if ban_mask is not None and bool(ban_mask.numpy().reshape(-1)[i]):
        return None
    return torch.tensor([i])


def _nucleus_draw_topk(p, top_p, generator):
    """sample_top_p's sort + multinomial draw without the full sort: the nucleus is the top-k prefix (k grown until the
    first dropped token is inside it), then one multinomial draw over those k. Same nucleus, same distribution; a
    seeded draw differs from the sorted path's (multinomial draws one exponential per entry: k instead of V).
    None: the nucleus is most of the vocabulary (the caller sorts)."""
    V = p.size(-1)
    for k in (64, 1024):                                 # a flat distribution: two tries, then the sort
        if k * 4 > V:
            break
        sp, si = p.topk(k, dim=-1)                       # sorted, descending
        keep = sp.cumsum(-1) - sp < top_p
        if not bool(keep[0, -1]):
            sp = sp * keep
            return si[0, torch.multinomial(sp[0] / sp[0].sum(), 1, generator=generator)]
    return None


def _sample_icdf(logits, temperature, top_p, pen, pen_mask, ban_mask, u):
    """sample_top_p with the draw done by inverse CDF from a given uniform u (1,): graph-capturable (no RNG op
    inside the graph). Same distribution as sample_top_p."""
    logits = logits.float().masked_fill(ban_mask, float("-inf"))
    if pen != 1.0:
        logits = torch.where(pen_mask, torch.where(logits > 0, logits / pen, logits * pen), logits)
    if temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits / temperature, dim=-1)
    sp, si = p.sort(dim=-1, descending=True)
    keep = sp.cumsum(-1) - sp < top_p
    cdf = (sp * keep).cumsum(-1)
    j = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_max(cdf.size(-1) - 1)
    return si.gather(-1, j).view(1)


def _phrase_ban_mask(out, i, ban_ctx, ban_tok, scratch, ar, pos=None):
    """The phrase ban on the device, graph-capturable (fixed shapes, no host values): (1, V) bool, True for the ids
    that would complete a banned n-gram after the last k = ar.numel() sampled tokens out[i-k:i] (nothing before k
    tokens are sampled). ban_ctx (cap, k) context rows (-1 = unused row), ban_tok (cap,) the banned id per row
    (V = unused, lands in scratch's extra slot), scratch (V + 1,) float work buffer, i (1,) long.
    pos (n,) = arange(out.numel()): the ban also covers the n-grams of out[:i] itself (the reply so far): out[j] for
    every j in [k, i) whose k predecessors out[j-k:j] equal the context. None: only the table."""
    k = ar.numel()
    ctx = out.index_select(0, (i - k + ar).clamp_min(0))                      # (k,)
    hit = (ban_ctx == ctx[None]).all(-1) & (i >= k)                           # (cap,)
    scratch.zero_().index_add_(0, ban_tok, hit.to(scratch.dtype))
    if pos is not None:
        win = out[(pos[:, None] - k + ar[None, :]).clamp_min(0)]             # (n, k): win[j] = out[j-k:j]
        mine = (win == ctx[None]).all(-1) & (pos >= k) & (pos < i) & (i >= k)  # (n,)
        scratch.index_add_(0, out, mine.to(scratch.dtype))
    return (scratch[:-1] > 0)[None]
