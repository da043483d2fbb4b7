"""Fork at a token (issue #14): a reply cut at a position, a token forced there, decoding going on with the turn's
settings and a recorded seed; the new reply a sibling of the old; replay reproduces it token for token; the cache
of a forked branch is the one a fresh restore gives; bad forks and damaged fork records are refused."""
import dataclasses
import json

import pytest
import torch
from support import make_chat, make_chat_model, tokenizer

from tinychat.sessions import session as S
from tinychat.sessions import tree as T
from tinychat.chat.runtime import Chat, ChatError
from tinychat.chat.replay import replay, replay_tree


def _cache_equal(a: Chat, b: Chat) -> None:
    sa, sb = a.cache.state_dict(), b.cache.state_dict()
    for k in ("lk", "lv"):                   # the rings' last slot is scratch (padded writes land there)
        sa[k], sb[k] = sa[k][..., :-1, :], sb[k][..., :-1, :]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert a.timeline.pending == b.timeline.pending


def _fresh_restore(chat: Chat, max_len: int | None = None) -> Chat:
    """The active path rebuilt from the token ids in a new chat (no snapshot): the restore rule."""
    path_only = dataclasses.replace(chat.session, messages=list(chat.session.messages), branches=[])
    return Chat.restore(path_only, make_chat_model(), tokenizer(), use_snapshot=False, autosave=False,
                        max_len=max_len or chat.max_len)


def _content(chat: Chat, m) -> list[int]:
    return tokenizer().content_ids(m.role, m.token_ids)


def _all_exact(sess) -> list:
    results = replay_tree(make_chat(autosave=False), sess)
    assert all(r.report.ok for r in results), [(r.label, r.report.divergences) for r in results]
    return results


def _other(tok_id: int, avoid=()) -> int:
    """A plain (non-special) token id other than tok_id and the ones in avoid."""
    special = set(tokenizer().special_ids)
    return next(t for t in range(tok_id + 1, tok_id + 400) if t % tokenizer().vocab_size not in special
                and t % tokenizer().vocab_size not in avoid) % tokenizer().vocab_size


def test_a_fork_keeps_the_prefix_forces_the_token_and_keeps_the_old_reply_as_a_sibling():
    chat = make_chat(max_new=12, seed=3, temperature=1.0)
    chat.send("hello there")
    old = chat.session.messages[-1]
    before = _content(chat, old)
    forced = _other(before[4])
    r = chat.fork(4, forced, trace=True)
    new = chat.session.messages[-1]
    assert r.token_ids[:4] == before[:4] and r.token_ids[4] == forced
    assert _content(chat, new) == r.token_ids and new.fork == {"position": 4, "token": forced}
    assert chat.alternatives() == (2, 2) and old in chat.session.branches and new.parent == old.parent
    assert new.seed == r.seed and new.settings["seed"] == r.seed
    assert chat.session.n_turns == 1
    assert [t.index for t in r.traces][0] == 5               # traces of the sampled part, by place in the reply
    _cache_equal(chat, _fresh_restore(chat))                 # the live fork's cache is the restore rule's
    _all_exact(chat.session)


def test_the_continuation_samples_as_if_the_kept_tokens_had_been_sampled():
    """Greedy, with the reply ban on: forking at the token the reply already had reproduces the reply exactly only if
    the sampler sees the kept tokens (the ban's contexts, the reply's own 3-grams, the penalty) as sampled."""
    chat = make_chat(max_new=40, seed=1, temperature=0.0, penalty=1.3, ban_reply=True, no_parrot=True)
    chat.send("hello tell me about the cat")
    chat.send("hello tell me about the cat")
    old = chat.session.messages[-1]
    first = chat.session.messages[2]
    chat.set("seed", "5")
    chat.fork(0, _content(chat, first)[0], index=2)            # an earlier turn's fork (its later turn moves off)
    chat.switch_alternative("1", index=2)
    assert chat.session.messages[-1] is old
    orig = chat.regenerate(trace=True)                        # greedy: the same reply, with its traces
    banned = [t.index for t in orig.traces if t.banned]
    assert banned, "the tiny model's greedy reply must hit the ban"
    at = max(0, banned[0] - 2)                                # cut before the first ban: it must fire again
    r = chat.fork(at, orig.token_ids[at], trace=True)
    assert r.token_ids == orig.token_ids
    assert [t.index for t in r.traces if t.banned] == [i for i in banned if i > at]
    _all_exact(chat.session)


