"""Conversations as trees (issue #14): schema v2, regenerate keeps alternatives, switching moves the cache exactly."""
import json

import pytest
import torch
from support import make_chat, make_chat_model, tokenizer

from tinychat.sessions import session as S
from tinychat.sessions import tree as T
from tinychat.chat.runtime import Chat, ChatError


def _cache_equal(a: Chat, b: Chat) -> None:
    sa, sb = a.cache.state_dict(), b.cache.state_dict()
    assert sa.keys() == sb.keys()
    for k in ("lk", "lv"):                   # the rings' last slot is scratch (padded writes land there)
        sa[k], sb[k] = sa[k][..., :-1, :], sb[k][..., :-1, :]
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert a.timeline.pending == b.timeline.pending


def _fresh_restore(chat: Chat) -> Chat:
    """The active path rebuilt from the token ids in a new chat (no snapshot)."""
    import dataclasses
    path_only = dataclasses.replace(chat.session, messages=list(chat.session.messages), branches=[])
    return Chat.restore(path_only, make_chat_model(), tokenizer(),
                        use_snapshot=False, autosave=False, max_len=chat.max_len)


def test_regenerate_keeps_the_old_reply_as_a_sibling():
    chat = make_chat(max_new=10, seed=3)
    chat.send("hello there")
    first = chat.session.messages[-1]
    chat.set("seed", "4")
    chat.regenerate()
    assert chat.alternatives() == (2, 2)
    assert first in chat.session.branches and first.parent == chat.session.messages[-2].id
    assert chat.session.n_turns == 1


def test_switching_back_restores_the_old_reply_and_a_cache_bit_identical_to_a_fresh_restore(monkeypatch):
    chat = make_chat(max_new=12, seed=3)
    chat.send("hello there")
    chat.send("why the cat?")
    old_ids = list(chat.session.messages[-1].token_ids)
    chat.set("seed", "5")
    chat.regenerate()
    new_ids = list(chat.session.messages[-1].token_ids)
    monkeypatch.setattr(chat.timeline, "rebuild", None)   # the switch cuts back: no rebuild from scratch
    monkeypatch.setattr(chat.timeline, "play", None)      # and puts back the cache it kept of the old reply
    assert chat.switch_alternative("prev") == (1, 2)
    assert chat.session.messages[-1].token_ids == old_ids
    _cache_equal(chat, _fresh_restore(chat))
    assert chat.switch_alternative("2") == (2, 2)
    assert chat.session.messages[-1].token_ids == new_ids
    _cache_equal(chat, _fresh_restore(chat))


def test_switching_to_a_branch_this_chat_never_decoded_feeds_it_by_the_restore_rule(tmp_path, monkeypatch):
    chat = make_chat(max_new=12, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.set("seed", "5")
    chat.regenerate()
    chat.close()
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), sessions_dir=tmp_path, max_len=512,
                         use_snapshot=False)
    monkeypatch.setattr(again.timeline, "rebuild", None)
    fed = []
    play = again.timeline.play
    monkeypatch.setattr(again.timeline, "play", lambda *a: fed.append(a[1]) or play(*a))
    again.switch_alternative("1")
    assert fed == [3]                          # only the switched turn was fed again
    _cache_equal(again, _fresh_restore(again))
    again.close()


def test_switching_an_earlier_reply_follows_its_own_later_turns():
    chat = make_chat(max_new=8, seed=3)
    chat.send("hello there")
    chat.send("why the cat?")
    deep = [m.token_ids for m in chat.session.messages]
    chat.undo()                              # back to one turn, then a second reply to it
    chat.set("seed", "9")
    chat.regenerate()
    chat.send("and the dog?")
    # now: reply 2/2 of turn 1 with its own turn 2; reply 1/1 of turn 1 lost its turn 2 to the undo
    assert chat.alternatives(2) == (2, 2)
    chat.switch_alternative("1", index=2)
    assert [m.token_ids for m in chat.session.messages] == deep[:3]
    _cache_equal(chat, _fresh_restore(chat))
    chat.switch_alternative("2", index=2)
    assert chat.session.messages[-2].content == "and the dog?"
    _cache_equal(chat, _fresh_restore(chat))
    # and the next turn continues exactly as a restored chat's
    twin = _fresh_restore(chat)
    chat.set("seed", "21")
    twin.set("seed", "21")
    assert chat.send("more?").token_ids == twin.send("more?").token_ids


