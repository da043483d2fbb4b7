"""TurnHook's per-token trace against a plain reference built with a full sort of the final distribution."""
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

from tinychat.engine import sample_top_p
from tinychat.engine.sampling import apply_ban_and_penalty
from tinychat import sampler
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
       top_p=st.sampled_from([0.5, 0.9, 0.99]), with_ban=st.booleans(), path=st.sampled_from(["host", "tensor"]))
def test_trace_candidates_match_the_sorted_reference(seed, V, scale, top_p, with_ban, path):
    """Both ways of tracing: numpy on host logits, tensor ops on others (a device's)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, V, generator=g) * scale
    pen_ids = torch.randperm(V, generator=g)[:V // 4].tolist()
    out = [1, 2]
    banned = logits[0].topk(2).indices.tolist() if with_ban else []
    table = {(1, 2): banned} if with_ban else {}
    h = TurnHook(table, temperature=0.8, top_p=top_p, pen=1.3, pen_ids=pen_ids, stop=0, trace=True, guard=False)
    with mock.patch.object(sampler, "host_logits", lambda lg: path == "host"):
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
            and e.name not in GLUE]


# what Tensor.numpy(), torch.from_numpy() and torch.tensor() run inside one call: no op dispatched from Python
GLUE = {"aten::resolve_conj", "aten::resolve_neg", "aten::detach", "aten::detach_", "aten::to", "aten::lift_fresh"}


@pytest.mark.parametrize("ban", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_traced_token_costs_a_few_tensor_ops_from_hook_to_draw(ban, temperature):
    """A token on host logits, from the turn's hook (penalty, ban and its mass, the trace: softmaxes, candidates,
    nucleus membership, rank) to the draw, runs in numpy but for the tensor ops the seeded draw needs to stay the
    tensor draw's (the softmax, the kept mass' sum, the Exp(1) draws). Every tensor op hands the GIL to the app's UI
    thread and back (1.5-4 switches each; 5 ms each while the UI renders at Python's default interval). It was 44
    ops (68 with the ban) for the trace alone and ~15 more for the draw. Counted, not timed."""
    V = 8192
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, V, generator=g) * 4
    pen_ids = list(range(0, V, 7))
    h = TurnHook({(1, 2): [5, 6]} if ban else {}, temperature=temperature, top_p=0.95, pen=1.2,
                 pen_ids=pen_ids, stop=0, trace=True)
    pm = torch.zeros(V, dtype=torch.bool)
    pm[pen_ids] = True
    ix = pm.nonzero().squeeze(-1)
    gen = torch.Generator().manual_seed(0)
    h([1, 2], logits)                      # the first call builds the turn's penalty mask and ids
    h.finish([1, 2, 9])

    def token():
        lg = h([1, 2, 9, 1, 2], logits)
        t = int(sample_top_p(lg, temperature, 0.95, 1.2, pm, None, gen, ix))
        h.finish([1, 2, 9, 1, 2, t])
    ops = _tensor_ops(token)
    assert len(h.traces) == 2 and h.traces[-1].banned == ([5, 6] if ban else [])
    assert len(ops) <= (3 if temperature == 0 else 9), sorted(ops)
