"""How many threads the native int8 decode step uses: picked by measurement, not assumed.

On an idle machine the step is faster on every core (the weight stream splits across them). When other processes
keep a core busy, an OpenMP worker that is descheduled stalls every barrier of the step, and the mean step time at
two threads can be several times the one-thread time while the median hardly moves; on two cores with one taken
and the app's UI thread wanting the other, every step stalls (measured: the shipped model's first reply at 4-28
tok/s on two threads, ~500 on one). So the tuner runs the step on its current choice, now and then tries the other
one for a few steps, and keeps whichever has the lower mean step time (the mean, not the median: stalls are what it
is there to see).

When it tries:
- the first trial comes after EARLY steps (a machine busy from the start shows in the first reply, not after 64
  steps of it), lasts EARLY_TRIAL steps and switches only for a trial twice as fast (EARLY_MARGIN: its base is two
  steps); a trial that loses doubles the wait before the next (from FIRST on), so a machine that stays busy (or
  idle) pays almost nothing for the checking;
- steps that stall (a window mean over STALL times its fastest step, or a recent mean over STALL times the best
  mean this choice has shown) on more than one thread bring a trial of one forward, after `stall_wait` steps: 4,
  doubled by each stall trial that loses (the machine is slower for both choices), back to 4 when a trial wins;
- a trial step over ABORT times the current choice's mean ends the trial there, lost: trying two threads on a
  machine where they collapse costs one or two stalled steps (~0.1-0.25 s each, measured), not eight.

ThreadTuner(auto=False) (EngineOptions.tune_threads False: the CLI's --threads N) pins the count to
torch.get_num_threads()."""
from __future__ import annotations

from collections import deque


class ThreadTuner:
    WINDOW = 32         # recent step times of the current choice, compared against a trial
    TRIAL = 8           # steps per trial of the other choice (after one unmeasured switch-over step)
    EARLY_TRIAL = 4     # ... for the first trial, which only has to see a 2x difference (EARLY_MARGIN)
    EARLY = 2           # steps before the very first trial (a collapse is plain after two)
    EARLY_MARGIN = 0.5  # ... which switches only for a trial twice as fast (its base: two steps, the first paying
                        # its warm-up; a collapsed choice is 10-30x slower than the other)
    FIRST = 64          # steps before the next trial after one is lost; doubled after each lost trial, up to MAX_WAIT
    MAX_WAIT = 4096
    MARGIN = 0.95       # a trial must be this much faster (mean) to switch
    STALL = 3.0         # a mean over this times the reference: stalling (see the module's docstring)
    STALL_WAIT = 4      # steps on a choice before a stall brings its trial forward (doubled per lost stall trial)
    ABORT = 10.0        # a trial step (after the switch-over) this many times the current mean ends the trial, lost

    def __init__(self, auto: bool = True):
        self.auto = auto
        self.choice: int | None = None       # None: the ceiling
        self.recent: deque[float] = deque(maxlen=self.WINDOW)
        self.wait = self.EARLY
        self.stall_wait = self.STALL_WAIT
        self.since = 0                       # steps on the current choice since the last trial
        self.trial: int | None = None        # threads under trial, or None
        self.stalled_trial = False           # the trial under way was brought forward by a stall
        self.trial_times: list[float] = []
        self.trials = 0                      # trials finished
        self.best: dict[int, float] = {}     # threads -> the lowest mean of TRIAL consecutive steps seen
        self.switches = 0
        self._lowered: tuple[int, int] | None = None   # (ceiling, count) when sync_torch left torch below the ceiling

    def ceiling(self) -> int:
        """The thread count to tune below: torch's, or the one it had before sync_torch lowered it for a step."""
        import torch
        n = torch.get_num_threads()
        return self._lowered[0] if self._lowered is not None and self._lowered[1] == n else n

    def sync_torch(self, nt: int, ceiling: int) -> None:
        """torch's own thread count set to the step's, so the PyTorch ops between steps (the sampler's softmax, sort and
        top-k over the vocabulary, the trace) do not stall at two-thread barriers either: on 2 vCPUs with one taken,
        an imported SmolLM2-135M (49,152 logits) replied at 14-21 tok/s in the app with its step on one thread."""
        import torch
        if torch.get_num_threads() != nt:
            torch.set_num_threads(nt)
        self._lowered = (ceiling, nt) if nt < ceiling else None

    def _current(self, ceiling: int) -> int:
        return ceiling if self.choice is None else min(self.choice, ceiling)

    def _stalling(self, cur: int) -> bool:
        n = len(self.recent)
        if cur <= 1 or n < 4 or self.since < self.stall_wait:      # one thread has no barrier to stall at: its
            return False                                             # slow steps are a busy core, more won't help
            return False
        if sum(self.recent) > self.STALL * n * min(self.recent):   # stalls between normal steps
            return True
        tail = list(self.recent)[-self.TRIAL:]                       # every step slow, against what it has done
        ref = self.best.get(cur)
        return len(tail) == self.TRIAL and ref is not None and sum(tail) / self.TRIAL > self.STALL * ref

    def threads(self, ceiling: int) -> int:
        """The thread count for the next step (1 <= n <= ceiling)."""
        if not self.auto or ceiling <= 1:
            return max(1, ceiling)
        cur = self._current(ceiling)
        if self.trial is not None:
            return min(self.trial, ceiling)
        due = self.since >= self.wait and len(self.recent) >= min(self.wait, self.WINDOW // 2)
        stalled = not due and self._stalling(cur)
        if due or stalled:
            self.trial = 1 if cur > 1 else ceiling
            self.stalled_trial = stalled
            self.trial_times = []
            return self.trial
        return cur

    def _note_best(self, n: int, times) -> None:
        if len(times) >= self.TRIAL:
            m = sum(times[-self.TRIAL:]) / self.TRIAL
            self.best[n] = min(self.best.get(n, m), m)

    def record(self, seconds: float, ceiling: int) -> None:
        """The time of the step just run with threads(ceiling)."""
        if not self.auto or ceiling <= 1:
            return
        if self.trial is None:
            self.recent.append(seconds)
            self.since += 1
            if self.since >= self.TRIAL:
                self._note_best(self._current(ceiling), list(self.recent))
            return
        self.trial_times.append(seconds)
        base = sum(self.recent) / len(self.recent)
        if len(self.trial_times) > 1 and seconds > self.ABORT * base:
            self._end_trial(won=False)                              # a collapse: no need to sit through 8 steps
            return
        steps = self.EARLY_TRIAL if self.trials == 0 else self.TRIAL
        if len(self.trial_times) < steps + 1:
            return
        trial = sum(self.trial_times[1:]) / steps                  # the first step pays the switch-over
        self._note_best(min(self.trial, ceiling), self.trial_times[1:])   # (TRIAL steps: the first trial's are not)
        margin = self.EARLY_MARGIN if self.trials == 0 else self.MARGIN
        self._end_trial(won=trial < margin * base)

    def _end_trial(self, won: bool) -> None:
        self.trials += 1
        if won:
            self.choice = self.trial
            self.recent.clear()
            self.recent.extend(self.trial_times[1:])
            self.wait = self.FIRST
            self.stall_wait = self.STALL_WAIT
            self.switches += 1
        else:
            self.wait = min(self.MAX_WAIT, max(self.FIRST, self.wait * 2))
            if self.stalled_trial:
                self.stall_wait = min(self.MAX_WAIT // 8, self.stall_wait * 2)
        self.trial = None
        self.stalled_trial = False
        self.since = 0
