"""TurnHook's per-token trace against a plain reference built with a full sort of the final distribution."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tinychat.engine.sampling import apply_ban_and_penalty
from tinychat.sampler import TRACE_TOP, TurnHook


def reference(logits, banned, pen, pen_ids, T, top_p):
    V = logits.size(-1)
    pen_mask = torch.zeros(V, dtype=torch.bool)
    pen_mask[pen_ids] = True
    ban = torch.zeros(V, dtype=torch.bool)
    ban[banned] = True
    p_raw = torch.softmax(logits[0] / T, -1)
    p_fin = torch.softmax(apply_ban_and_penalty(logits, pen, pen_mask, ban)[0] / T, -1)
    sp, si = p_fin.sort(descending=True)
    before = sp.cumsum(0) - sp
    nucleus = {int(t) for t, b in zip(si, before) if b < top_p}
    return p_raw, p_fin, nucleus


@settings(max_examples=60)
@given(seed=st.integers(0, 10_000), V=st.sampled_from([40, 300, 4096]), scale=st.sampled_from([0.3, 3.0, 12.0]),
       top_p=st.sampled_from([0.5, 0.9, 0.99]), with_ban=st.booleans())
def test_trace_candidates_match_the_sorted_reference(seed, V, scale, top_p, with_ban):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, V, generator=g) * scale
    pen_ids = torch.randperm(V, generator=g)[:V // 4].tolist()
    out = [1, 2]
    banned = logits[0].topk(2).indices.tolist() if with_ban else []
    table = {(1, 2): banned} if with_ban else {}
    h = TurnHook(table, temperature=0.8, top_p=top_p, pen=1.3, pen_ids=pen_ids, stop=0, trace=True, guard=False)
    h(out, logits)
    tok = int(logits[0].argsort()[V // 2])           # any token; its rank and probabilities are recorded
    h.finish(out + [tok])
    (tr,) = h.traces
    p_raw, p_fin, nucleus = reference(logits, banned, 1.3, pen_ids, 0.8, top_p)
    got = {c.token for c in tr.candidates}
    assert set(p_raw.topk(TRACE_TOP).indices.tolist()) <= got
    for c in tr.candidates:
        assert abs(c.p_raw - float(p_raw[c.token])) < 1e-6
        assert abs(c.p_final - float(p_fin[c.token])) < 1e-6
        assert c.in_nucleus == (c.token in nucleus), (c, top_p)
        assert c.penalised == (c.token in pen_ids)
        assert (c.banned_by is not None) == (c.token in banned)
    assert [c.p_raw for c in tr.candidates] == sorted((c.p_raw for c in tr.candidates), reverse=True)
    assert tr.rank == int((p_fin > p_fin[tok]).sum()) and abs(tr.p_final - float(p_fin[tok])) < 1e-6


def _tensor_ops(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
            and e.name not in ("aten::resolve_conj", "aten::resolve_neg")]     # Tensor.numpy()'s checks


@pytest.mark.parametrize("ban", [False, True])
def test_tracing_a_token_takes_a_bounded_number_of_tensor_ops(ban):
    """Tracing a token (penalty, softmaxes, candidates, nucleus membership, rank; the ban's mass and masks) reads
    its single values through numpy views and reuses the turn's penalty ids, so it costs a bounded number of
    tensor ops: each op hands the GIL to the app's UI thread and back.
    Counted, not timed."""
    V = 8192
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, V, generator=g) * 4
    h = TurnHook({(1, 2): [5, 6]} if ban else {}, temperature=0.8, top_p=0.95, pen=1.2,
                 pen_ids=list(range(0, V, 7)), stop=0, trace=True)
    h([1, 2], logits)                      # the first call builds the turn's penalty mask and ids
    h.finish([1, 2, 9])
    ops = _tensor_ops(lambda: (h([1, 2, 9, 1, 2], logits), h.finish([1, 2, 9, 1, 2, 11])))
    assert len(h.traces) == 2 and h.traces[-1].banned == ([5, 6] if ban else [])
    assert len(ops) <= (48 if ban else 30), sorted(ops)


@pytest.mark.parametrize("reply", [False, True])
def test_the_reply_ban_shows_in_the_trace_with_the_3gram_that_banned_it(reply):
    logits = torch.zeros(1, 50)
    logits[0, 7] = 5.0                                   # the favourite would repeat "5 6 7"
    logits[0, 9] = 3.0                                   # the runner-up, banned by the turn's table
    hook = TurnHook({(5, 6): [9]}, 1.0, 1.0, 1.0, [], 49, trace=True, reply=reply)
    out = [5, 6, 7, 1, 5, 6]
    res = hook(out, logits)
    hook.finish(out + [3])                               # the token drawn after the hook: its trace is complete
    tr = hook.traces[-1]
    cands = {c.token: c for c in tr.candidates}
    assert cands[9].banned_by == (5, 6)                  # the turn's table bans 9 either way
    if reply:
        assert sorted(tr.banned) == [7, 9] and cands[7].banned_by == (5, 6)
        assert res[0, 7] == float("-inf") and tr.banned_mass > 0.5
    else:
        assert tr.banned == [9] and cands[7].banned_by is None and res[0, 7] == 5.0