def test_bad_alternative_numbers_are_refused_and_change_nothing():
    chat = make_chat(max_new=8, seed=3)
    chat.send("hello there")
    chat.set("seed", "4")
    chat.regenerate()
    before = [m.token_ids for m in chat.session.messages]
    for bad in ("9", "0", "sideways"):
        with pytest.raises(ChatError):
            chat.switch_alternative(bad)
    assert [m.token_ids for m in chat.session.messages] == before
    assert chat.alternatives() == (2, 2)
    with pytest.raises(ChatError, match="no reply"):
        make_chat().switch_alternative("next")


def test_v2_file_round_trips_the_tree_and_the_active_path(tmp_path):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.set("seed", "4")
    chat.regenerate()
    chat.switch_alternative("1")
    chat.close()
    loaded = S.load(chat.session.id, tmp_path)
    assert [m.token_ids for m in loaded.messages] == [m.token_ids for m in chat.session.messages]
    assert [(m.id, m.parent) for m in loaded.branches] == [(m.id, m.parent) for m in chat.session.branches]
    assert len(loaded.branches) == 1
    restored = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), sessions_dir=tmp_path, max_len=512)
    assert restored.alternatives() == (1, 2)
    restored.switch_alternative("next")
    assert restored.session.messages[-1].token_ids == loaded.branches[0].token_ids
    restored.close()


def test_a_v1_file_loads_as_one_path_and_stays_v1_until_changed(tmp_path):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.close()
    path = S.session_path(chat.session.id, tmp_path)
    data = json.loads(path.read_text())
    data["version"] = 1
    del data["branches"]
    for m in data["messages"]:
        del m["id"], m["parent"], m["fork"]
    path.write_text(json.dumps(data))
    (tmp_path / f"{chat.session.id}.kv.safetensors").unlink()
    v1_bytes = path.read_bytes()
    restored = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), sessions_dir=tmp_path, max_len=512)
    assert restored.session.messages[-1].token_ids == chat.session.messages[-1].token_ids
    assert path.read_bytes() == v1_bytes               # opening is not changing
    restored.set("seed", "4")
    restored.regenerate()
    restored.close()
    assert json.loads(path.read_text())["version"] == 2
    assert len(S.load(path).branches) == 1


