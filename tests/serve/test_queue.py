"""One decoder, a FIFO queue: a client that disconnects mid-stream stops its generation within one token and the
next request starts at once; a full queue is a 503 with Retry-After; eight concurrent clients are all served, in
the order they arrived, each with the reply its seed gives alone."""
import threading
import time

import httpx
import pytest

from serve_support import runner_for, start
from tinychat.serve.runtime import Delta, Outcome

LONG = "tell me a story about the cat"      # seed 0: a 291-token reply on the tiny model


class Slowed:
    """A ChatRunner whose decode loop waits `delay` seconds per token (in its token callback): a long reply."""

    def __init__(self, inner, delay):
        self.inner, self.delay, self.model_id = inner, delay, inner.model_id

    def run(self, req, sink, cancelled):
        def slow(d):
            time.sleep(self.delay)
            sink(d)
        return self.inner.run(req, slow, cancelled)

    def cancel(self):
        self.inner.cancel()


@pytest.fixture(scope="module")
def slow(model_dir, home):
    s = start(Slowed(runner_for(model_dir), 0.02), max_queue=8)
    yield s
    s.close()


def _body(model_id, **kw):
    return {"model": model_id, "messages": [{"role": "user", "content": LONG}], "seed": 0, "max_tokens": 300, **kw}


def test_a_client_gone_mid_stream_stops_its_reply_within_a_token(slow):
    model_id = slow.app.state.runner.model_id
    with httpx.stream("POST", slow.base + "/v1/chat/completions", json=_body(model_id, stream=True),
                      timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]           # the role chunk and a few tokens, then hang up
    assert any('"content"' in x for x in got)
    r = httpx.post(slow.base + "/v1/chat/completions", json=_body(model_id, max_tokens=3), timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    # counted in tokens, not seconds: had the abandoned reply gone on, the next request (one decoder, served in
    # order) would have waited for all its 300; it stopped within a token of the cancel, a few tokens in
    seq, finish, out = [h for h in slow.worker.history if h[2] is not None][-2]
    assert finish == "cancelled" and out.completion_tokens < 100, (finish, out.completion_tokens)
    assert out.tokens_after_cancel is not None and out.tokens_after_cancel <= 1


def test_a_client_gone_while_waiting_is_never_run(slow):
    model_id = slow.app.state.runner.model_id
    errors = []

    def hold():
        try:
            httpx.post(slow.base + "/v1/chat/completions", json=_body(model_id, max_tokens=40), timeout=30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    t = threading.Thread(target=hold)
    t.start()
    _wait(lambda: slow.worker.running is not None)
    with pytest.raises(httpx.TimeoutException):         # queued behind it, then gone
        httpx.post(slow.base + "/v1/chat/completions", json=_body(model_id, seed=9), timeout=0.3)
    t.join(30)
    _wait(lambda: slow.worker.running is None and not slow.worker.queued())
    assert [h[1] for h in slow.worker.history][-1] == "skipped" and not errors


def _wait(cond, limit=20.0):
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Gate:
    """A stand-in runner that gives one piece of text, then waits for the test to open the gate."""
    model_id = "gate"

    def __init__(self):
        self.open = threading.Event()

    def run(self, req, sink, cancelled):
        sink(Delta("a", [], []))
        self.open.wait(20)
        return Outcome("a", "stop", 1, 1, 0, 0)

    def cancel(self):
        pass


def test_a_full_queue_is_a_503_with_retry_after():
    gate = Gate()
    s = start(gate, max_queue=1)
    body = {"model": "gate", "messages": [{"role": "user", "content": "x"}]}
    results = {}

    def send(name):
        results[name] = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=30)
    try:
        a = threading.Thread(target=send, args=("a",))
        a.start()
        _wait(lambda: s.worker.running is not None)
        b = threading.Thread(target=send, args=("b",))
        b.start()
        _wait(lambda: s.worker.queued() == 1)
        full = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=30)
        assert full.status_code == 503 and int(full.headers["Retry-After"]) >= 1
        assert full.json()["error"]["code"] == "queue_full"
        gate.open.set()
        a.join(30)
        b.join(30)
        assert results["a"].status_code == results["b"].status_code == 200
    finally:
        gate.open.set()
        s.close()


def test_eight_concurrent_clients_are_all_served_in_order(server, model_id):
    def ask(seed):
        return server.client().chat.completions.create(model=model_id, seed=seed, max_tokens=24,
                                                       messages=[{"role": "user", "content": LONG}])
    got, threads = {}, []
    for seed in range(8):
        t = threading.Thread(target=lambda s=seed: got.__setitem__(s, ask(s)))
        threads.append(t)
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(8))
    seqs = {s: r.model_extra["tinychat"]["request"] for s, r in got.items()}
    served = [h[0] for h in server.worker.history if h[0] in set(seqs.values())]
    assert served == sorted(seqs.values())                  # first come, first served
    for seed in range(8):                                   # nothing lost or mixed up: each its own seed's reply
        assert got[seed].choices[0].message.content == ask(seed).choices[0].message.content