def test_replay_check_reproduces_forks_of_forks_and_names_a_tampered_one(tmp_path):
    chat = make_chat(max_new=10, seed=3, temperature=1.0, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    c = _content(chat, chat.session.messages[-1])
    chat.fork(2, _other(c[2]))                                # fork, then a fork of the fork
    c2 = _content(chat, chat.session.messages[-1])
    chat.fork(5, _other(c2[5]), seed=77)
    assert chat.session.messages[-1].seed == 77
    chat.fork(1, _content(chat, chat.session.messages[2])[1], index=2)   # and one of the first turn's reply
    chat.close()
    loaded = S.load(chat.session.id, tmp_path)
    assert sum(m.fork is not None for m in loaded.messages + loaded.branches) == 3
    results = _all_exact(loaded)
    assert len(results) == 4
    assert results[0].label == "turn 1 reply 2/2 (forked at token 1)"
    # a forked reply whose recorded continuation was changed by hand: that branch differs, at that token
    m = next(m for m in loaded.branches if m.fork and m.fork["position"] == 5)
    head = len(tokenizer().generation_prompt_ids())
    m.token_ids[head + 7] = _other(m.token_ids[head + 7])
    bad = [r for r in replay_tree(make_chat(autosave=False), loaded) if not r.report.ok]
    assert len(bad) == 1 and bad[0].report.divergences[0].position == 7


def test_forcing_the_stop_token_ends_the_reply_there_and_replays():
    chat = make_chat(max_new=12, seed=3, temperature=1.0)
    chat.send("hello there")
    before = _content(chat, chat.session.messages[-1])
    r = chat.fork(3, tokenizer().im_end)
    assert r.token_ids == before[:3] and r.finish == "stop"
    _cache_equal(chat, _fresh_restore(chat))
    _all_exact(chat.session)


def test_a_fork_past_the_end_goes_on_and_text_names_a_token():
    chat = make_chat(max_new=6, seed=3, temperature=1.0)
    chat.send("hello there")
    before = _content(chat, chat.session.messages[-1])
    chat.set("max-new", "20")                                 # the fork keeps the turn's own max-new ...
    with pytest.raises(ChatError, match="max-new 6"):
        chat.fork(len(before), " cat")
    chat.set("max-new", "6")
    chat.send("and the dog")
    c = _content(chat, chat.session.messages[-1])
    cat = tokenizer().encode(" cat")
    assert len(cat) == 1
    r = chat.fork(min(len(c), 5), " cat")                     # text that is one token
    assert r.token_ids[min(len(c), 5)] == cat[0] and len(r.token_ids) <= 6
    _all_exact(chat.session)


def test_switching_to_a_forked_branch_gives_the_cache_of_a_fresh_decode(tmp_path, monkeypatch):
    chat = make_chat(max_new=12, seed=3, temperature=1.0, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    c = _content(chat, chat.session.messages[-1])
    chat.fork(3, _other(c[3]))
    forked = list(chat.session.messages[-1].token_ids)
    chat.switch_alternative("1")
    _cache_equal(chat, _fresh_restore(chat))
    chat.switch_alternative("2")                              # back to the fork: its kept cache, put back
    assert chat.session.messages[-1].token_ids == forked
    _cache_equal(chat, _fresh_restore(chat))
    twin = _fresh_restore(chat)                               # and the next turn runs as on a fresh restore
    chat.set("seed", "21")
    twin.set("seed", "21")
    assert chat.send("more?").token_ids == twin.send("more?").token_ids
    chat.close()
    # from the file, no snapshot: the forked branch is fed by the restore rule
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), sessions_dir=tmp_path, max_len=512,
                         use_snapshot=False)
    again.switch_alternative("1", index=4)
    fed = []
    play = again.timeline.play
    monkeypatch.setattr(again.timeline, "play", lambda *a: fed.append(a[1]) or play(*a))
    again.switch_alternative("2", index=4)
    assert again.session.messages[4].token_ids == forked
    _cache_equal(again, _fresh_restore(again))
    again.close()


@pytest.mark.parametrize("position, token, message", [
    (-1, 5, "no token -1 in this reply"),
    (99, 5, "no token 99 in this reply"),
    (2, 10 ** 6, "outside the model's vocabulary"),
    (2, -3, "outside the model's vocabulary"),
    (2, "the cat sees", "tokens, not one"),
    (2, "special", "special token"),
    (2, [1], "not a token"),
])
def test_a_bad_position_or_token_is_refused_and_changes_nothing(position, token, message):
    chat = make_chat(max_new=10, seed=3)
    chat.send("hello there")
    if token == "special":
        token = next(t for t in tokenizer().special_ids if t != tokenizer().im_end)
    msgs = [m.token_ids for m in chat.session.messages]
    state = chat.cache.state_dict()
    with pytest.raises(ChatError, match=message):
        chat.fork(position, token)
    assert [m.token_ids for m in chat.session.messages] == msgs and chat.session.branches == []
    assert all(torch.equal(v, chat.cache.state_dict()[k]) for k, v in state.items())
    with pytest.raises(ChatError, match="no reply"):
        make_chat().fork(0, 5)


