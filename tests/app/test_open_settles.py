"""Every chat the app opens measures its step's thread count before its first reply, not only the first one
(Chat.settle_threads: on a busy 2-vCPU host an unsettled step started on two threads at 4-28 tok/s)."""
from types import SimpleNamespace

from tinychat.tui import jobs


class FakeChat:
    def __init__(self, name):
        self.name, self.settled, self.closed = name, 0, 0
        self.session = SimpleNamespace(id="s1", title="t", n_turns=2)
        self.model_name = "m"

    def settle_threads(self):
        self.settled += 1
        return 11

    def close(self):
        self.closed += 1

    def status(self):
        return {}


class FakeBackend:
    def __init__(self, new):
        self.new = new

    def open(self, ref):
        return self.new

    def switch(self, where, ref):
        return self.new

    def token_strings(self):
        return []


def test_opening_a_session_or_switching_models_settles_the_new_chats_threads():
    posted = []
    old, new = FakeChat("old"), FakeChat("new")
    jobs.OpenSession(FakeBackend(new), old, "s1").run(posted.append)
    assert new.settled == 1 and old.settled == 0 and old.closed == 1
    assert posted[-1].chat is new
    again = FakeChat("again")
    jobs.SwitchModel(FakeBackend(again), new, "/elsewhere", "s1").run(posted.append)
    assert again.settled == 1 and posted[-1].chat is again
    same = FakeChat("same")                         # the backend handed the current chat back: nothing to settle
    jobs.OpenSession(FakeBackend(same), same, None).run(posted.append)
    assert same.settled == 0 and same.closed == 0
