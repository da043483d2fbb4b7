"""ThreadTuner: settles on the thread count with the lower mean step time and backs off its trials."""
import random

import pytest

from tinychat.engine import threads as T


def run(tuner, cost, steps, ceiling=2, seed=0):
    rng = random.Random(seed)
    used = []
    for _ in range(steps):
        n = tuner.threads(ceiling)
        used.append(n)
        tuner.record(cost(n, rng), ceiling)
    return used


def idle(n, rng):                   # two threads halve the step
    return (1.0 if n == 1 else 0.55) * (1 + 0.05 * rng.random())


def busy(n, rng):                   # two threads: fast median, but every 4th step stalls for a timeslice
    if n == 1:
        return 1.0 * (1 + 0.05 * rng.random())
    return 0.6 if rng.random() > 0.25 else 12.0


def test_idle_machine_keeps_all_threads_and_trials_get_rare():
    tu = T.ThreadTuner()
    used = run(tu, idle, 5000)
    assert used[0] == 2 and tu.choice in (None, 2) and tu.switches == 0
    assert used.count(1) < 0.02 * len(used)                   # lost trials double the wait: 8-step trials, rarely


def test_busy_machine_drops_to_one_thread_and_stays_mostly():
    tu = T.ThreadTuner()
    used = run(tu, busy, 5000)
    assert tu.choice == 1
    assert used[-2000:].count(2) < 0.03 * 2000


def test_switches_back_when_the_machine_gets_idle():
    tu = T.ThreadTuner()
    run(tu, busy, 3000)
    assert tu.choice == 1
    used = run(tu, idle, 6000)
    assert tu.choice == 2 and used[-1000:].count(2) > 0.95 * 1000


@pytest.mark.parametrize("ceiling", [1, 4])
def test_never_more_than_the_ceiling_and_pinned_when_auto_is_off(ceiling):
    tu = T.ThreadTuner()
    assert set(run(tu, idle, 500, ceiling=ceiling)) <= set(range(1, ceiling + 1))
    tu = T.ThreadTuner(auto=False)
    assert set(run(tu, busy, 500, ceiling=ceiling)) == {ceiling}


def test_a_collapsing_choice_is_tried_against_the_other_within_a_few_steps():
    """Two threads that collapse from the first step (a worker descheduled at every barrier: most steps tens of
    times the normal one) are tried against one thread after ~8 steps, not after the first 64."""
    def collapse(n, rng):
        if n == 1:
            return 1.0
        return 0.6 if rng.random() < 0.3 else 40.0
    tu = T.ThreadTuner()
    used = run(tu, collapse, 40)
    assert used[0] == 2 and 1 in used[:12]
    assert tu.choice == 1 and used[-10:] == [1] * 10


def test_an_even_decode_tries_once_early_then_waits_the_full_period():
    tu = T.ThreadTuner()
    early, first, n = T.ThreadTuner.EARLY, T.ThreadTuner.FIRST, T.ThreadTuner.EARLY_TRIAL + 1
    used = run(tu, idle, early + n + first)
    assert used[:early] == [2] * early                      # the first trial after EARLY steps: a short one at 1
    assert used[early:early + n] == [1] * n
    assert used[early + n:] == [2] * first and tu.choice in (None, 2)    # lost: the next one FIRST steps on


def even_collapse(n, rng):          # every two-thread step stalls alike: no fast step to compare against
    return (1.0 if n == 1 else 30.0) * (1 + 0.05 * rng.random())


def test_a_choice_slow_from_the_first_step_is_left_within_the_first_reply():
    """Two cores, one taken by another process and the app's UI thread wanting the other: every two-thread step
    waits at its barriers (the shipped model's first reply ran at 4-28 tok/s). The early trial finds one thread
    within ~7 steps."""
    tu = T.ThreadTuner()
    used = run(tu, even_collapse, 40)
    assert used[0] == 2 and tu.choice == 1
    assert used[T.ThreadTuner.EARLY + 9:] == [1] * (40 - T.ThreadTuner.EARLY - 9)


def test_an_even_collapse_after_a_long_quiet_stretch_is_seen_within_a_few_steps():
    """After thousands of quiet steps the regular trials are rare (the wait has grown); a collapse that makes every
    step slow is measured against the best this choice has done, not against its own slow window."""
    tu = T.ThreadTuner()
    run(tu, idle, 6000)
    while tu.trial is None:                                  # up to the next regular trial, and through it
        run(tu, idle, 1)
    while tu.trial is not None:
        run(tu, idle, 1)
    assert tu.choice in (None, 2) and tu.wait >= 1024 and tu.since == 0
    used = run(tu, even_collapse, 60)
    assert 1 in used[:20] and tu.choice == 1 and used[-20:] == [1] * 20


def test_stall_trials_back_off_when_both_choices_are_slow():
    """A machine that got slower for every thread count: the stall rule fires, its trials lose, and they come at
    doubling intervals instead of every few steps."""
    tu = T.ThreadTuner()
    run(tu, idle, 3000)
    used = run(tu, lambda n, rng: 10 * idle(n, rng), 3000)
    assert tu.choice in (None, 2)
    assert used[-2000:].count(1) < 0.05 * 2000


# -- the prefill follows the step's choice ---------------------------------------------------------------------------

def _int8(make):
    from tinychat.engine import EngineOptions, quantize_cpu
    return quantize_cpu(make(), "int8", options=EngineOptions(tune_threads=True))


def _two_threads():
    import torch
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    return was


