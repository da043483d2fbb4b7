"""Samplers: the inverse-CDF draw's distribution, the top-k nucleus shortcut, the on-device phrase-ban mask."""
import math

import torch
from hypothesis import given, settings, strategies as st

from tinychat.engine import TOPK_SAMPLE_MIN, sample_top_p
from tinychat.engine.sampling import _nucleus_draw_topk, _phrase_ban_mask, _sample_icdf


def _nucleus_probs(logits, temperature, top_p):
    p = torch.softmax(logits.float() / temperature, -1)[0]
    sp, si = p.sort(descending=True)
    keep = sp.cumsum(-1) - sp < top_p
    target = torch.zeros_like(p)
    target[si[keep]] = sp[keep]
    return target / target.sum()


def _chi2_critical(df, z=3.09):
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts, target, n):
    exp = target * n
    m = exp > 0
    assert counts[~m].sum() == 0, "drew a token outside the nucleus"
    return float(((counts[m] - exp[m]) ** 2 / exp[m]).sum()), int(m.sum()) - 1


def test_inverse_cdf_draw_matches_the_nucleus_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 40, generator=g) * 2
    target = _nucleus_probs(logits, 0.8, 0.9)
    N = 20000
    u = torch.rand(N, generator=g)
    pm = torch.zeros(1, 40, dtype=torch.bool)
    draws = torch.stack([_sample_icdf(logits, 0.8, 0.9, 1.0, pm, pm, u[i:i + 1]) for i in range(N)]).flatten()
    counts = torch.bincount(draws, minlength=40).double()
    stat, df = _chi2(counts, target.double(), N)
    assert df >= 5
    assert stat < _chi2_critical(df)


def test_inverse_cdf_draw_applies_ban_and_penalty_like_sample_top_p():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 50, generator=g) * 3
    pm = torch.zeros(1, 50, dtype=torch.bool)
    pm[0, ::2] = True
    bm = torch.zeros(1, 50, dtype=torch.bool)
    bm[0, logits[0].argmax()] = True
    greedy = sample_top_p(logits, 0, 0.9, 1.5, pm[0], bm[0])
    assert int(_sample_icdf(logits, 0, 0.9, 1.5, pm, bm, torch.rand(1))) == int(greedy)
    assert int(greedy) != int(logits[0].argmax())


def test_topk_nucleus_draws_follow_the_sorted_nucleus():
    V = 8192
    assert V > TOPK_SAMPLE_MIN
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1, V, generator=g) * 4
    target = _nucleus_probs(logits, 0.7, 0.8)
    p = torch.softmax(logits / 0.7, -1)
    assert _nucleus_draw_topk(p, 0.8, g) is not None          # the shortcut really applies here
    N = 8000
    draws = torch.stack([sample_top_p(logits, 0.7, 0.8, generator=g) for _ in range(N)]).flatten()
    counts = torch.bincount(draws, minlength=V).double()
    stat, df = _chi2(counts, target.double(), N)
    assert stat < _chi2_critical(df)


def test_topk_nucleus_falls_back_to_the_sort_for_flat_distributions():
    p = torch.full((1, 8192), 1 / 8192)
    assert _nucleus_draw_topk(p, 0.95, None) is None


def _host_ban(out, i, table, V):
    m = torch.zeros(V, dtype=torch.bool)
    if i >= 2:
        for t in table.get((out[i - 2], out[i - 1]), []):
            m[t] = True
    return m


def test_device_phrase_ban_mask_equals_host_reference():
    g = torch.Generator().manual_seed(3)
    V, cap = 30, 64
    for trial in range(50):
        table = {}
        for _ in range(int(torch.randint(0, 20, (1,), generator=g))):
            a, b, c = torch.randint(0, 6, (3,), generator=g).tolist()      # small alphabet: many hits
            table.setdefault((a, b), []).append(c)
        rows = [(ctx, t) for ctx, ts in table.items() for t in ts]
        ctx = torch.full((cap, 2), -1, dtype=torch.long)
        tok = torch.full((cap,), V, dtype=torch.long)
        if rows:
            ctx[:len(rows)] = torch.tensor([c for c, _ in rows])
            tok[:len(rows)] = torch.tensor([t for _, t in rows])
        out_list = torch.randint(0, 6, (12,), generator=g).tolist()
        out = torch.tensor(out_list)
        for i in range(len(out_list)):
            dev = _phrase_ban_mask(out, torch.tensor([i]), ctx, tok, torch.zeros(V + 1), torch.arange(2))
            assert torch.equal(dev[0], _host_ban(out_list, i, table, V)), (trial, i)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), V=st.sampled_from([7, 300, 8192]), ties=st.booleans(),
       ban=st.sampled_from(["none", "winner", "random"]))
def test_greedy_draw_equals_the_masked_argmax(seed, V, ties, ban):
    """The greedy shortcut (numpy argmax, then the ban only when it removes the winner) picks the index the plain
    masked argmax picks: first maximum, ties and a banned winner included."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, V, generator=g)
    if ties:
        logits = (logits * 2).round()                 # many equal values, several equal maxima
    mask = None
    if ban == "winner":
        mask = torch.zeros(V, dtype=torch.bool)
        mask[logits[0].argmax()] = True
    elif ban == "random":
        mask = torch.rand(V, generator=g) < 0.3
        mask[0] = False                               # something stays allowed
    want = (logits if mask is None else logits.masked_fill(mask, float("-inf"))).argmax(-1)
    got = sample_top_p(logits, 0.0, 1.0, 1.0, None, mask)
    assert got.tolist() == want.tolist()
