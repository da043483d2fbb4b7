"""Samplers: the host-side nucleus draw (`sample_top_p`, with a top-k shortcut for big CPU vocabularies, in numpy
for host logits), the graph-capturable inverse-CDF draw (`_sample_icdf`) and the on-device phrase-ban mask (`_phrase_ban_mask`)."""
from __future__ import annotations

import numpy
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
    if host_logits(logits):
        if ban_mask is None and (pen == 1.0 or pen_mask is None):
            return logits
        ix = None if pen == 1.0 or pen_mask is None else \
            (pen_mask.numpy().nonzero()[0] if pen_ix is None else pen_ix.numpy())
        out = penalise_host(logits.numpy()[0], pen, ix, None if ban_mask is None else ban_mask.numpy().reshape(-1))
        return torch.from_numpy(out).view(1, -1)
    return _apply_ban_and_penalty_tensor(logits, pen, pen_mask, ban_mask, pen_ix)


def _apply_ban_and_penalty_tensor(logits, pen=1.0, pen_mask=None, ban_mask=None, pen_ix=None):
    """apply_ban_and_penalty in tensor ops: any device, dtype and batch (the reference of penalise_host)."""
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


def host_logits(logits) -> bool:
    """fp32 CPU logits (1, V) outside autograd: the samplers work on them through numpy. Every tensor op hands the
    GIL away and takes it back (1.5-4 switches each), and while the app's UI thread renders, each switch waits
    for it; numpy's O(V) passes at these sizes mostly keep the GIL (exp and partitions excepted)."""
    return isinstance(logits, torch.Tensor) and logits.device.type == "cpu" and logits.dtype == torch.float32 \
        and logits.dim() == 2 and logits.size(0) == 1 and not logits.requires_grad


def penalise_host(l: numpy.ndarray, pen: float = 1.0, pen_ix=None, ban=None) -> numpy.ndarray:
    """apply_ban_and_penalty on a numpy row (V,) fp32: a new array, bit-identical to the tensor ops' (the same
    float32 division and product). pen_ix: the penalised ids (int array) or None; ban: a bool mask (V,) or the
    banned ids, or None."""
    out = l.copy()
    if ban is not None and len(ban):
        out[ban] = -numpy.inf
    if pen != 1.0 and pen_ix is not None and len(pen_ix):
        v = out[pen_ix]
        out[pen_ix] = numpy.where(v > 0, v / numpy.float32(pen), v * numpy.float32(pen))
    return out


def sample_top_p(logits: torch.Tensor, temperature: float, top_p: float, pen: float = 1.0, pen_mask=None,
                 ban_mask=None, generator=None, pen_ix=None) -> torch.Tensor:
    """On the logits' device, no host sync: ban_mask -> -inf, repetition penalty on pen_mask (positive logits / pen,
    negative * pen), temperature, nucleus top_p, one multinomial draw. logits (1, V); masks (V,) bool or None.
    Returns a (1,) token tensor. For vocabularies up to TOPK_SAMPLE_MIN the draws equal a plain sort + multinomial;
    bigger CPU vocabularies draw from the same distribution with a top-k nucleus (_nucleus_draw_topk).
    temperature <= 0: greedy (after the ban and the penalty). pen_ix: as apply_ban_and_penalty.
    Host logits (host_logits) take numpy for the penalty, the ban, the greedy argmax and the nucleus draw: the same
    token and generator state as the tensor ops, with 3-8 tensor ops a token instead of ~20."""
    if temperature <= 0:
        t = _greedy_cpu(logits, ban_mask, pen if pen_mask is not None else 1.0, pen_mask, pen_ix)
        if t is not None:
            return t
    logits = apply_ban_and_penalty(logits, pen, pen_mask, ban_mask, pen_ix)
    if temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits / temperature, dim=-1)
    if host_logits(p):
        r = _nucleus_draw_host(p.numpy()[0], top_p, generator)
        if r is not None:
            return r
    return _nucleus_draw_tensor(p, top_p, generator)


