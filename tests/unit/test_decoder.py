"""Decoder: the eager loop against a per-token append loop, the static device loop against the eager loop."""
import pytest
import torch

from support import make_model
from tinychat.engine import Decoder, KVCache, append, sample_top_p


class TableBan:
    """A phrase-ban hook in the engine's table shape: {(a, b): [c, ...]}, k = 2 (host reference for the graph path)."""

    def __init__(self, table):
        self.table, self.k = table, 2

    def __call__(self, out, logits):
        if len(out) < self.k:
            return logits
        banned = self.table.get(tuple(out[-self.k:]), [])
        if not banned:
            return logits
        return logits.masked_fill(torch.isin(torch.arange(logits.size(-1)), torch.tensor(banned))[None],
                                  float("-inf"))


NEVER = 511   # a stop id the random tiny model's turns below never sample (asserted where it matters)


def _prompt(n=24, seed=5):
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def _start(model, graph=False, max_len=256):
    cache = KVCache(model, 1, max_len, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=graph)
    logits = append(model, cache, _prompt(), [24])
    return dec, cache, logits


def test_eager_turn_equals_per_token_append_loop():
    model = make_model()
    kw = dict(temperature=0.9, top_p=0.9, pen=1.3)
    pen_ids = list(range(0, 512, 3))
    dec, _, logits = _start(model)
    toks = dec.generate(logits, 60, stop=511, pen_ids=pen_ids, generator=torch.Generator().manual_seed(7), **kw)

    cache = KVCache(model, 1, 256, "cpu", dtype=torch.float32)
    lg = append(model, cache, _prompt(), [24])
    g = torch.Generator().manual_seed(7)
    pm = torch.zeros(512, dtype=torch.bool)
    pm[pen_ids] = True
    ref = []
    for _ in range(60):
        t = int(sample_top_p(lg, kw["temperature"], kw["top_p"], kw["pen"], pm, None, g))
        ref.append(t)
        lg = append(model, cache, torch.tensor([[t]]), [1])
        if t == 511:
            break
    assert len(set(toks)) > 10          # a real sampled turn, not a degenerate one
    assert toks == ref


def _state(c):
    L = int(c.lens_cpu[0])
    return dict(lens=c.lens.tolist(), lens_cpu=c.lens_cpu.tolist(), lpos=c.lpos[0].tolist(),
                gk=c.gk[:, 0, :, :L], gv=c.gv[:, 0, :, :L], tokens=c.tokens[0, :L].tolist(),
                lk=c.lk[:, 0, :, :-1], lv=c.lv[:, 0, :, :-1])


def _assert_same_cache(a, b):
    sa, sb = _state(a), _state(b)
    for key in ("lens", "lens_cpu", "lpos", "tokens"):
        assert sa[key] == sb[key], key
    for key in ("gk", "gv", "lk", "lv"):
        assert torch.allclose(sa[key], sb[key], atol=1e-4), key


@pytest.mark.parametrize("cut", ["stop", "max_new"])
def test_static_loop_greedy_turns_equal_eager_and_leave_the_same_cache(cut):
    model = make_model()
    dec, cache, logits = _start(model)
    probe = dec.generate(logits, 30, stop=NEVER, temperature=0)        # stop never sampled: learn the greedy path
    stop = next(t for t in probe[3:] if t not in probe[:3])          # a token first sampled mid-turn
    max_new = 40 if cut == "stop" else 5
    if cut == "max_new":
        assert NEVER not in probe
        stop = NEVER

    results = []
    for graph in (False, "static"):
        dec, cache, logits = _start(model, graph=graph)
        turns = [dec.generate(logits, max_new, stop=stop, temperature=0)]
        nxt = append(model, cache, _prompt(7, seed=9), [7])          # a second turn on top of the first
        turns.append(dec.generate(nxt, max_new, stop=stop, temperature=0))
        results.append((dec.mode, turns, cache))
    (m0, eager, c0), (m1, static, c1) = results
    assert (m0, m1) == ("eager", "static")
    assert eager == static
    if cut == "stop":
        assert eager[0][-1] == stop and len(eager[0]) < max_new
    else:
        assert len(eager[0]) == max_new and stop not in eager[0]
    _assert_same_cache(c0, c1)