@pytest.mark.parametrize("family", ["tinyagent", "llama"])
def test_the_native_prefill_gives_the_same_bits_at_one_and_two_threads(family):
    """What lets a prefill run at the tuner's thread count and replays stay exact."""
    import torch
    from support import make_llama_model, make_model
    from tinychat.engine import KVCache, append, native
    from tinychat.engine.quant import bulk_prefill_kernel
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    m = _int8(make_model if family == "tinyagent" else make_llama_model)
    ids = torch.randint(0, 500, (1, 150), generator=torch.Generator().manual_seed(3))
    assert bulk_prefill_kernel(m, 150) == "native-gemm" or pytest.skip("the prefill runs another GEMM here")
    was, outs = torch.get_num_threads(), []
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            cache = KVCache(m, 1, 256, "cpu", dtype=torch.float32)
            outs.append((append(m, cache, ids, [150]), cache.gk.clone(), cache.gv.clone()))
    finally:
        torch.set_num_threads(was)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_a_prefill_runs_at_the_threads_the_step_chose_on_a_busy_machine(monkeypatch):
    import torch
    from support import make_chat, make_chat_model
    from tinychat.chat import timeline
    from tinychat.engine import native
    from tinychat.engine.quant import bulk_prefill_kernel
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    chat = make_chat(make_chat_model(), quant="int8", max_new=4, seed=1, autosave=False)
    dec = chat.decoder
    if bulk_prefill_kernel(chat.model, 8) != "native-gemm":
        pytest.skip("the prefill runs another GEMM here")
    seen = []
    real = timeline.append
    monkeypatch.setattr(timeline, "append", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    was = _two_threads()
    try:
        assert dec.prefill_threads(8) is None                  # nothing measured yet: torch's count
        chat.send("hello")
        tuner = dec.cpu_step.nat.tuner
        tuner.choice = 1                                       # the step found one thread faster
        assert dec.prefill_threads(8) == 1
        chat.send("and again")
        tuner.choice = 2
        assert dec.prefill_threads(8) is None
    finally:
        torch.set_num_threads(was)
    assert seen[0] == 2 and seen[-1] == 1 and torch.get_num_threads() == was


def test_a_collapsing_trial_is_cut_short():
    """One thread chosen on a busy machine; the periodic trial of two threads meets a collapse (every step 30x):
    it ends after its first measured step instead of sitting through eight."""
    tu = T.ThreadTuner()
    used = run(tu, even_collapse, 2000)
    while tu.trial is not None:                             # a trial under way at the end: see it through
        used += run(tu, even_collapse, 1)
    assert tu.choice == 1
    trial_steps = used[T.ThreadTuner.EARLY + T.ThreadTuner.EARLY_TRIAL + 1:].count(2)
    trials = tu.trials - 1                                  # the early one found the collapse and switched
    assert trials >= 3 and trial_steps == 2 * trials        # the switch-over step and one measured step each


def test_settling_the_threads_before_the_first_turn_changes_no_token():
    """Decoder.settle_threads steps on the chat's cache and puts it back: the tuner has made its first trial, and the
    chat's turns are the tokens of a chat that did not settle (also after a turn, on a cache with content)."""
    import torch
    from support import make_chat, make_chat_model
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    was = _two_threads()
    try:
        plain = make_chat(make_chat_model(), quant="int8", max_new=12, seed=5, autosave=False)
        settled = make_chat(make_chat_model(), quant="int8", max_new=12, seed=5, autosave=False)
        tuner = settled.decoder.cpu_step.nat.tuner
        n = settled.settle_threads()
        assert n >= T.ThreadTuner.EARLY + 2 and tuner.trials == 1 and settled.cache.length(0) == 0
        assert settled.settle_threads() == 0                   # once tried, never again
        a, b = plain.send("hello there"), settled.send("hello there")
        assert a.token_ids == b.token_ids and len(a.token_ids) > 3
        settled.decoder.cpu_step.nat.tuner = T.ThreadTuner()  # a fresh tuner on a cache holding a turn
        torch.set_num_threads(2)                               # (the old one may have left torch at its choice)
        L = settled.cache.length(0)
        assert settled.settle_threads() > 0 and settled.cache.length(0) == L
        assert plain.send("and then").token_ids == settled.send("and then").token_ids
    finally:
        torch.set_num_threads(was)
    one = make_chat(make_chat_model(), quant="int8", max_new=4, autosave=False)
    assert one.settle_threads() == 0                           # one thread: nothing to measure


def test_slow_steps_on_one_thread_bring_no_trial_of_more():
    """One thread chosen on a busy machine whose steps now and then wait for the core (the app's UI thread, another
    process): no barrier stalls there, so only the regular, backed-off trials try two threads again."""
    def busy_core(n, rng):
        if n == 1:
            return 1.0 if rng.random() > 0.1 else 15.0     # preempted now and then
        return 30.0
    tu = T.ThreadTuner()
    used = run(tu, busy_core, 3000)
    assert tu.choice == 1
    assert used[1000:].count(2) <= 10                       # a few regular trials (64, 128, ... steps apart)


def test_the_torch_ops_between_steps_follow_the_steps_thread_count():
    """sync_torch: a step on one thread of two leaves torch at one (the sampler's softmax and sort over the vocabulary
    would otherwise stall at two-thread barriers), and the tuner still tunes below the two it had."""
    import torch
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        tu = T.ThreadTuner()
        assert tu.ceiling() == 2
        tu.sync_torch(1, 2)
        assert torch.get_num_threads() == 1 and tu.ceiling() == 2
        tu.sync_torch(2, 2)
        assert torch.get_num_threads() == 2 and tu.ceiling() == 2
        tu.sync_torch(1, 2)
        torch.set_num_threads(3)                               # set by hand since: that is the ceiling now
        assert tu.ceiling() == 3
    finally:
        torch.set_num_threads(was)
