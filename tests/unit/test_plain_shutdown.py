"""Issue #33 item 8: the plain mode's turns ran on daemon threads that could still be unwinding (freeing the turn's
tensors, which releases the GIL) when the interpreter finalized; PyTorch's C++ code then aborted the process
("terminate called without an active exception", exit 134, seen after failed int8 turns). A turn's worker is joined
before the turn returns, so nothing of a turn outlives it."""
import io
import threading
import time

from support import make_chat

from tinychat.plain import PlainREPL
from tinychat.settings import ChatError

_local = threading.local()


class _SlowTeardown:
    """Freed when its thread ends, slowly (as a turn's tensors are freed when its worker unwinds)."""

    def __init__(self, done: list):
        self.done = done

    def __del__(self):
        time.sleep(0.3)
        self.done.append("freed")


def _repl():
    repl = PlainREPL(make_chat(max_new=4, seed=1, autosave=False), stdin=io.StringIO(""), stdout=io.StringIO(),
                     stderr=io.StringIO())
    repl.interactive = False
    return repl


def test_a_failed_turns_worker_has_ended_when_the_turn_returns():
    repl, freed = _repl(), []

    def failing(on_token, on_reply):
        _local.slow = _SlowTeardown(freed)     # freed when the worker thread ends
        raise ChatError("message too long")

    before = {t.ident for t in threading.enumerate()}
    assert repl.turn(failing) is None and repl.errors == 1
    assert freed == ["freed"]                       # the worker's teardown ran before turn() returned
    assert not [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]


def test_an_ab_workers_teardown_is_over_when_ab_returns(monkeypatch):
    import tinychat.chat.ab as AB
    repl, freed = _repl(), []

    def failing(chat, changes, on_token=None):
        _local.slow = _SlowTeardown(freed)
        raise ChatError("no reply to compare yet")

    monkeypatch.setattr(AB, "run_ab", failing)
    repl.ab({"temperature": "0"})
    assert freed == ["freed"] and repl.errors == 1
