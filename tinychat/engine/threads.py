"""How many threads the native int8 decode step uses: picked by measurement, not assumed.

On an idle machine the step is faster on every core (the weight stream splits across them). When other processes
keep a core busy, an OpenMP worker that is descheduled stalls every barrier of the step, and the mean step time at
two threads can be several times the one-thread time while the median hardly moves. So the tuner runs the step on its current choice, now and then tries
the other one for a few steps, and keeps whichever has the lower mean step time (the mean, not the median: stalls
are what it is there to see). A trial that loses doubles the wait before the next one, so a machine that stays
busy (or idle) pays almost nothing for the checking. Steps that stall badly (a mean over STALL times the fastest
step) bring the trial forward to an eighth of the wait.

ThreadTuner(auto=False) (EngineOptions.tune_threads False: the CLI's --threads N) pins the count to
torch.get_num_threads()."""
from __future__ import annotations

from collections import deque


class ThreadTuner:
    WINDOW = 32         # recent step times of the current choice, compared against a trial
    TRIAL = 8           # steps per trial of the other choice (after one unmeasured switch-over step)
    FIRST = 64          # steps before the first trial; doubled after each lost trial, up to MAX_WAIT
    MAX_WAIT = 4096
    MARGIN = 0.95       # a trial must be this much faster (mean) to switch
    STALL = 3.0         # recent mean over this times the fastest recent step: trial early (after wait // 8 steps)

    def __init__(self, auto: bool = True):
        self.auto = auto
        self.choice: int | None = None       # None: the ceiling
        self.recent: deque[float] = deque(maxlen=self.WINDOW)
        self.wait = self.FIRST
        self.since = 0                       # steps on the current choice since the last trial
        self.trial: int | None = None        # threads under trial, or None
        self.trial_times: list[float] = []
        self.switches = 0

    def threads(self, ceiling: int) -> int:
        """The thread count for the next step (1 <= n <= ceiling)."""
        if not self.auto or ceiling <= 1:
            return max(1, ceiling)
        cur = ceiling if self.choice is None else min(self.choice, ceiling)
        if self.trial is not None:
            return min(self.trial, ceiling)
        n = len(self.recent)
        due = self.since >= self.wait and n >= self.WINDOW // 2
        # a collapsing choice (a worker descheduled at every barrier: steps of tens of ms between normal ones) is
        # tried against the other after a few steps, not after `wait`: a busy machine's first reply would otherwise
        # crawl for its first 64 steps
        stalled = n >= 4 and self.since >= max(4, self.wait // 8) and sum(self.recent) > self.STALL * n * min(self.recent)
        if due or stalled:
            self.trial = 1 if cur > 1 else ceiling
            self.trial_times = []
            return self.trial
        return cur

    def record(self, seconds: float, ceiling: int) -> None:
        """The time of the step just run with threads(ceiling)."""
        if not self.auto or ceiling <= 1:
            return
        if self.trial is None:
            self.recent.append(seconds)
            self.since += 1
            return
        self.trial_times.append(seconds)
        if len(self.trial_times) < self.TRIAL + 1:
            return
        trial = sum(self.trial_times[1:]) / self.TRIAL            # the first step pays the switch-over
        base = sum(self.recent) / len(self.recent)
        if trial < self.MARGIN * base:
            self.choice = self.trial
            self.recent.clear()
            self.recent.extend(self.trial_times[1:])
            self.wait = self.FIRST
            self.switches += 1
        else:
            self.wait = min(self.MAX_WAIT, self.wait * 2)
        self.trial = None
        self.since = 0