def test_a_fork_past_the_context_limit_is_refused_and_loses_nothing(tmp_path):
    chat = make_chat(max_new=40, seed=3, temperature=1.0, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.fork(1, tokenizer().im_end)                          # a short last reply (max-new 40 still recorded)
    chat.close()
    used = int(chat.cache.lens_cpu[0])
    # the session continued in a context that holds it, but not that turn again with a 40-token reply
    small = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), sessions_dir=tmp_path, max_len=used + 2,
                         use_snapshot=False)
    before = [m.token_ids for m in small.session.messages]
    with pytest.raises(ChatError, match="does not fit the"):
        small.fork(0, _other(_content(small, small.session.messages[-1])[0]))
    assert [m.token_ids for m in small.session.messages] == before and len(small.session.branches) == 1
    _cache_equal(small, _fresh_restore(small, max_len=used + 2))
    small.close()
    assert len(S.load(chat.session.id, tmp_path).branches) == 1    # nothing written


def test_a_fixed_seed_setting_is_the_forks_seed():
    chat = make_chat(max_new=10, seed=3, temperature=1.0)
    chat.send("hello there")
    c = _content(chat, chat.session.messages[-1])
    chat.set("seed", "42")
    a = chat.fork(2, _other(c[2]))
    chat.switch_alternative("1")
    b = chat.fork(2, _other(c[2]))
    assert a.seed == b.seed == 42 and a.token_ids == b.token_ids
    chat.set("seed", "none")
    chat.switch_alternative("1")
    assert chat.fork(2, _other(c[2])).seed != 42


def _forked_file(tmp_path):
    chat = make_chat(max_new=8, seed=3, temperature=1.0, sessions_dir=tmp_path)
    chat.send("hello there")
    chat.fork(2, _other(_content(chat, chat.session.messages[-1])[2]))
    chat.close()
    return S.session_path(chat.session.id, tmp_path)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["messages"][-1].update(fork={"position": 2}), "messages[2].fork must be an object"),
    (lambda d: d["messages"][-1].update(fork={"position": 2, "token": 5, "x": 1}), "messages[2].fork must be"),
    (lambda d: d["messages"][-1].update(fork={"position": "2", "token": 5}), "messages[2].fork must be"),
    (lambda d: d["messages"][-1].update(fork=[2, 5]), "messages[2].fork must be"),
    (lambda d: d["messages"][-1].update(fork={"position": 500, "token": 5}), "position 500 is past"),
    (lambda d: d["messages"][1].update(fork={"position": 0, "token": 5}), "is only for a reply"),
])
def test_a_damaged_fork_field_is_refused_in_one_line_on_load(tmp_path, damage, message):
    path = _forked_file(tmp_path)
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(S.SessionError) as e:
        S.load(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_fork_token_outside_the_vocabulary_is_refused_before_decoding(tmp_path):
    path = _forked_file(tmp_path)
    data = json.loads(path.read_text())
    data["messages"][-1]["fork"]["token"] = 10 ** 6
    path.write_text(json.dumps(data))
    sess = S.load(path)                                        # the shape is fine; the model decides the vocabulary
    with pytest.raises(S.SessionError, match="fork.token = 1000000 is outside the model's vocabulary"):
        replay(make_chat(autosave=False), sess)
    with pytest.raises(S.SessionError, match="fork.token"):
        Chat.restore(path, make_chat_model(), tokenizer(), sessions_dir=tmp_path, autosave=False)


def test_a_forked_reply_is_marked_in_paths_and_sessions_survive_a_round_trip(tmp_path):
    path = _forked_file(tmp_path)
    sess = S.load(path)
    assert sess.messages[-1].fork is not None and T.siblings(sess, 2)[1] == 1
    S.save(sess, tmp_path)
    assert S.load(path).messages[-1].fork == sess.messages[-1].fork


def test_a_stopped_fork_replays_the_part_it_sampled():
    chat = make_chat(max_new=20, seed=3, temperature=1.0)
    chat.send("hello there")
    c = _content(chat, chat.session.messages[-1])

    def stop_soon(i, tok, text, tr, ms):
        if i >= 5:
            chat.cancel()
    r = chat.fork(2, _other(c[2]), on_token=stop_soon)
    assert r.finish == "cancelled" and 3 <= len(r.token_ids) < 20
    _cache_equal(chat, _fresh_restore(chat))
    _all_exact(chat.session)


def test_a_fork_on_the_device_loop_decodes_eagerly_and_replays_exactly():
    """graph="static": the device loop's step, uncaptured, on the CPU. A fork runs the eager loop over that step
    (the on-device phrase ban does not see given tokens); its replay does the same."""
    chat = make_chat(max_new=12, seed=3, temperature=1.0, graph="static")
    chat.send("hello there")
    c = _content(chat, chat.session.messages[-1])
    r = chat.fork(3, _other(c[3]), trace=True)
    assert r.token_ids[:3] == c[:3] and len(r.traces) == len(r.token_ids) - 4 + (r.finish == "stop")
    fresh = Chat.restore(dataclasses.replace(chat.session, branches=[]), make_chat_model(), tokenizer(),
                         use_snapshot=False, autosave=False, max_len=chat.max_len, graph="static")
    _cache_equal(chat, fresh)
    results = replay_tree(make_chat(autosave=False, graph="static"), chat.session)
    assert all(b.report.ok for b in results), [b.report.divergences for b in results]
