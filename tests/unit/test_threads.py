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


def test_an_even_decode_waits_the_full_period_before_its_first_trial():
    tu = T.ThreadTuner()
    used = run(tu, idle, T.ThreadTuner.FIRST)
    assert used == [2] * T.ThreadTuner.FIRST