def test_static_loop_phrase_ban_equals_eager_hook():
    model = make_model()
    dec, _, logits = _start(model)
    free = dec.generate(logits, 40, stop=NEVER, temperature=0)
    assert NEVER not in free
    # ban the greedy continuation at several points: (a, b) -> c for consecutive greedy triples
    table = {}
    for i in (2, 9, 15):
        table.setdefault((free[i - 2], free[i - 1]), []).append(free[i])
    outs = []
    for graph in (False, "static"):
        dec, cache, logits = _start(model, graph=graph)
        outs.append(dec.generate(logits, 40, stop=NEVER, temperature=0, logits_hook=TableBan(table)))
    assert outs[0] == outs[1]
    assert outs[0] != free                                            # the ban changed the turn
    for i in range(2, len(outs[0])):
        assert outs[0][i] not in table.get((outs[0][i - 2], outs[0][i - 1]), [])


def test_static_loop_sampled_turn_is_seed_deterministic():
    model = make_model()
    runs = []
    for _ in range(2):
        dec, _, logits = _start(model, graph="static")
        runs.append(dec.generate(logits, 30, stop=NEVER, temperature=0.8, top_p=0.9,
                                 generator=torch.Generator().manual_seed(3)))
    assert runs[0] == runs[1] and len(set(runs[0])) > 5


def test_step_on_full_cache_raises_and_leaves_cache_unchanged():
    model = make_model()
    cache = KVCache(model, 1, 24, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=False)
    append(model, cache, _prompt(), [24])
    before = [t.clone() for t in (cache.gk, cache.lk, cache.lpos, cache.lens, cache.lens_cpu, cache.tokens)]
    with pytest.raises(RuntimeError, match="KV cache full"):
        dec.step(3)
    after = (cache.gk, cache.lk, cache.lpos, cache.lens, cache.lens_cpu, cache.tokens)
    assert all(torch.equal(x, y) for x, y in zip(before, after))


def test_decoder_rejects_batched_cache():
    model = make_model()
    with pytest.raises(ValueError, match="batch 1"):
        Decoder(model, KVCache(model, 2, 16, "cpu"))


def test_truncate_to_mark_equals_never_having_decoded():
    model = make_model()
    dec, cache, logits = _start(model)
    mark = cache.mark()
    first = dec.generate(logits, 20, stop=NEVER, temperature=0)
    cache.truncate(mark)
    again = dec.generate(logits, 20, stop=NEVER, temperature=0)
    assert first == again
    fresh, fcache, flog = _start(model)
    fresh.generate(flog, 20, stop=NEVER, temperature=0)
    _assert_same_cache(cache, fcache)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_graph_greedy_equals_static_on_cuda():
    model = make_model().cuda()
    outs = []
    for graph in ("static", True):
        cache = KVCache(model, 1, 256, "cuda", dtype=torch.float32)
        dec = Decoder(model, cache, graph=graph)
        logits = append(model, cache, _prompt().cuda(), [24])
        outs.append((dec.mode, dec.generate(logits, 50, stop=NEVER, temperature=0)))
    assert outs[1][0] == "graph"
    assert outs[0][1] == outs[1][1]


def _repeats_a_3gram(seq):
    grams = [tuple(seq[i:i + 3]) for i in range(len(seq) - 2)]
    return len(grams) != len(set(grams))


def test_static_loop_reply_ban_equals_eager_hook_and_the_reply_never_repeats_a_3gram():
    from tinychat.sampler import TurnHook
    model = make_model()
    dec, _, logits = _start(model)
    free = dec.generate(logits, 80, stop=NEVER, temperature=0)
    assert _repeats_a_3gram(free)                     # greedy on the random model loops: the ban has work to do
    outs = []
    for graph in (False, "static"):
        dec, cache, logits = _start(model, graph=graph)
        hook = TurnHook({}, 0.0, 1.0, 1.0, [], NEVER, guard=False, reply=True)
        outs.append(dec.generate(logits, 80, stop=NEVER, temperature=0, logits_hook=hook))
    assert outs[0] == outs[1]
    assert len(outs[0]) == 80 and not _repeats_a_3gram(outs[0])
    # the turn's table and the reply's own n-grams ban together (a table entry the reply would otherwise take)
    table = {(outs[0][4], outs[0][5]): [outs[0][6]]}
    both = []
    for graph in (False, "static"):
        dec, cache, logits = _start(model, graph=graph)
        hook = TurnHook(table, 0.0, 1.0, 1.0, [], NEVER, guard=False, reply=True)
        both.append(dec.generate(logits, 80, stop=NEVER, temperature=0, logits_hook=hook))
    assert both[0] == both[1] and both[0][6] != outs[0][6] and not _repeats_a_3gram(both[0])
