"""Sessions in the app: --session resumes, the sessions screen opens / renames / deletes / exports, replay plays a
session back with divergences highlighted, and a failing model load is shown in the app."""
import dataclasses
import threading
import time

import pytest

from app_support import idle, notes, ready, say, wait_for
from support import make_chat, tokenizer

from tinychat.sessions import session as S
from tinychat.tui import jobs
from tinychat.tui.app import TinyChatApp, make_app
from tinychat.tui.runtime import Backend
from tinychat.tui.widgets import NoticeMessage, UserMessage

SIZE = (130, 40)


def recorded_session(model, turns=("hello there", "tell me about the cat"), **kw):
    chat = make_chat(model=model, temperature=kw.pop("temperature", 0.0), max_new=kw.pop("max_new", 12), **kw)
    for t in turns:
        chat.send(t)
    return chat.session


async def test_session_id_resumes_and_the_next_turn_is_saved(factory, chat_model):
    sess = recorded_session(chat_model)
    app = make_app(factory(), session=sess.id, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.chat.session.id == sess.id
        assert [u.text for u in app.view.query(UserMessage)] == ["hello there", "tell me about the cat"]
        replies = app.view.replies()
        assert [r.text for r in replies] == [m.content for m in sess.messages if m.role == "assistant"]
        assert "restored" in replies[0].meta and replies[0].tokens
        assert "continuing session" in str(app.view.query(NoticeMessage).first().render())
        await pilot.press("up")
        assert app.prompt.text == "tell me about the cat"            # history holds the session's messages
        app.prompt.load_text("")
        await say(pilot, "and one more")
        assert S.load(sess.id).n_turns == 3


async def test_sessions_screen_open_rename_export_delete_and_new(factory, chat_model, tmp_path):
    a = recorded_session(chat_model, turns=("first chat",))
    time.sleep(0.01)
    b = recorded_session(chat_model, turns=("second chat",))
    app = make_app(factory(temperature=0.0, max_new=4), blink=False, export_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        screen = app.screen
        assert type(screen).__name__ == "SessionsScreen"
        assert [i.id for i in screen.infos] == [b.id, a.id]          # newest first
        # rename the selected (newest) one
        await pilot.press("r")
        await pilot.pause()
        dialog = app.screen
        dialog.query_one("Input").value = "Renamed chat"
        await pilot.press("enter")
        await pilot.pause()
        assert S.load(b.id).title == "Renamed chat"
        # export it: the path is asked for, the export folder's tinychat-ID.md offered
        await pilot.press("e")
        await pilot.pause()
        out = tmp_path / f"tinychat-{b.id}.md"
        assert app.screen.query_one("Input").value == str(out)
        await pilot.press("enter")
        await pilot.pause()
        assert out.is_file() and "# Renamed chat" in out.read_text()
        # delete the older one (confirm with y)
        await pilot.press("down", "d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert not S.session_path(a.id).exists()
        assert [i.id for i in screen.infos] == [b.id]
        # open the remaining one
        await pilot.press("enter")
        await idle(pilot)
        assert app.chat.session.id == b.id and app.chat.session.title == "Renamed chat"
        assert [u.text for u in app.view.query(UserMessage)] == ["second chat"]
        # continue it, then a new chat from the sessions screen is one key away
        await say(pilot, "more")
        assert S.load(b.id).n_turns == 2 and S.load(b.id).title == "Renamed chat"
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("n")
        await idle(pilot)
        assert app.chat.session.id != b.id and app.chat.session.n_turns == 0
        assert not app.view.replies()


async def test_the_sessions_filter_keeps_chats_whose_title_or_text_match(factory, chat_model):
    recorded_session(chat_model, turns=("tell me about the dog",))
    time.sleep(0.01)
    b = recorded_session(chat_model, turns=("the moon at night",))
    time.sleep(0.01)
    c = recorded_session(chat_model, turns=("hello there", "and the red DOG runs"))
    S.rename(c.id, "Evening chat")
    app = make_app(factory(temperature=0.0, max_new=4), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        screen = app.screen
        assert len(screen.infos) == 3
        await pilot.press("slash", *"dog")                  # typed into the box: 'd' does not delete a chat
        await pilot.pause()
        assert screen.query_one("#sessions-filter").value == "dog"
        assert sorted(i.id for i in screen.infos) == sorted([c.id, screen.every[-1].id])   # text, any case
        assert "2 of 3 match" in str(screen.query_one("#sessions-note").render())
        assert len(S.list_sessions()) == 3
        screen.query_one("#sessions-filter").value = "evening"
        await pilot.pause()
        assert [i.id for i in screen.infos] == [c.id]                                      # the title
        await pilot.press("escape")                        # clears the box, back to the list
        await pilot.pause()
        assert app.screen is screen and len(screen.infos) == 3
        await pilot.press("slash", *"moon", "enter")       # Enter opens the first match
        await idle(pilot)
        assert app.chat.session.id == b.id


async def test_opening_a_foreign_session_is_an_error_notification(factory, chat_model):
    from support import make_chat_model
    other = recorded_session(make_chat_model(seed=5), turns=("x",))
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        before = app.chat
        app.prompt.load_text(f"/load {other.id}")
        await pilot.press("enter")
        await idle(pilot)
        # the same model name on other weights
        assert any("another version of the model 'tiny-test'" in n for n in notes(app, "error"))
        assert app.chat is before


async def test_replay_plays_back_token_exact(factory, chat_model):
    sess = recorded_session(chat_model, temperature=0.9, max_new=10, seed=11)
    app = make_app(factory(), replay=sess, replay_speed=0, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.replay_summary is not None, what="the replay")
        s = app.replay_summary
        assert s.turns == 2 and not s.divergences and not s.stopped
        replies = app.view.replies()
        assert len(replies) == 2 and all("token-exact" in r.meta for r in replies)
        assert [r.tokens for r in replies] == [m.token_ids[len(tokenizer().generation_prompt_ids()):-2]
                                               for m in sess.messages if m.role == "assistant"]
        assert all(r.traces for r in replies)                       # inspector data for every replayed token
        assert not any(r.has_class("diverged") for r in replies)
        await pilot.press("enter")                                   # the input is off in a replay
        assert app.chat.session.n_turns == 2
        assert [i.id for i in S.list_sessions()] == [sess.id]           # a replay writes no session


async def test_replay_highlights_a_divergence(factory, chat_model):
    sess = recorded_session(chat_model, temperature=0.0, max_new=10)
    tok = tokenizer()
    gen = len(tok.generation_prompt_ids())
    rec = sess.messages[-1]
    k = 4                                                            # tamper with the 2nd reply's 5th token
    ids = list(rec.token_ids)
    ids[gen + k] = (ids[gen + k] + 1) % 300 + 3
    sess.messages[-1] = dataclasses.replace(rec, token_ids=ids, content=tok.decode(ids[gen:-2], skip_special=True))
    app = make_app(factory(), replay=sess, replay_speed=0, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.replay_summary is not None, what="the replay")
        assert len(app.replay_summary.divergences) == 1
        first, second = app.view.replies()
        assert not first.has_class("diverged") and "token-exact" in first.meta
        assert second.has_class("diverged") and f"diverges at token {k}" in second.meta
        assert second.first_divergence == k
        assert all(second.marks.get(i) == "diverged" for i in range(k, len(second.tokens)))
        assert "diverge" in str(app.view.query(NoticeMessage).last().render())


class _Clock:
    """The replay job's clock (tui/jobs.py's `time`): a sleep moves it on at once, so the pace a replay keeps is read
    off it exactly, whatever the machine's load."""

    def __init__(self):
        self.now, self.slept, self._lock = 1000.0, 0.0, threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
            self.slept += seconds
        time.sleep(0)                                            # let the app's thread run, as a real sleep would


async def test_replay_paces_tokens_at_the_recorded_speed_and_stops_on_escape(factory, chat_model, monkeypatch):
    sess = recorded_session(chat_model, turns=("hello there",), temperature=0.0, max_new=20)
    rec = sess.messages[-1]
    sess.messages[-1] = dataclasses.replace(rec, timing_ms=[40.0] * len(rec.timing_ms))   # 40 ms a token
    with monkeypatch.context() as m:
        clock = _Clock()
        m.setattr(jobs, "time", clock)
        app = make_app(factory(), replay=sess, replay_speed=2.0, blink=False)    # at 2x: 20 ms a token
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.replay_summary is not None, what="the replay")
            n = len(app.view.replies()[0].tokens)
    assert n == len(rec.timing_ms) > 1
    assert clock.slept == pytest.approx(0.02 * n)                 # each token waited for until it was due, no longer
    app = make_app(factory(), replay=sess, replay_speed=0.05, blink=False)       # 800 ms a token
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.stream.current is not None and app.stream.current.tokens, what="a token")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.replay_summary is not None, what="the stop")
        assert app.replay_summary.stopped
        assert len(app.view.replies()[0].tokens) < 20


async def test_failing_model_load_is_shown_in_the_app(factory):
    app = make_app(factory(fail=ValueError("model.safetensors: truncated file")), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.chat is None and "truncated file" in app.load_error
        err = app.query_one("#load-error", NoticeMessage)
        assert "could not load the model" in str(err.render()) and err.has_class("error")
        assert app.status_bar.values["model"] == "no model"
        assert any("truncated file" in n for n in notes(app, "error"))
        await pilot.press(*"hi", "enter")                            # still alive, says why nothing happens
        assert any("could not load" in n for n in notes(app, "warning"))
        await pilot.press("ctrl+q")
    assert app.return_code == 2


async def test_real_loader_with_a_missing_model_folder(tmp_path):
    app = TinyChatApp(Backend(model=tmp_path / "no-such-model"), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.load_error and app.query_one("#load-error", NoticeMessage)


async def test_real_loader_opens_a_model_folder(tmp_path, chat_model):
    chat_model.save_pretrained(tmp_path)
    tokenizer().save(tmp_path / "tokenizer.json")
    from tinychat.chat.runtime import ChatSettings
    app = TinyChatApp(Backend(model=tmp_path, settings=ChatSettings(max_new=3), overrides={"max_new": 3}),
                      blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.load_error is None and app.chat.model_name == tmp_path.name
        await say(pilot, "hello")
        assert app.chat.session.n_turns == 1


async def test_a_new_chats_opening_notice_is_shown_as_its_own_line(factory):
    # e.g. loading.small_int4_note: a new chat (no "continuing session ..." before it) shows the notice alone
    f = factory()
    made = f.__call__

    def call(ref):
        chat = made(ref)
        chat.notice = "4-bit weights cost a model this small much of its quality"
        return chat
    app = make_app(call, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        shown = str(app.view.query(NoticeMessage).first().render())
        assert shown.lstrip().startswith("4-bit weights") and "·" not in shown.split("4-bit")[0]