def _v2_file(tmp_path):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.set("seed", "4")
    chat.regenerate()
    chat.close()
    return S.session_path(chat.session.id, tmp_path)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["branches"][0].update(parent=999), "broken parent link"),
    (lambda d: d["branches"][0].update(id=d["messages"][0]["id"]), "is also the id of"),
    (lambda d: d["messages"][1].update(parent=None), "messages[1].parent"),
    (lambda d: d["branches"][0].update(parent=d["branches"][0]["id"]), "cycle"),
    (lambda d: d["branches"][0].update(role="user"), "the branch ending at branches[0]"),
    (lambda d: d.pop("branches"), "missing field branches"),
    (lambda d: d["branches"][0].update(fork={"position": -1, "token": 3}), "branches[0].fork"),
])
def test_a_damaged_tree_is_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    path = _v2_file(tmp_path)
    good = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    good.send("another chat")
    good.close()
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(S.SessionError) as e:
        S.load(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    errors: list = []
    assert [i.id for i in S.list_sessions(tmp_path, errors)] == [good.session.id]   # the other one untouched
    assert len(errors) == 1


def test_undo_drops_the_turn_with_its_alternatives_and_saves_a_valid_tree(tmp_path):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.set("seed", "4")
    chat.regenerate()
    chat.undo()
    assert chat.session.branches == []
    chat.close()
    assert S.load(chat.session.id, tmp_path).n_turns == 1


def test_paths_lists_every_branch_and_describes_where_it_forks():
    chat = make_chat(max_new=8, seed=3)
    chat.send("hello there")
    chat.set("seed", "4")
    chat.regenerate()
    chat.set("seed", "5")
    chat.regenerate()
    ps = T.paths(chat.session)
    assert len(ps) == 3 and ps[0] == chat.session.messages
    assert [T.describe_path(chat.session, p) for p in ps] == ["turn 1 reply 3/3", "turn 1 reply 1/3",
                                                              "turn 1 reply 2/3"]


def test_switching_across_turns_that_shortened_a_full_context_stays_exact():
    chat = make_chat(max_new=8, seed=3, max_len=80)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.set("seed", "4")
    chat.regenerate()                        # turn 2 has two replies; the second goes on for three more turns
    for text in ("and the dog", "tell me more", "ok then"):
        chat.send(text)
    assert any((m.settings or {}).get("context_start") for m in chat.session.messages)   # the context filled up
    later = [m.content for m in chat.session.messages[5:]]
    chat.switch_alternative("1", index=4)
    assert len(chat.session.messages) == 5
    _cache_equal(chat, _fresh_restore(chat))
    chat.switch_alternative("2", index=4)    # its later turns re-prefilled shortened contexts: fed, not copied
    assert [m.content for m in chat.session.messages[5:]] == later
    _cache_equal(chat, _fresh_restore(chat))
    twin = _fresh_restore(chat)
    chat.set("seed", "5")
    twin.set("seed", "5")
    assert chat.send("last one").token_ids == twin.send("last one").token_ids


def test_editing_an_earlier_message_branches_from_it_and_keeps_the_old_branch(tmp_path):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.send("and the dog")
    old = [m.content for m in chat.session.messages]
    chat.edit(3, "why the bird?")
    msgs = chat.session.messages
    assert [m.content for m in msgs[:3]] == old[:3] and msgs[3].content == "why the bird?" and len(msgs) == 5
    _cache_equal(chat, _fresh_restore(chat))
    sibs, at = T.siblings(chat.session, 3)
    assert [m.content for m in sibs] == ["why the cat?", "why the bird?"] and at == 1
    chat.switch_alternative("1", index=2)    # the first reply has no siblings: nothing to switch
    chat.close()
    loaded = S.load(chat.session.id, tmp_path)
    paths = T.paths(loaded)
    assert [[m.content for m in p] for p in paths][1] == old
    assert T.describe_path(loaded, paths[1]) == "turn 2 message 1/2"
    with pytest.raises(ChatError):
        chat.edit(2, "not mine")
    with pytest.raises(ChatError, match="empty"):
        chat.edit(3, "  ")


def test_an_edited_message_switches_back_to_its_original_with_what_followed_it(tmp_path, monkeypatch):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.send("and the dog")
    old = [m.token_ids for m in chat.session.messages]
    chat.edit(3, "why the bird?")
    edited = [m.token_ids for m in chat.session.messages]
    assert chat.alternatives(3) == (2, 2) and chat.alternatives(1) == (1, 1)
    monkeypatch.setattr(chat.timeline, "rebuild", None)  # the switch cuts back, then puts the kept cache back
    assert chat.switch_alternative("prev", index=3) == (1, 2)
    assert [m.token_ids for m in chat.session.messages] == old     # both later turns came back with it
    _cache_equal(chat, _fresh_restore(chat))
    assert chat.switch_alternative("next", index=3) == (2, 2)
    assert [m.token_ids for m in chat.session.messages] == edited
    _cache_equal(chat, _fresh_restore(chat))
    with pytest.raises(ChatError, match="this message has 2"):
        chat.switch_alternative("3", index=3)
    with pytest.raises(ChatError, match="not a reply"):
        chat.alternatives(0)                                         # the system prompt has no alternatives
    chat.close()
    fresh = Chat.restore(S.load(chat.session.id, tmp_path), make_chat_model(), tokenizer(), use_snapshot=False,
                         autosave=False)
    monkeypatch.undo()
    fresh.switch_alternative("1", index=3)                          # a chat that never decoded the old branch
    assert [m.token_ids for m in fresh.session.messages] == old
    _cache_equal(fresh, _fresh_restore(fresh))


def test_an_edited_reply_is_used_as_written_and_replays_exactly(tmp_path, monkeypatch):
    chat = make_chat(max_new=8, seed=3, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    old = [m.token_ids for m in chat.session.messages]
    assert chat.edit_reply(2, "the cat sleeps") == (2, 2)
    msgs = chat.session.messages
    assert len(msgs) == 3 and msgs[-1].content == "the cat sleeps" and msgs[-1].finish == "edited"
    assert msgs[-1].token_ids == tokenizer().message_ids("assistant", "the cat sleeps")
    _cache_equal(chat, _fresh_restore(chat))
    r = chat.send("and the dog")                                    # the user types on from the edited reply
    assert r.finish in ("stop", "length") and chat.session.n_turns == 2
    _cache_equal(chat, _fresh_restore(chat))
    assert chat.switch_alternative("1", index=2) == (1, 2)          # the original reply, with its next turn
    assert [m.token_ids for m in chat.session.messages] == old
    with pytest.raises(ChatError, match="empty"):
        chat.edit_reply(2, "  ")
    with pytest.raises(ChatError, match="not a reply"):
        chat.edit_reply(1, "x")
    chat.switch_alternative("2", index=2)
    chat.close()
    from tinychat.chat.replay import replay_tree
    loaded = S.load(chat.session.id, tmp_path)
    assert [m.finish for m in loaded.messages if m.role == "assistant"][0] == "edited"
    fresh = make_chat(autosave=False)
    results = replay_tree(fresh, loaded)
    assert len(results) == 2 and all(not t.divergence for b in results for t in b.report.turns)