def _nucleus_draw_tensor(p: torch.Tensor, top_p: float, generator=None) -> torch.Tensor:
    """The nucleus draw from probabilities p (1, V) in tensor ops: the top-k shortcut for big CPU vocabularies,
    else a sort + cumsum, then one multinomial draw. (1,) token tensor."""
    if p.device.type == "cpu" and p.size(-1) > TOPK_SAMPLE_MIN:
        r = _nucleus_draw_topk(p, top_p, generator)
        if r is not None:
            return r
    sp, si = p.sort(dim=-1, descending=True)
    keep = sp.cumsum(-1) - sp < top_p
    sp = sp * keep
    return si[0, torch.multinomial(sp[0] / sp[0].sum(), 1, generator=generator)]


def _greedy_cpu(logits, ban_mask, pen: float = 1.0, pen_mask=None, pen_ix=None):
    """The greedy token of host logits (1, V) through numpy, no tensor op: the argmax of the row (numpy's: first
    maximum, as torch's; ~10x faster at V = 8192); when the ban or a penalty >= 1 touches the winner, the argmax of
    the penalised, masked copy. Both only lower values, so an untouched winner is still the first maximum: no index
    before it ties with it. None: not host logits, or a penalty below 1 (the caller uses the tensor path)."""
    if not host_logits(logits) or (pen < 1.0 and pen_mask is not None):
        return None
    row = logits.numpy()[0]
    i = int(row.argmax())
    ban = None if ban_mask is None else ban_mask.numpy().reshape(-1)
    pm = None if pen == 1.0 or pen_mask is None else pen_mask.numpy().reshape(-1)
    if (ban is not None and ban[i]) or (pm is not None and pm[i]):
        ix = None if pm is None else (pm.nonzero()[0] if pen_ix is None else pen_ix.numpy())
        i = int(penalise_host(row, pen, ix, ban).argmax())
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


def _nucleus_draw_host(p: numpy.ndarray, top_p: float, generator):
    """The nucleus draw of sample_top_p (the top-k shortcut above TOPK_SAMPLE_MIN, else the sort) in numpy, with
    the same token and the same generator state: torch.multinomial draws one sample as argmax(w / q) with q an
    Exp(1) tensor the size of w, so only that tensor and the sum are tensor ops (the cumsum accumulates in double,
    as torch's). None (the caller draws with tensors) when kept probabilities tie: torch orders ties its own way."""
    V = p.shape[0]
    ks = [k for k in (64, 1024) if k * 4 <= V] if V > TOPK_SAMPLE_MIN else []
    for k in ks + [V]:
        ix = numpy.argpartition(p, V - k)[V - k:] if k < V else numpy.arange(V)
        ix = ix[numpy.argsort(-p[ix], kind="stable")]               # descending
        sp = p[ix]
        keep = numpy.cumsum(sp, dtype=numpy.float64).astype(numpy.float32) - sp < numpy.float32(top_p)
        if k < V and keep[-1]:
            continue                                                # the nucleus reaches past the top k
        kept = sp[keep & (sp > 0)]                                   # zeros never win: their order is moot
        if not numpy.isfinite(sp).all() or (kept[1:] == kept[:-1]).any():
            return None
        w = sp * keep
        z = torch.from_numpy(w).sum().numpy()
        if not z > 0:
            return None
        q = torch.empty(k).exponential_(1.0, generator=generator).numpy()
        return torch.tensor([int(ix[int(numpy.argmax((w / z) / q))])])
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


def _phrase_ban_mask(out, i, ban_ctx, ban_tok, scratch, ar):
    """The phrase ban on the device, graph-capturable (fixed shapes, no host values): (1, V) bool, True for the ids
    that would complete a banned n-gram after the last k = ar.numel() sampled tokens out[i-k:i] (nothing before k
    tokens are sampled). ban_ctx (cap, k) context rows (-1 = unused row), ban_tok (cap,) the banned id per row
    (V = unused, lands in scratch's extra slot), scratch (V + 1,) float work buffer, i (1,) long."""
    k = ar.numel()
    ctx = out.index_select(0, (i - k + ar).clamp_min(0))                      # (k,)
    hit = (ban_ctx == ctx[None]).all(-1) & (i >= k)                           # (cap,)
    scratch.zero_().index_add_(0, ban_tok, hit.to(scratch.dtype))
    return (scratch[:-1] > 0)[None]
