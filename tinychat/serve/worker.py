"""One model, one decoder: requests wait in a bounded FIFO queue and one thread runs them in order, the only thread
that touches the chat runtime. A request's events (Deltas, then its Outcome or an ApiError) go to the asyncio loop
that asked for them. A job cancelled while it waits is skipped; one cancelled while it runs stops at its next token
(the runner checks after every token and the chat's cancel is set at once), so the next request starts at once."""
from __future__ import annotations

import asyncio
import collections
import itertools
import math
import sys
import threading
import time
import traceback

from .errors import ApiError

DONE, ERROR, DELTA = "done", "error", "delta"


class QueueFull(ApiError):
    def __init__(self, retry_after: int):
        super().__init__(503, "The server is busy: its request queue is full; retry later", None, "queue_full",
                         {"Retry-After": str(retry_after)})


class Job:
    """One request on its way through the queue. The worker puts events -- (DELTA, runtime.Delta) as text is
    settled, then (DONE, Outcome) or (ERROR, ApiError) -- into a buffer; the request's coroutine takes them in
    batches (next_batch). The decoding thread wakes the event loop only when the coroutine waits for a batch it has
    not been told about, so a reader that paces itself (the SSE stream takes a batch at most every few ms) costs the
    decoder a few wake-ups a second, not one per token: on two cores a wake-up per token slowed decoding by a third."""
    _ids = itertools.count(1)

    def __init__(self, req, loop: asyncio.AbstractEventLoop | None = None):
        self.req = req
        self.seq = next(Job._ids)              # arrival order
        self.loop = loop or asyncio.get_running_loop()
        self._buf: list = []
        self._lock = threading.Lock()
        self._told = False                      # a wake-up is on its way (or the buffer was not taken since)
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()           # DONE or ERROR was put: a pacing reader stops waiting
        self._cancel = threading.Event()
        self.on_cancel = None                   # set by the worker while the job runs
        self.started = self.finished = None     # perf_counter times

    def put(self, kind: str, value) -> None:
        """From the worker thread: add an event; wake the loop if it has not been woken since it last took them."""
        with self._lock:
            self._buf.append((kind, value))
            told, self._told = self._told, True
        try:
            if kind != DELTA:
                self.loop.call_soon_threadsafe(self._ended.set)
            if not told:
                self.loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:                    # the loop is gone (server shutting down): nobody listens
            pass

    async def pace(self, seconds: float) -> None:
        """Wait `seconds` (a streaming reader's pace), or less if the job ends meanwhile: the last chunk goes out at
        once, not up to a pace later (at ~1,000 tok/s a 0.4 s reply lost 5 % of its rate to that)."""
        try:
            await asyncio.wait_for(self._ended.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def next_batch(self) -> list:
        """Every event put since the last batch (waits for at least one)."""
        await self._ready.wait()
        with self._lock:
            batch, self._buf = self._buf, []
            self._ready.clear()
            self._told = False
        return batch

    def cancel(self) -> None:
        """The client went away: skip the job if it waits, stop it at its next token if it runs (any thread)."""
        self._cancel.set()
        hook = self.on_cancel
        if hook is not None:
            hook()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


class Worker:
    def __init__(self, runner, max_queue: int):
        self.runner, self.max_queue = runner, max_queue
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.running: Job | None = None
        self.served = 0
        self.history: collections.deque = collections.deque(maxlen=64)   # (seq, finish, Outcome | None) per job
        self._avg_s = 1.0                       # recent seconds per job (Retry-After)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tinychat-serve-decoder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            for job in self._waiting:
                job.put(ERROR, ApiError(503, "The server is shutting down", code="shutting_down"))
            self._waiting.clear()
            self._cv.notify_all()
        if self.running is not None:
            self.running.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull (503, Retry-After) when max_queue jobs already wait."""
        with self._cv:
            if self._stop:
                raise ApiError(503, "The server is shutting down", code="shutting_down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(max(1, math.ceil(self._avg_s * (len(self._waiting) + 1))))
            self._waiting.append(job)
            self._cv.notify()

    def queued(self) -> int:
        return len(self._waiting)

    def _next(self) -> Job | None:
        with self._cv:
            while not self._waiting and not self._stop:
                self._cv.wait()
            if self._stop:
                return None
            job = self._waiting.popleft()
            self.running = job
            return job

    def _loop(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                if job.cancelled:               # the client left while it waited
                    self.history.append((job.seq, "skipped", None))
                    continue
                job.on_cancel = lambda j=job: self.runner.cancel() if self.running is j else None
                job.started = time.perf_counter()
                out = self.runner.run(job.req, lambda d, j=job: j.put(DELTA, d), lambda j=job: j.cancelled)
                job.finished = time.perf_counter()
                self._avg_s = 0.7 * self._avg_s + 0.3 * (job.finished - job.started)
                self.served += 1
                self.history.append((job.seq, out.finish, out))
                job.put(DONE, out)
            except ApiError as e:
                self.history.append((job.seq, "error", None))
                job.put(ERROR, e)
            except Exception:  # noqa: BLE001  a bug: logged here, a 500 for the request, the server goes on
                traceback.print_exc(file=sys.stderr)
                self.history.append((job.seq, "error", None))
                job.put(ERROR, ApiError(500, "internal error (the server's log has the traceback)",
                                        code="internal_error"))
            finally:
                job.on_cancel = None
                with self._cv:
                    self.running = None
